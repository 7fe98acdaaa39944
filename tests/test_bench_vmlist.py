"""bench/vmlist.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd with 100 VM
records, interleaved rounds of ``vmlist``, ``--format json vmlist``, the
fresh-process range read and ``python -c pass``, each checked for what it
printed, then the range read in process) and must end well, printing each
figure and the verdict of each target, and leave nothing behind.  Whether
a target is met is the benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "vmlist.py")
TIMEOUT = 60
WORK = "peerctl-bvmlist-"       # the benchmark's work directory, under /var/tmp
TIMES = r"\s+[0-9.]+s\s+[0-9.]+s$"
FIGURES = {
    "size": r"^5 hosts x 20 VMs = 100 VMs, medians of 3 interleaved rounds; load average",
    "table": r"^  vmlist \(table\)" + TIMES,
    "json": r"^  vmlist --format json" + TIMES,
    "reference": r"^  reference: range read, fresh process" + TIMES,
    "interpreter": r"^  python -c pass" + TIMES,
    "in process": r"^  reference: range read, in process" + TIMES,
    "under a second": r"^  vmlist under a second \([0-9.]+s\): " + VERDICT,
    "ratio": r"^  vmlist <= 1\.1x the fresh-process range read \([0-9.]+x: [0-9.]+s vs "
             r"[0-9.]+s; rounds' own ratios, median [0-9.]+x\): " + VERDICT,
}


def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--runs", "0"], "bench/vmlist.py: argument --runs: '0' is less than 1"),
    (["--hosts", "x"], "bench/vmlist.py: argument --hosts: 'x' is not a whole number"),
    (["--smokes"], "bench/vmlist.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
