"""bench/engine.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, raw
transactions from one thread and from eight, three real peers on the test
driver running no-op automations sequential and parallel, on the initiator
and on another peer, the floor of a step measured before each of its runs,
the step's timeline and its CPU against its floor's, a SIGKILLed initiator
and its successor) and must end well, printing each figure with its
verdict, and leave nothing behind: no work directory, no peer, no etcd.
Whether a target is met is the benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "engine.py")
TIMEOUT = 120
WORK = "peerctl-bengine-"       # the benchmark's work directory, under /var/tmp
RATE = r"\s+[0-9]+\s+[0-9]+%"
FIGURES = {
    "sequential, here": rf"^steps/s, sequential, step on the initiator{RATE} >= 40%: " + VERDICT,
    "sequential, there": rf"^steps/s, sequential, step on another peer{RATE} "
                         r"target: see its floor, below$",
    "parallel, here": rf"^steps/s, 16 parallel workers, on the initiator{RATE} "
                      r"\([0-9]+% of 8 threads\) >= 40%: " + VERDICT,
    "parallel, there": rf"^steps/s, 16 parallel workers, on another peer{RATE} "
                       r"\([0-9]+% of 8 threads\) >= 40%: " + VERDICT,
    "floor": r"^step on another peer: [0-9.]+ ms vs its floor, 3 sequential raw transactions "
             r"[0-9.]+ ms \(interleaved, medians of 3\) = x[0-9.]+ \(target <= x1\.25\): "
             + VERDICT,
    "timeline": r"^a step on another peer, median ms per hop \(the median run\): "
                r"to handler [0-9.]+, handler [0-9.]+, to next entry [0-9.]+$",
    "cpu": r"^CPU of a step on another peer: [0-9.]+ ms \(etcd [0-9.]+, initiator [0-9.]+, "
           r"target [0-9.]+\) vs its floor's [0-9.]+ ms \(etcd [0-9.]+, client [0-9.]+\) "
           r"= x[0-9.]+ \(medians\)$",
    "failover": r"^failover, SIGKILL of the initiator -> next append by another peer "
                r"\(TTL 2s\): median [0-9.]+s, max [0-9.]+s, runs [0-9.]+ "
                r"\(target: every run within TTL \+ 0\.5 = 2\.5s\): " + VERDICT,
    "load": r"^load average before -> after: [0-9. ]+ -> [0-9. ]+$",
}


def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--runs", "0"], "bench/engine.py: argument --runs: '0' is less than 1"),
    (["--steps", "x"], "bench/engine.py: argument --steps: 'x' is not a whole number"),
    (["--smokes"], "bench/engine.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
