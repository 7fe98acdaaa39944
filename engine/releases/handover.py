"""A peer hands its host over to a process of another release, keeping its
etcd lease, and takes it back if that process does not come up.

The old process (trusted: it ran until now) does it all:

1. it stops serving (its requests finished, its duties and singletons
   handed on, the API port freed) but keeps the lease, renews it and notes
   that moment in ``<state_dir>/releases/handover.json``; until the new
   process serves, it renews the lease every half TTL (noted there too), so
   a slow start never lets the lease lapse;
2. it writes the new choice in ``current.json``
   (:mod:`engine.releases.current`) and starts the new release's
   ``peerctl.py`` with the same arguments, told the lease to adopt
   (``PEERCTL_ADOPT_LEASE``) and the hand-over file (``PEERCTL_HANDOVER``);
3. it waits until the new process notes that it serves (:func:`note_serving`
   writes ``<state_dir>/releases/serving.json`` with its PID, once its host
   record is written under the lease, its guard checked and its first
   publication done), then exits.  Under systemd the new process has just
   before told the service manager ``MAINPID=<its pid>`` itself
   (:mod:`engine.core.service_notify`): the unit follows it, and the old
   one's exit is no failure;
4. if the new process exits first, or has not noted it within the
   deadline, the old one kills it (its own child, by PID), writes the old
   choice back, and serves again on the same lease: a rollback, which its
   host record reports (``rolled_back: {to, why, time}``).

Because the lease is never revoked, the host never looks dead: the HA guard
stays quiet (its heartbeat is renewed by whichever process holds the lease)
and no VM is restarted elsewhere.  ``out_of_service_s`` is the time from the
old process's last renewal to the new one's first (at most about half a
TTL, then: a slower start shows in the upgrade's time instead).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from .current import clear_current, read_current, read_json, releases_dir, write_current, \
    write_json

__all__ = ["Outcome", "hand_over", "note_serving", "handed_over", "ADOPT_ENV", "HANDOVER_ENV",
           "DEFAULT_DEADLINE"]

ADOPT_ENV = "PEERCTL_ADOPT_LEASE"
HANDOVER_ENV = "PEERCTL_HANDOVER"
DEFAULT_DEADLINE = 60.0     # seconds a new release has to come up before it is rolled back
_POLL = 0.05


class Outcome:
    """What a hand-over came to: ``ok`` (the new process serves), else
    ``why`` it was rolled back."""
    def __init__(self, ok: bool, why: str = "", pid: int | None = None):
        self.ok, self.why, self.pid = ok, why, pid


def _serving_path(state_dir: str) -> str:
    return os.path.join(releases_dir(state_dir), "serving.json")


def _handover_path(state_dir: str) -> str:
    return os.path.join(releases_dir(state_dir), "handover.json")


def _tail(path: str | None, start: int) -> str:
    """The last line the new process wrote to the shared log, if we know it."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines()
                     if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _log_path() -> str | None:
    """The file our stdout goes to (the peer's log), if it is one."""
    try:
        path = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return path if os.path.isfile(path) else None


def hand_over(state_dir: str, lease: int, last_renewal: float, choice: dict,
              previous: dict, deadline: float = DEFAULT_DEADLINE, carried: str | None = None,
              automation: str | None = None, renew=None, ttl: float = 5.0,
              tick=None) -> Outcome:
    """Start ``choice`` (``{release, path, version, ...}``) as this host's
    peer on ``lease`` and wait until it serves; on failure, put ``previous``
    back as the current choice (the caller serves again).  While it has not
    said it serves, ``renew()`` (the lease renewed, its wall-clock time) is
    called every half TTL: a new process slow to start never lets the
    host's lease lapse, and the hand-over file keeps the last renewal.
    ``tick()``, if given, is called at every look (a service manager's
    watchdog: waiting for the new process is no hang)."""
    before = read_current(state_dir)
    serving = _serving_path(state_dir)
    try:
        os.unlink(serving)
    except FileNotFoundError:
        pass
    noted = {"from": previous, "to": choice, "lease": lease, "last_renewal": last_renewal,
             "old_pid": os.getpid(), "automation": automation, "carried": carried}
    write_json(_handover_path(state_dir), noted)
    write_current(state_dir, {**choice, "previous": previous})
    script = os.path.join(choice["path"], "peerctl.py")
    log = _log_path()
    log_start = os.path.getsize(log) if log else 0
    env = {**os.environ, ADOPT_ENV: f"{lease:x}", HANDOVER_ENV: _handover_path(state_dir)}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        child = subprocess.Popen([sys.executable, script, *sys.argv[1:]], env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        _restore(state_dir, before)
        return Outcome(False, f"could not start {script}: {exc}")
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        said = read_json(serving)
        if said and said.get("pid") == child.pid:
            try:
                os.unlink(_handover_path(state_dir))
            except FileNotFoundError:
                pass
            return Outcome(True, pid=child.pid)
        if renew is not None and time.time() - noted["last_renewal"] >= ttl / 2:
            try:
                noted["last_renewal"] = renew()
                write_json(_handover_path(state_dir), noted)
            except Exception:       # etcd away: the new process may still renew it
                pass
        if tick is not None:
            tick()
        code = child.poll()
        if code is not None:
            last = _tail(log, log_start)
            _restore(state_dir, before)
            return Outcome(False, f"the new peer exited with status {code} at start"
                           + (f": {last}" if last else ""))
        time.sleep(_POLL)
    child.send_signal(signal.SIGKILL)
    child.wait()
    _restore(state_dir, before)
    return Outcome(False, f"the new peer did not serve within {deadline:g} s")


def _restore(state_dir: str, before: dict | None) -> None:
    if before is None:
        clear_current(state_dir)
    else:
        write_current(state_dir, before)
    try:
        os.unlink(_handover_path(state_dir))
    except FileNotFoundError:
        pass


def handed_over() -> dict | None:
    """In a new process: the hand-over it came from (None on a plain start)."""
    path = os.environ.get(HANDOVER_ENV)
    return read_json(path) if path else None


def adopted_lease() -> int | None:
    value = os.environ.get(ADOPT_ENV)
    try:
        return int(value, 16) if value else None
    except ValueError:
        return None


def note_serving(state_dir: str, first_renewal: float) -> dict | None:
    """In a new process that serves: tell the old one (it exits then);
    ``{from, out_of_service_s, time}`` for the host record, or None on a
    plain start."""
    came = handed_over()
    if came is None:
        return None
    write_json(_serving_path(state_dir), {"pid": os.getpid(), "time": time.time()})
    try:
        os.unlink(os.environ[HANDOVER_ENV])
    except OSError:
        pass
    for name in (ADOPT_ENV, HANDOVER_ENV):      # a later start is a plain one
        os.environ.pop(name, None)
    previous = came.get("from") or {}
    return {"from": previous.get("release") or previous.get("version"),
            "out_of_service_s": round(max(first_renewal - float(came.get("last_renewal") or 0),
                                          0.0), 3),
            "time": time.time(), "automation": came.get("automation")}
