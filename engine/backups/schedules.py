"""Schedules of backups: ``schedules/backup/<id>`` in etcd, each carried
by one long-lived ``backup_schedule`` automation
(``automations/backup_schedules.py``) that sleeps on a durable timer.

A schedule is identified by its pattern (its id is derived from it), so
scheduling a pattern again changes that schedule instead of adding a
second one.  Promises:

- :func:`put` writes the record and, in the same transaction, creates the
  automation when no running one carries the schedule; when one does, it
  is nudged and reads the record again: a changed interval or retention
  counts from then;
- :func:`delete` removes the record and nudges the automation, which ends
  at its next look; the backups stay (retention never runs again for
  them: ``backup delete`` removes them);
- the record holds ``next`` (the time the next run is due) and ``last``
  (when the last one ran) as the automation leaves them.
"""
from __future__ import annotations

import hashlib
import time

from engine.core import api, keys
from engine.core.store import Delete, Put, absent, modified_at
from engine.core.values import declare, readable, shape
from engine.errors import Conflict, Failed

from .retention import check_keep

__all__ = ["SCHEDULE", "MIN_EVERY", "KIND", "schedule_id", "read", "read_all", "put", "delete",
           "check_every"]

SCHEDULE = shape("backup schedule", id=str, pattern=str, every=(int, float), keep=dict)
declare(keys.backup_schedule() + "*", SCHEDULE)

MIN_EVERY = 1.0             # seconds: tests run schedules every few seconds
KIND = "backup_schedule"


def schedule_id(pattern: str) -> str:
    return hashlib.sha256(pattern.encode()).hexdigest()[:12]


def check_every(every: float) -> float:
    if not isinstance(every, (int, float)) or isinstance(every, bool) or every < MIN_EVERY:
        raise ValueError(f"a schedule's interval must be at least {MIN_EVERY:g}s, got {every!r}")
    return float(every)


def read(store, schedule: str) -> dict | None:
    return readable(store.get(keys.backup_schedule(schedule)))


def read_all(store) -> list[dict]:
    """Every readable schedule (an unreadable one is reported and skipped)."""
    return [value for value in (readable(kv) for kv in store.range(keys.backup_schedule())[0])
            if value is not None]


def _running(store, automation_id) -> bool:
    if not automation_id:
        return False
    task = readable(store.get(keys.task(automation_id)))
    return task is not None and task.get("state") == "running"


def put(store, pattern: str, every: float, keep: dict, to: str | None = None,
        prefer: list[str] | None = None) -> dict:
    """Create or change the schedule of ``pattern``; its record.  ``prefer``:
    the hosts whose peers should carry a new automation (tests)."""
    every, keep = check_every(every), check_keep(keep)
    sid = schedule_id(pattern)
    key = keys.backup_schedule(sid)
    for _ in range(10):
        kv = store.get(key)
        known = readable(kv) if kv is not None else None
        now = time.time()
        record = {"id": sid, "pattern": pattern, "every": every, "keep": keep, "to": to,
                  "created": (known or {}).get("created", now), "changed": now,
                  "next": now + every if known is None else min(known.get("next", now),
                                                                now + every),
                  "last": (known or {}).get("last"), "runs": (known or {}).get("runs", 0),
                  "last_run": (known or {}).get("last_run"),
                  "automation": (known or {}).get("automation")}
        guard = [absent(key)] if kv is None else [modified_at(key, kv.mod_revision)]
        if _running(store, record["automation"]):
            if store.txn(guard, [Put(key, record)]).succeeded:
                api.nudge(store, record["automation"], "schedule changed")
                return record
            continue
        automation_id, compares, ops = api.automation_ops(store, KIND, {"schedule": sid},
                                                          prefer=prefer)
        record["automation"] = automation_id
        if store.txn(guard + compares, [Put(key, record), *ops]).succeeded:
            return record
    raise Conflict(f"schedule {sid} kept changing under this write: try again")


def delete(store, schedule: str) -> dict:
    """Remove schedule ``schedule`` (its id); its record as it was."""
    record = read(store, schedule)
    if record is None:
        raise Failed(f"no backup schedule {schedule!r} (see backup schedule list)")
    store.txn([], [Delete(keys.backup_schedule(schedule))])
    if record.get("automation"):
        api.nudge(store, record["automation"], "schedule deleted")
    return record
