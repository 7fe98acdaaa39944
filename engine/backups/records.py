"""Backup records, ``backups/<id>``: their shape, reading them, and the
marks that keep a backup from being deleted.

A record is written by the target host only when the backup's data is
complete there and its checksums verified
(:func:`engine.hypervisor.data.backups.verify`); it is deleted after the data
(:func:`engine.hypervisor.data.backups.delete`).  An unreadable record is
reported and skipped by every reader, never trusted.

Besides what the backup is, a record carries (each absent on records
written before issue 48, and read as its default):

- ``schedule``: the id of the schedule whose run made it; absent or None
  for a backup taken by hand -- and for one a schedule made before the
  field existed, which cannot be told apart: such a backup is never pruned
  by a schedule, only ``backup delete`` removes it;
- ``protected``: True keeps it from every prune and from ``backup
  delete`` (Proxmox's ``protected``), until ``backup unprotect``;
- ``holds``: ``{automation id: time}``, the restores reading it now
  (:func:`hold`, :func:`release`).  A hold whose automation is no longer
  running (finished, or dropped by the janitor) is stale and counts for
  nothing, so a restore that dies leaves no hold that matters; one whose
  automation cannot be read counts (it may be running);
- ``deleting``: set, in a transaction that finds it neither protected nor
  held by a running restore, before the first volume is deleted
  (:func:`begin_delete`); a restore never holds such a backup;
- ``lost``: ``{host, time, why}``, its target host was removed (``host
  remove``) and its data with it (:func:`mark_lost`): the record stays, so
  that nothing disappears unsaid, until ``backup delete`` drops it.

Every change of a record is one transaction guarded by its revision, so a
hold and a delete never both win."""
from __future__ import annotations

import time

from engine.core import keys
from engine.core.store import Put, modified_at
from engine.core.values import declare, readable, shape
from engine.errors import Conflict, Failed

__all__ = ["BACKUP", "recorded", "live_holds", "still_running", "hold", "release", "set_protected",
           "begin_delete", "why_kept", "mark_lost", "Kept"]

BACKUP = shape("backup record", id=str, vm=str, uuid=str, target=str, kind=str, disks=list,
               time=(int, float))
declare(keys.backup() + "*", BACKUP)

TRIES = 10


class Kept(Failed):
    """A backup that is protected, held by a running restore or being
    deleted refused what was asked of it; nothing was written."""


def recorded(store) -> list[dict]:
    """Every readable backup record."""
    return [value for value in (readable(kv) for kv in store.range(keys.backup())[0])
            if value is not None]


def _running(store, automation_id: str) -> bool:
    kv = store.get(keys.task(automation_id))
    if kv is None:
        return False
    task = readable(kv)
    return task is None or task.get("state", "running") == "running"


def still_running(store, automation_id: str) -> bool:
    """Whether automation ``automation_id`` may still be running (one that
    cannot be read counts as running; one whose record is gone does not)."""
    return _running(store, automation_id)


def live_holds(store, record: dict) -> list[str]:
    """The automations holding ``record`` that may still be running."""
    holds = record.get("holds")
    if not isinstance(holds, dict):
        return []
    return sorted(owner for owner in holds if _running(store, owner))


def _change(store, backup_id: str, change):
    """Write ``change(record)`` (None: write nothing) in a transaction
    guarded by the revision read; the record as left."""
    key = keys.backup(backup_id)
    for _ in range(TRIES):
        kv = store.get(key)
        record = readable(kv) if kv is not None else None
        if record is None:
            raise Failed(f"no backup {backup_id!r}" if kv is None else
                         f"backup {backup_id} is unreadable: scrub lists it")
        changed = change(record)
        if changed is None:
            return record
        if store.txn([modified_at(key, kv.mod_revision)], [Put(key, changed)]).succeeded:
            return changed
    raise Conflict("concurrent_update", f"backup {backup_id} kept changing: try again")


def mark_lost(store, backup_id: str, lost: dict) -> None:
    """The backup's data went with its host (``host remove``): its record
    stays, saying so in ``lost`` ``{host, time, why}``; gone already:
    nothing to say."""
    try:
        _change(store, backup_id, lambda record: None if record.get("lost")
                else {**record, "lost": lost})
    except Failed:
        pass


def hold(store, backup_ids: list[str], owner: str) -> None:
    """Mark each of ``backup_ids`` as read by restore ``owner`` (again:
    nothing new); one being deleted is :class:`Kept`, and the holds taken
    before it are released."""
    taken = []
    try:
        for backup_id in backup_ids:
            def held(record, backup_id=backup_id):
                if record.get("deleting"):
                    raise Kept(f"backup {backup_id} is being deleted")
                holds = record.get("holds") if isinstance(record.get("holds"), dict) else {}
                if owner in holds:
                    return None
                return {**record, "holds": {**holds, owner: time.time()}}
            _change(store, backup_id, held)
            taken.append(backup_id)
    except Failed:
        release(store, taken, owner)
        raise


def release(store, backup_ids: list[str], owner: str) -> None:
    """Drop ``owner``'s hold on each of ``backup_ids`` (gone already: fine),
    and every stale hold met on the way."""
    for backup_id in backup_ids:
        def released(record):
            holds = record.get("holds")
            if not isinstance(holds, dict) or not holds:
                return None
            left = {o: t for o, t in holds.items() if o != owner and _running(store, o)}
            return None if left == holds else {**record, "holds": left}
        try:
            _change(store, backup_id, released)
        except Failed:
            pass            # deleted, or unreadable: no hold to drop


def set_protected(store, backup_id: str, protected: bool) -> dict:
    """Protect or unprotect a backup; its record as left."""
    def flagged(record):
        if bool(record.get("protected")) == protected:
            return None
        if protected and record.get("deleting"):
            raise Kept(f"backup {backup_id} is being deleted: it cannot be protected")
        return {**record, "protected": protected}
    return _change(store, backup_id, flagged)


def why_kept(store, record: dict) -> str | None:
    """Why ``record`` may not be deleted now, or None."""
    if record.get("protected"):
        return (f"backup {record['id']} is protected: backup unprotect {record['id']} "
                "first")
    holders = live_holds(store, record)
    if holders:
        return f"backup {record['id']} is being read by restore {holders[0]}"
    return None


def begin_delete(store, backup_id: str) -> dict | None:
    """Mark the backup as being deleted, unless it is protected or held by
    a running restore (:class:`Kept`); its record, or None when gone."""
    def marked(record):
        if record.get("deleting"):
            return None
        why = why_kept(store, dict(record, id=backup_id))
        if why:
            raise Kept(why)
        return {**record, "deleting": True}
    try:
        return _change(store, backup_id, marked)
    except Kept:
        raise
    except Failed:
        if store.get(keys.backup(backup_id)) is None:
            return None
        raise
