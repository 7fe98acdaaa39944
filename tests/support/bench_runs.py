"""A benchmark run from a test, small: its smoke run must end well, print
every figure it promises, and leave nothing behind; bad options must be
one line and start nothing.  Whether a target is met is the benchmark's
answer, never the test's."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.support import ROOT
from tests.support.bench_leftovers import leftovers

__all__ = ["VERDICT", "run_smoke", "run_refused"]

VERDICT = r"(PASS|MISS)$"


def run_smoke(bench: str, figures: dict[str, str], work: str, timeout: float) -> str:
    """Run ``bench --smoke``: exit 0, a line matching each of ``figures``
    (name -> regex), no new ``/var/tmp/<work>*`` nor process in one; its
    stdout."""
    before = leftovers(work)
    done = subprocess.run([sys.executable, bench, "--smoke"], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    for figure, line in figures.items():
        assert re.search(line, done.stdout, re.M), f"no {figure} line:\n{done.stdout}"
    assert leftovers(work) - before == set(), "the benchmark left these behind"
    return done.stdout


def run_refused(bench: str, args: list[str], line: str, work: str) -> None:
    """``bench args`` says ``line`` alone on stderr, exits 2, starts nothing."""
    before = leftovers(work)
    done = subprocess.run([sys.executable, bench, *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.splitlines() == [line]
    assert leftovers(work) - before == set()
