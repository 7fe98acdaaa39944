"""bench/balance.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (skewed clusters planned and
timed, the mixed cluster with traits and spread groups, hbal's example and
the share of the gain the first half of each plan brings, the exhaustive
search for the fewest moves on a small cluster) and must end well, printing
each figure beside its reference.  It is pure (no etcd, no process): it
leaves nothing behind.  The plan time's target is judged at 1,000 hosts,
which the smoke run leaves out; whether it is met is the benchmark's
answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "balance.py")
TIMEOUT = 60
WORK = "peerctl-bbalance-"      # none: the benchmark writes no work directory
SKEWED = (r"^plan: {} hosts x [0-9]+ VMs \(half full, half nearly empty\): [0-9]+ moves in "
          r"[0-9]+ sets, score [0-9.]+ -> [0-9.]+, [0-9.]+ s \([0-9]+ us a move\) \(target "
          r"<= 1 s at 1,000 hosts\)$")
FIGURES = {
    "plan at 20 hosts": SKEWED.format(20),
    "plan at 100 hosts": SKEWED.format(100),
    "mixed": r"^plan: 100 hosts x [0-9]+ VMs of three host sizes, traits and spread groups: "
             r"[0-9]+ moves, score [0-9.]+ -> [0-9.]+, [0-9.]+ s \(no target\)$",
    "hbal's example": r"^first half: hbal's example \(20 nodes, [0-9]+ instances of 6000 MB\): "
                      r"[0-9]+% of the gain in the first [0-9]+ of [0-9]+ moves, 89% after "
                      r"[0-9]+ vs hbal's 89% in the first 7 of 15 moves$",
    "first half": r"^first half: 100 hosts x [0-9]+ VMs: [0-9]+% of the gain",
    "exhaustive": r"^exhaustive: 1 x \(5 hosts, 8 VMs\): greedy [0-9]+ moves vs the fewest "
                  r"that reach a score as good [0-9]+ \(x[0-9.]+, worst cluster x[0-9.]+; "
                  r"searched in [0-9.]+ s\)$",
}


def test_the_smoke_run_prints_every_figure_beside_its_reference():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--sizes", "100,x"],
     "bench/balance.py: bad --sizes '100,x': want numbers separated by commas"),
    (["--runs", "0"], "bench/balance.py: --sizes and --per-host want 2 or more, --runs 1 or "
                      "more, --small 0 or more"),
    (["--smokes"], "bench/balance.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
