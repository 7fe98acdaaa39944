"""bench/soak.py runs, small, from end to end.

``--smoke`` takes every path of the soak (a 3-member etcd and five peers
per seed, the seeded rounds of boots, moves, evacuations, backups and
replications, one fault a round, the settling, etcd's whole history read
back and judged) for 2 seeds of 5 rounds.  It must print each seed's line
with its verdict and the summary, and leave nothing behind: no work
directory, no peer, no etcd member.  Then the verdict itself: every rule
holds (exit 0), which needs an engine that never lists a VM on two hosts
at once (rule 1: a move drops the source's record in the transaction that
writes the destination's).  Bad options: one line, exit 2, nothing started.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.bench_leftovers import leftovers
from tests.support.bench_runs import run_refused

BENCH = os.path.join(ROOT, "bench", "soak.py")
TIMEOUT = 240
WORK = "peerctl-soak-"          # the benchmark's work directory, under /var/tmp
SEED_LINE = (r"^seed {seed}: 5 rounds, faults [a-z0-9=,-]+, [0-9]+ automations, [0-9]+ VMs, "
             r"(not settled, )?verdict (holds|[0-9]+ violations), [0-9]+ s$")


@pytest.mark.slow
def test_the_smoke_run_judges_two_seeds_and_leaves_nothing_behind():
    before = leftovers(WORK)
    done = subprocess.run([sys.executable, BENCH, "--smoke"], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=ROOT)
    output = f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    assert leftovers(WORK) - before == set(), "the soak left these behind"
    for seed in (0, 1):
        assert re.search(SEED_LINE.format(seed=seed), done.stdout, re.M), output
    assert re.search(r"^summary: 2 seeds, 10 rounds, faults ", done.stdout, re.M), output
    assert done.returncode == 0, output
    assert len(re.findall(r"verdict holds", done.stdout)) == 2, output


@pytest.mark.parametrize("args, line", [
    (["--seeds", "0"], "bench/soak.py: argument --seeds: '0' is less than 1"),
    (["--rounds", "0"], "bench/soak.py: argument --rounds: rounds from 1 to 100: '0'"),
    (["--first", "x"], "bench/soak.py: argument --first: 'x' is not a whole number")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
