"""bench/leases.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd and the etcd
placement backend, host providers, leases granted over a year, the window
check timed at each checkpoint, creates timed after the base) and must end
well, printing each figure and the verdict of its reference, and leave
nothing behind.  Whether the reference is met is the benchmark's answer,
never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "leases.py")
TIMEOUT = 60
WORK = "peerctl-bleases-"       # the benchmark's work directory, under /var/tmp
CHECK = r" +[0-9.]+ ms +[0-9]+ +[0-9.]+ us$"
FIGURES = {
    "checkpoint 30": r"^      30" + CHECK,
    "checkpoint 120": r"^     120" + CHECK,
    "creates": r"^creates: 20 in [0-9.]+s = [0-9]+ creates/s with 50 leases granted over the "
               r"hosts \([0-9]+ of [0-9]+ refused so far\)$",
    "reference": r"^reference: the check grows no faster than the leases in its window: from "
                 r"30 to 120 leases granted \(x4\) the leases read grew x[0-9.]+ and the check "
                 r"x[0-9.]+ \(allowed: x[0-9.]+\): " + VERDICT,
}


def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--checkpoints", "100"],
     "bench/leases.py: argument --checkpoints: want two lease counts or more: '100'"),
    (["--checkpoints", "100,x"],
     "bench/leases.py: argument --checkpoints: not a list of lease counts: '100,x'"),
    (["--samples", "0"], "bench/leases.py: argument --samples: '0' is less than 1")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
