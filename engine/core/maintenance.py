"""Keeping etcd's history and space in bounds.

etcd keeps every revision until told to compact, and refuses every write
once its database reaches its quota (a NOSPACE alarm).  Two things here:

- :func:`compactor`, a cluster singleton's duty: it notes etcd's revision
  every ``interval`` and compacts to the newest revision noted more than
  ``history`` seconds ago, recording ``maintenance/compaction``
  ``{revision, time, host}``.  etcd's own ``--auto-compaction-*`` (what
  ``up`` sets) does the same job; both together are harmless (a revision
  already compacted is skipped).  A freshly elected compactor waits one
  ``history`` before its first compaction: it knows no older revision;
- :func:`space`, what the command line shows: the database size against
  the quota and the alarms raised, with :func:`space_warning`'s one line
  when an alarm is raised or the database is past ``WARN_RATIO`` of quota.

Compaction frees history but not disk: defragment (``etcdctl defrag``, one
member at a time) to give the space back (docs/operations.md).
"""
from __future__ import annotations

import threading
import time
from collections import deque

import structlog

from engine.errors import Deposed, StoreRefused, StoreUnavailable

from . import keys
from .store import Put

__all__ = ["compactor", "space", "space_warning", "WARN_RATIO", "DEFAULT_QUOTA"]

log = structlog.get_logger("maintenance")

WARN_RATIO = 0.8
DEFAULT_QUOTA = 2 * 1024 ** 3       # etcd's default --quota-backend-bytes


def compactor(store, history: float, host: str, interval: float | None = None):
    """The singleton's duty (on ``host``): keep ``history`` seconds of etcd's
    revisions."""
    if interval is None:
        interval = max(1.0, min(300.0, history / 10))

    def duty(stop: threading.Event, candidacy):
        noted: deque[tuple[float, int]] = deque()
        while True:
            try:
                noted.append((time.monotonic(), store.revision()))
                cutoff = time.monotonic() - history
                target = 0
                while noted and noted[0][0] <= cutoff:
                    target = noted.popleft()[1]
                if target:
                    _compact(store, candidacy, target, host)
            except StoreUnavailable as exc:
                log.warning("compaction_skipped", error=str(exc))
            except Deposed:
                return          # the new compactor carries on
            if stop.wait(interval):
                return
    return duty


def _compact(store, candidacy, revision: int, host: str) -> None:
    try:
        store.compact(revision)
    except StoreRefused as exc:
        if "compacted" not in str(exc):     # etcd's own compaction got there first
            raise
        return
    candidacy.txn([], [Put(keys.maintenance("compaction"),
                           {"revision": revision, "time": time.time(),
                            "host": host})])
    log.info("etcd_compacted", revision=revision)


def space(store, quota: int = DEFAULT_QUOTA) -> dict:
    """``{db_size, quota, ratio, alarms}`` as the member answering sees them."""
    status = store.status()
    return {"db_size": status["db_size"], "quota": quota,
            "ratio": status["db_size"] / quota if quota else 0.0,
            "alarms": status["alarms"]}


def space_warning(found: dict) -> str | None:
    """One line for the user when etcd is out of space or close to it."""
    size = f"{found['db_size'] / 1024 ** 2:.0f} MiB of {found['quota'] / 1024 ** 2:.0f} MiB"
    if "NOSPACE" in found["alarms"]:
        return (f"etcd is out of space ({size}, NOSPACE alarm): it refuses every write "
                "until compacted, defragmented and disarmed (docs/operations.md)")
    if found["alarms"]:
        return f"etcd has alarms raised: {', '.join(found['alarms'])}"
    if found["ratio"] >= WARN_RATIO:
        return (f"etcd's database is at {found['ratio']:.0%} of its quota ({size}): "
                "compact and defragment soon (docs/operations.md)")
    return None
