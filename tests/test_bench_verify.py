"""bench/verify.py runs, small, from end to end: a 3-member etcd, three
peers, ``cluster verify`` and ``hostlist`` timed side by side; every figure
printed with its verdict, and nothing left behind.  How fast it is stays
the bench's answer."""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import run_refused, run_smoke, run_terminated

BENCH = os.path.join(ROOT, "bench", "verify.py")
WORK = "peerctl-bverify-"
NUMBER = r"[0-9]+\.[0-9]+"
FIGURE = rf" +{NUMBER} s \(fastest {NUMBER}, slowest {NUMBER}\)"
FIGURES = {
    "progress": rf"^N=3: cluster verify {NUMBER} s$",
    "columns": r"^hosts +cluster verify +hostlist \(same run\) +verdict$",
    "row": rf"^ +3 {FIGURE} {FIGURE} clean$",
    "goal": rf"^goal \(issue 51\): cluster verify on 20 hosts within 5 s: {NUMBER} s "
            r"\(N=3, not 20\): (PASS|MISS)$",
    "load": rf"^load average \(1, 5, 15 min\): before {NUMBER} {NUMBER} {NUMBER}, after ",
}


def test_the_smoke_run_prints_every_figure_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, 180)


def test_a_run_terminated_midway_says_so_and_leaves_nothing_behind():
    run_terminated(BENCH, WORK, " peer ", 180)


@pytest.mark.parametrize("args, line", [
    (["--sizes", "0"], "bench/verify.py: argument --sizes: host counts from 1 to 100: '0'"),
    (["--runs", "x"], "bench/verify.py: argument --runs: 'x' is not a whole number"),
    (["--smokes"], "bench/verify.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
