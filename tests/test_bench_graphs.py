"""bench/graphs.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (a book of 50 VMs filled with
an hour of samples, its memory per VM and per host, a sample put and a
VM's graphs read) and must end well, printing each figure and the verdict
of each target.  Whether a target is met is the benchmark's answer, never
this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "graphs.py")
TIMEOUT = 60
WORK = "peerctl-bgraphs-"       # the benchmark makes no work directory: none may appear
FIGURES = {
    "size": r"^1 host and 50 VMs, the hour wrapped; medians of 3 runs$",
    "per VM": r"^  memory per VM [0-9.]+ KB \([0-9.]+ KB of it values\)$",
    "per host": r"^  memory per host [0-9.]+ KB",
    "put": r"^  a sample of 50 VMs put [0-9.]+ ms \([0-9.]+ ms for 1,000\)$",
    "read": r"^  a VM's hour and day read [0-9.]+ ms$",
    "memory target": r"^  at most 20 KB per VM \([0-9.]+ KB\): " + VERDICT,
    "time target": r"^  a sample of 1,000 VMs under 100 ms \([0-9.]+ ms\): " + VERDICT,
}


def test_the_smoke_run_prints_every_figure_with_its_verdict():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--vms", "0"], "bench/graphs.py: argument --vms: '0' is less than 1"),
    (["--runs", "x"], "bench/graphs.py: argument --runs: 'x' is not a whole number"),
    (["--smokes"], "bench/graphs.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
