"""A benchmark run from a test, small: its smoke run must end well, print
every figure it promises, and leave nothing behind; bad options must be
one line and start nothing; a run stopped by SIGTERM midway says so in one
line and leaves nothing behind either.  Runs of one benchmark take turns
(:func:`alone`): what one leaves is never another's.  Whether a target is met is the benchmark's
answer, never the test's."""
from __future__ import annotations

import contextlib
import fcntl
import re
import signal
import subprocess
import sys

from tests.support import ROOT, wait_for
from tests.support.bench_leftovers import leftovers

__all__ = ["VERDICT", "run_smoke", "run_refused", "run_terminated"]

VERDICT = r"(PASS|MISS)$"


@contextlib.contextmanager
def alone(work: str):
    """Hold the lock of the benchmark whose work directories are named
    ``work*``: test workers running the same benchmark take turns, so that a
    run's leftovers are counted against that run alone."""
    with open(f"/tmp/{work}tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run_smoke(bench: str, figures: dict[str, str], work: str, timeout: float) -> str:
    """Run ``bench --smoke``: exit 0, a line matching each of ``figures``
    (name -> regex), no new ``/var/tmp/<work>*`` nor process in one; its
    stdout."""
    with alone(work):
        before = leftovers(work)
        done = subprocess.run([sys.executable, bench, "--smoke"], capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT)
        after = leftovers(work)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    for figure, line in figures.items():
        assert re.search(line, done.stdout, re.M), f"no {figure} line:\n{done.stdout}"
    assert after - before == set(), "the benchmark left these behind"
    return done.stdout


def run_refused(bench: str, args: list[str], line: str, work: str) -> None:
    """``bench args`` says ``line`` alone on stderr, exits 2, starts nothing."""
    with alone(work):
        before = leftovers(work)
        done = subprocess.run([sys.executable, bench, *args], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        after = leftovers(work)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.splitlines() == [line]
    assert after - before == set()


def run_terminated(bench: str, work: str, started: str, timeout: float) -> None:
    """SIGTERM ``bench --smoke`` once it runs a process in its work
    directory whose command line holds ``started``: one line on stderr,
    ``bench/<name>.py: terminated (everything it started is gone)``, exit 1,
    and no new ``/var/tmp/<work>*`` nor process in one."""
    with alone(work):
        before = leftovers(work)
        run = subprocess.Popen([sys.executable, bench, "--smoke"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            wait_for(lambda: any(started in found for found in leftovers(work) - before)
                     or run.poll() is not None, timeout=timeout, what=f"{started} in {work}*")
            run.send_signal(signal.SIGTERM)
            _, stderr = run.communicate(timeout=timeout)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        after = leftovers(work)
    name = bench.rsplit("/", 1)[-1]
    assert (run.returncode, stderr.splitlines()[-1:]) == (
        1, [f"bench/{name}: terminated (everything it started is gone)"]), stderr
    assert after - before == set(), "the benchmark left these behind"
