"""bench/upgrade.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, three real
peers on the test driver with a VM each, a second release stored with
``code add``, ``upgrade --to`` while pings through every host follow one
another, the hand-overs read back from the peers' logs) and must end well,
printing each figure, with its verdict where it has a target, and leave
nothing behind: no work directory, no peer (neither those it started nor
those the upgrade handed over to), no etcd.  Whether a target is met is the
benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

pytestmark = pytest.mark.slow   # a benchmark's smoke run: the third tier

BENCH = os.path.join(ROOT, "bench", "upgrade.py")
TIMEOUT = 180
WORK = "peerctl-bupgrade-"      # the benchmark's work directory, under /var/tmp
SECONDS = r"[0-9.]+s"
FIGURES = {
    "out of service": r"^3 peers: [0-3] of 3 upgraded \(\w+\); out of service per host median "
                      rf"(-|{SECONDS}), worst ({SECONDS}|inf) \(target <= 5s, TTL 5s\): "
                      + VERDICT,
    "whole upgrade": rf"^3 peers: whole upgrade {SECONDS}, {SECONDS} per host \(no target\)$",
    "hand-over": r"^3 peers: hand-over per host \(peer logs\), median: new process up to its "
                 rf"first renewal (-|{SECONDS}), then serving (-|{SECONDS}); slowest ping reply "
                 rf"(-|{SECONDS}) \(no target\)$",
    "failed automations": r"^3 peers: failed automations [0-9]+ \([0-9]+ pings of [0-9]+ rounds "
                          r"in all through the upgrade; target 0\): " + VERDICT,
}


def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--ttl", "1"], "bench/upgrade.py: argument --ttl: '1' is not from 2 to 30 seconds"),
    (["--peers", "3,x"], "bench/upgrade.py: argument --peers: not a list of peer counts: '3,x'"),
    (["--smokes"], "bench/upgrade.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
