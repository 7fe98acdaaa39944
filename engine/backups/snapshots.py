"""Snapshot records, ``snapshots/<uuid>/<name>``: their shape, reading them,
and the one-line refusal other features give for a VM that has one.

A snapshot lives in the VM's qcow2 disks on the VM's host (an internal
snapshot, :mod:`engine.hypervisor.data.snapshots`); its record says so in etcd,
so that listing snapshots needs no hypervisor call.  The host writes the
record once libvirt has made the snapshot and deletes it once libvirt has
deleted it: a crash in between leaves a record without a snapshot, or a
snapshot without a record, that the same request run again finds and
settles (it is idempotent by uuid and name).  An unreadable record is
reported and skipped by every reader, never trusted.

Record: ``{vm, uuid, host, name, time, memory, state}`` (``time`` epoch
seconds; ``memory``: the guest's RAM is in it, a revert resumes the guest
where it was, else a revert boots the VM from the disks as they were;
``state``: the VM's state when it was taken).

No libvirt here: migration, backups and replicas ask :func:`refuse_if_snapshots`
before they start."""
from __future__ import annotations

import re

from engine.core import keys
from engine.core.values import declare, readable, shape
from engine.errors import RequestError

__all__ = ["SNAPSHOT", "NAME_RE", "MAX_NAME", "valid_name", "recorded", "snapshots_of",
           "refuse_if_snapshots", "record"]

SNAPSHOT = shape("snapshot record", vm=str, uuid=str, host=str, name=str,
                 time=(int, float), memory=bool)
declare(keys.snapshot() + "*", SNAPSHOT)

MAX_NAME = 64
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,%d}" % MAX_NAME)


def valid_name(name) -> bool:
    """A snapshot name: ``[A-Za-z0-9._-]``, 1 to 64 characters, not ``.``
    or ``..`` (it is a key's last part and a qcow2 snapshot tag)."""
    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None \
        and name not in (".", "..")


def record(vm: str, uuid: str, host: str, name: str, time: float, memory: bool,
           state: str) -> dict:
    """The record of one snapshot, as the host writes it."""
    return {"vm": vm, "uuid": uuid, "host": host, "name": name, "time": time,
            "memory": bool(memory), "state": state}


def recorded(store) -> list[dict]:
    """Every readable snapshot record (one range read)."""
    return [value for value in (readable(kv) for kv in store.range(keys.snapshot())[0])
            if value is not None]


def snapshots_of(store, uuid: str) -> list[dict]:
    """The readable snapshot records of VM ``uuid``, oldest first."""
    prefix = keys.snapshot(uuid, "")
    found = [value for value in (readable(kv) for kv in store.range(prefix)[0])
             if value is not None]
    return sorted(found, key=lambda r: (r["time"], r["name"]))


def refuse_if_snapshots(store, uuid: str, name: str, doing: str) -> None:
    """One line, nothing written, when VM ``name`` (``uuid``) has a
    snapshot: ``doing`` (``migrating it``) would not carry it."""
    found = snapshots_of(store, uuid)
    if found:
        snap = found[0]["name"]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise RequestError(f"VM {name!r} has snapshot {snap!r}{more}: {doing} would not "
                           f"carry it; delete it first (snapshot delete {name} {snap})")
