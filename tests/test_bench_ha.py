"""bench/ha.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, a victim and
one other peer on the test driver, HA VMs booted on the victim, SIGKILL of
the victim's peer, its lease expiring, the recovery, every VM running on
the other host) and must end well, printing the row of figures and the
target's line, and leave nothing behind: no work directory, no peer, no
etcd.  Whether a target is met is the benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "ha.py")
TIMEOUT = 90
WORK = "peerctl-bha-"           # the benchmark's work directory, under /var/tmp
FIGURES = {
    "heading": r"^HA restart: SIGKILL of a host's peer -> all its HA VMs running elsewhere "
               r"\(margin 1 s, 1 other host, test driver; load average",
    "row": r"^   2     2 +[0-9.]+s +[0-9.]+s +[0-9.]+s$",
    "target": r"^target: 10 VMs at TTL 5 all running within 15 s \(Proxmox's HA ~120 s\): "
              rf"(not run|[0-9.]+ s: {VERDICT})$",
}


def test_the_smoke_run_prints_every_figure_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--ttls", "5,x"], "bench/ha.py: argument --ttls: not a list of TTLs: '5,x'"),
    (["--vms", "0"], "bench/ha.py: argument --vms: VM counts from 1 to 100: '0'"),
    (["--margin", "-1"], "bench/ha.py: argument --margin: '-1' is not above 0 and at most "
                         "60 seconds")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
