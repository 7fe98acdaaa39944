"""bench/idle.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, the bare
watch client, one real peer on a big test host file, the window at N=0,
five VMs booted through a ``boot`` automation and published, the window
at N=5, CPU and memory read with psutil for the peer, the bare watch and
etcd) and must end well, printing every figure beside its reference and
the verdicts on the goal, and leave nothing behind: no work directory, no
peer, no watch client, no etcd.  Whether the goal is met is the
benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "idle.py")
TIMEOUT = 90
WORK = "peerctl-bidle-"         # the benchmark's work directory, under /var/tmp
NUMBER = r"[0-9]+\.[0-9]+"
BESIDE = rf" +{NUMBER} +{NUMBER}$"       # the peer's figure, then the bare watch's
FIGURES = {
    "N=0": r"^N=0 VMs on i1: idle over [0-9.]+ s \(1 window\), 1 s after the last VM was "
           r"published$",
    "N=5": r"^N=5 VMs on i1, booted in [0-9.]+ s: idle over [0-9.]+ s \(1 window\), 1 s after",
    "columns": r"^ +peer +bare watch$",
    "cpu": r"^  CPU, % of one CPU" + BESIDE,
    "cpu per minute": r"^  CPU s per minute" + BESIDE,
    "rss": r"^  RSS MiB \(peak\)" + BESIDE,
    "uss": r"^  USS MiB \(at the end\)" + BESIDE,
    "windows": rf"^  CPU in each window, % of one CPU \(the median above\): peer {NUMBER}; "
               rf"bare watch {NUMBER}$",
    "etcd": rf"^  beside: etcd {NUMBER} % of one CPU, serving {NUMBER} requests/s; [0-9]+ "
            r"revisions written in the window$",
    "goal": r"^goal \(issue 50\): a peer idle at N=200 VMs uses <= 0\.5 % of one CPU and "
            r"<= 100 MiB resident$",
    "cpu verdict": rf"^  N=5: CPU {NUMBER} % of one CPU \(bare watch {NUMBER} %\) "
                   r"\(N=5, not 200\): " + VERDICT,
    "rss verdict": rf"^  N=5: RSS {NUMBER} MiB \(bare watch {NUMBER} MiB\) "
                   r"\(N=5, not 200\): " + VERDICT,
    "load": rf"^load average \(1, 5, 15 min\): before {NUMBER} {NUMBER} {NUMBER}, after ",
}


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    out = run_smoke(BENCH, FIGURES, WORK, TIMEOUT)
    assert out.count("  CPU, % of one CPU") == 2, "one table per size"


@pytest.mark.parametrize("args, line", [
    (["--sizes", "0,x"], "bench/idle.py: argument --sizes: not a list of VM counts: '0,x'"),
    (["--sizes", "1001"], "bench/idle.py: argument --sizes: VM counts from 0 to 1000: '1001'"),
    (["--window", "0"], "bench/idle.py: argument --window: seconds from 1 to 3600: '0'"),
    (["--window", "a minute"], "bench/idle.py: argument --window: 'a minute' is not a whole "
                               "number"),
    (["--repeats", "0"], "bench/idle.py: argument --repeats: windows from 1 to 20: '0'"),
    (["--smokes"], "bench/idle.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
