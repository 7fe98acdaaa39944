"""bench/join.py runs, small, from end to end: a TLS etcd with roles, a
peer serving its API over HTTPS, ``host add`` then ``join`` timed beside a
plain peer start; every figure printed, and nothing left behind.  How fast
it is stays the bench's answer."""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "join.py")
WORK = "peerctl-bjoin-"
NUMBER = r"[0-9]+\.[0-9]+"
FIGURE = rf" +{NUMBER} s \(fastest {NUMBER}, slowest {NUMBER}\)"
FIGURES = {
    "progress": rf"^run 1: join {NUMBER} s, plain peer start {NUMBER} s$",
    "join": rf"^join, token to serving {FIGURE}$",
    "reference": rf"^plain peer start \(same run\) {FIGURE}$",
    "cost": rf"^join's own cost: -?{NUMBER} s \(median of 1 run each, interleaved\)$",
    "load": rf"^load average \(1, 5, 15 min\): before {NUMBER} {NUMBER} {NUMBER}, after ",
}


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_the_smoke_run_prints_every_figure_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, 180)


@pytest.mark.parametrize("args, line", [
    (["--runs", "0"], "bench/join.py: argument --runs: runs from 1 to 20: '0'"),
    (["--smokes"], "bench/join.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
