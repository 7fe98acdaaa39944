"""Crash points for tests, after etcd's gofail: die exactly where a test says.

A test that SIGKILLs a peer from outside cannot choose where the peer is in
its work; a crash point can.  ``PEERCTL_FAILPOINTS`` names a file of point
names, one a line (``append 3``: just before the transaction that appends
log index 3; ``append claim``: the first append of a step of that request; ``finish``: just before the terminal status is written;
``respond build``: a request of that name has run, its response not yet
written; ``responded build``: its response written, by an executor).  The
first process to reach a listed point removes its line, under an exclusive
lock so that exactly one process fires it, notes it in ``<file>.fired``, and
SIGKILLs itself: no ``finally``, no lease revoke, a real crash.

A line ``pause POINT`` (e.g. ``pause append 3``) SIGSTOPs the process there
instead: every thread freezes, its lease expires, and after a SIGCONT from
the test it goes on exactly from that point (a paused or partitioned peer
that wakes up believing it still leads).  When both forms are armed for one
point, the line written first fires first.

A line ``lose POINT`` (e.g. ``lose appended claim``) raises
:class:`~engine.errors.StoreUnavailable` there instead: at an ``appended
REQUEST`` point (the append of a step of that request is in etcd) it is a
reply lost on its way back, as an etcd member's restart loses one.

Without the variable :func:`crash` is one comparison: production pays nothing.
"""
from __future__ import annotations

import fcntl
import os
import signal
import threading
import time

__all__ = ["ENV", "arm", "crash", "fired"]

ENV = "PEERCTL_FAILPOINTS"
_PATH = os.environ.get(ENV) or None     # read once: the cost when disabled is a compare


def crash(point: str) -> None:
    """SIGKILL (or, for ``pause POINT``, SIGSTOP; for ``lose POINT``, raise
    StoreUnavailable) this process if ``point`` is armed, consuming it."""
    if _PATH is None:
        return
    fired = _consume(_PATH, point)
    if fired is None:
        return
    if fired.startswith("lose "):
        from engine.errors import StoreUnavailable
        raise StoreUnavailable(f"failpoint {point}: the reply was lost")
    if fired.startswith("pause "):
        # To this very thread: it stops on its way out of the call, before
        # running one more line (a process-wide kill may be taken by another
        # thread while this one goes on for a moment, e.g. into the append).
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


def _consume(path: str, point: str) -> str | None:
    """The armed line that fires at ``point`` (removed from the file), if any."""
    try:
        with open(path, "r+") as armed:
            fcntl.flock(armed, fcntl.LOCK_EX)
            points = armed.read().splitlines()
            matching = [p for p in points if p in (point, f"pause {point}", f"lose {point}")]
            if not matching:
                return None
            point = matching[0]
            points.remove(point)
            armed.seek(0)
            armed.truncate()
            armed.write("".join(p + "\n" for p in points))
            armed.flush()
            with open(path + ".fired", "a") as log:
                log.write(f"{point}\t{os.getpid()}\t{time.time():.6f}\n")
                log.flush()
                os.fsync(log.fileno())
            os.fsync(armed.fileno())
            return point
    except FileNotFoundError:
        return None


def arm(path: str, points: list[str]) -> None:
    """Arm ``points`` in the file ``path`` (tests)."""
    with open(path, "a") as armed:
        fcntl.flock(armed, fcntl.LOCK_EX)
        armed.write("".join(p + "\n" for p in points))


def fired(path: str) -> list[tuple[str, int, float]]:
    """``(point, pid, time)`` for every point fired so far, in order (tests)."""
    try:
        with open(path + ".fired") as log:
            rows = [line.rstrip("\n").split("\t") for line in log if line.strip()]
    except FileNotFoundError:
        return []
    return [(point, int(pid), float(at)) for point, pid, at in rows]
