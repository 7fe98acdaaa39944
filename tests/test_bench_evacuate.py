"""bench/evacuate.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, four real
peers on big test host files, a boot onto t1, the drain and the planner's
pick, one ``evacuate`` with 8 lanes, every VM off t1, the destroy and the
undrain, CPU and etcd's requests read around the evacuation) and must end
well, printing its row of figures and the verdict on the target, and leave
nothing behind: no work directory, no peer, no etcd.  Whether the target
is met is the benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "evacuate.py")
TIMEOUT = 120
WORK = "peerctl-bevac-"         # the benchmark's work directory, under /var/tmp
NUMBER = r"[0-9]+\.[0-9]+"
FIGURES = {
    "row": rf"^ +12 +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +[1-3] "
           rf"+{NUMBER} +{NUMBER} +{NUMBER}$",
    "target": r"^target \(issue 34\): >= 100 VMs/s evacuated at N=100, --parallel 8 "
              r"\(was 47 VMs/s\)$",
    "verdict": rf"^  N=12: {NUMBER} VMs/s evacuated, {NUMBER} s, --parallel 8 "
               r"\(N < 100: start-up weighs more\): " + VERDICT,
    "load": rf"^load average \(1, 5, 15 min\): before {NUMBER} {NUMBER} {NUMBER}, after ",
}


def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--sizes", "10,x"], "bench/evacuate.py: argument --sizes: not a list of VM counts: "
                          "'10,x'"),
    (["--sizes", "0"], "bench/evacuate.py: argument --sizes: VM counts from 1 to 2000: '0'"),
    (["--parallel", "0"], "bench/evacuate.py: argument --parallel: '0' is not from 1 to 64"),
    (["--smokes"], "bench/evacuate.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
