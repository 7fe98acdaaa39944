"""Backup records, ``backups/<id>``: their shape, and reading them.

A record is written once, by the target host, only when the backup's data
is complete there and its checksums verified
(:func:`engine.hypervisor.backups.verify`); it is deleted after the data
(:func:`engine.hypervisor.backups.delete`).  An unreadable record is
reported and skipped by every reader, never trusted."""
from __future__ import annotations

from engine.core import keys
from engine.core.values import declare, readable, shape

__all__ = ["BACKUP", "recorded"]

BACKUP = shape("backup record", id=str, vm=str, uuid=str, target=str, kind=str, disks=list,
               time=(int, float))
declare(keys.backup() + "*", BACKUP)


def recorded(store) -> list[dict]:
    """Every readable backup record."""
    return [value for value in (readable(kv) for kv in store.range(keys.backup())[0])
            if value is not None]
