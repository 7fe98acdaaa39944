"""bench/bulk.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, three real
peers on the test driver, their allocation ratios raised, one ``boot`` and
one ``destroy`` automation for each N, the CPU of the peers and etcd read
around each boot) and must end well, printing the table, each target's line with its verdict (or why it is not judged: the
targets are for N=1,000), the load average, and leave nothing behind: no
work directory, no peer, no etcd.  Whether a target is met is the
benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "bulk.py")
TIMEOUT = 120
WORK = "peerctl-bbulk-"         # the benchmark's work directory, under /var/tmp
ROW = r"[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +3 +[0-9.]+ +[0-9.]+$"
UNJUDGED = r"not judged \(N < 1,000\)$"
FIGURES = {
    "N=10": rf"^ +10 +{ROW}",
    "N=50": rf"^ +50 +{ROW}",
    "rate": r"^  issue 34: N=50 booted at [0-9.]+ VMs/s \(target >= 250 VMs/s at N=1,000\): "
            + UNJUDGED,
    "issue 4": r"^  issue 4: N=50 booted in [0-9.]+ s \(target N=1,000 in <= 20 s\): " + UNJUDGED,
    "linear": r"^  linear: [0-9.]+ ms/VM at N=50 vs [0-9.]+ at N=10 \(target <= x1\.5\): "
              + VERDICT,
    "load": r"^load average \(1, 5, 15 min\): before [0-9. ]+, after [0-9. ]+ \([0-9]+ CPUs\)$",
}


def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--sizes", "10,x"], "bench/bulk.py: argument --sizes: not a list of VM counts: '10,x'"),
    (["--peers", "0"], "bench/bulk.py: argument --peers: peers from 1 to 50: '0'"),
    (["--busy", "-1"], "bench/bulk.py: argument --busy: busy processes from 0 to 16: '-1'"),
    (["--smokes"], "bench/bulk.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
