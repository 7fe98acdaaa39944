"""Replication records, ``replicas/<uuid>``: one per replicated VM, carried
by one long-lived ``replicate`` automation (``automations/replicas.py``).

The record holds what the operator asked (``every``, ``to``, ``fallback``,
``stop``) and what the automation made: ``replica``, the last *complete*
replica ``{host, seq, time, checkpoint, pool, disks: [{dev, volume,
capacity}], pending}``, written by the replica's host only once its data
is whole there (``pending``: increments that arrived whole and are being
written into the disks; the replica is their sum), and ``last``, the last
attempt ``{time, kind, bytes, error}``.

Promises:

- :func:`put` writes the record and, in the same transaction, the
  automation when no running one carries the VM's replication; when one
  does, it is nudged and reads the record again;
- :func:`stop` marks the record ``stop``: the automation deletes the
  replica and then the record;
- :func:`vm_destroyed` wakes the automation of a VM just destroyed: it
  deletes the replica and the record now, not at its next update;
- :func:`change` is the one guarded read-modify-write every writer uses.
"""
from __future__ import annotations

import time

from engine.core import keys
from engine.core.store import Delete, Put, absent, modified_at
from engine.core.values import declare, readable, shape
from engine.errors import Conflict

__all__ = ["REPLICATION", "MIN_EVERY", "KIND", "FALLBACKS", "read", "read_all", "put", "stop",
           "vm_destroyed", "change", "check_every", "replica_id", "checkpoint_prefix", "is_running"]

REPLICATION = shape("replication record", uuid=str, vm=str, every=(int, float))
declare(keys.replica() + "*", REPLICATION)

MIN_EVERY = 10.0            # seconds between replica updates, at least
KIND = "replicate"
FALLBACKS = ("image",)      # what an HA restart may fall back to with no usable replica
CHECKPOINT_WORD = "replica"


def check_every(every) -> float:
    if not isinstance(every, (int, float)) or isinstance(every, bool) or every < MIN_EVERY:
        raise ValueError(f"a replica's interval must be at least {MIN_EVERY:g}s, got {every!r}")
    return float(every)


def replica_id(uuid: str, seq: int) -> str:
    """The id of update ``seq`` of a VM's replica: alphanumeric, as backup
    ids are, so that it names the update's scratch volumes and checkpoint
    (``peerctl-replica<uuid>n<seq>``) the way a backup id does."""
    return f"{CHECKPOINT_WORD}{uuid.replace('-', '')[:16]}n{int(seq)}"


def checkpoint_prefix() -> str:
    """What every replica update's id (and checkpoint name, after
    ``peerctl-``) starts with: backups leave such checkpoints alone."""
    return CHECKPOINT_WORD


def read(store, uuid: str) -> dict | None:
    return readable(store.get(keys.replica(uuid)))


def read_all(store) -> list[dict]:
    """Every readable record (an unreadable one is reported and skipped)."""
    return [value for value in (readable(kv) for kv in store.range(keys.replica())[0])
            if value is not None]


def is_running(store, automation_id) -> bool:
    if not automation_id:
        return False
    task = readable(store.get(keys.task(automation_id)))
    return task is not None and task.get("state") == "running"


def change(store, uuid: str, edit, tries: int = 10):
    """Read ``replicas/<uuid>`` and write ``edit(record)`` -> ``(answer,
    record, compares, ops)`` in one transaction guarded by what was read;
    again while someone else changes it meanwhile.  ``edit`` answers without
    writing by giving ``record`` None (and deletes it by giving ``False``)."""
    key = keys.replica(uuid)
    for _ in range(tries):
        kv = store.get(key)
        answer, record, compares, ops = edit(readable(kv) if kv is not None else None)
        if record is None:
            return answer
        guard = absent(key) if kv is None else modified_at(key, kv.mod_revision)
        writes = [Delete(key) if record is False else Put(key, record), *ops]
        if store.txn([guard, *compares], writes).succeeded:
            return answer
    raise Conflict(f"{key} kept changing under this write: try again")


def put(store, vm: dict, every: float, to: str | None, fallback: str | None,
        prefer: list[str] | None = None) -> dict:
    """Replicate ``vm`` (``{name, uuid}``) every ``every`` seconds to a host
    matching ``to``; its record.  A VM replicated already keeps its replica
    and changes its settings."""
    from engine.core import api     # here: listings read replicas, and need no engine
    every = check_every(every)
    if fallback not in (None, *FALLBACKS):
        raise ValueError(f"unknown fallback {fallback!r}")

    def edit(known):
        now = time.time()
        record = {**(known or {}), "uuid": vm["uuid"], "vm": vm["name"], "every": every,
                  "to": to, "fallback": fallback, "stop": False, "changed": now,
                  "created": (known or {}).get("created", now),
                  "replica": (known or {}).get("replica"), "last": (known or {}).get("last")}
        if is_running(store, record.get("automation")):
            return ("changed", record), record, [], []
        automation_id, compares, ops = api.automation_ops(store, KIND, {"uuid": vm["uuid"]},
                                                          prefer=prefer)
        record["automation"] = automation_id
        return ("started", record), record, compares, ops
    state, record = change(store, vm["uuid"], edit)
    if state == "changed":
        api.nudge(store, record["automation"], "replication changed")
    return {**record, "state": state}


def stop(store, uuid: str) -> dict | None:
    """Mark the replication of ``uuid`` to stop; its record, or None when
    it is not replicated."""
    from engine.core import api

    def edit(known):
        if known is None or known.get("stop"):
            return known, None, [], []
        record = {**known, "stop": True, "changed": time.time()}
        return record, record, [], []
    record = change(store, uuid, edit)
    if record is not None and record.get("automation"):
        api.nudge(store, record["automation"], "replication stopped")
    return record


def vm_destroyed(store, uuid: str) -> None:
    """A copy of VM ``uuid`` was destroyed on a host and its record
    deleted: when no host has a record of it left (not a move's source, a
    swept copy), wake the automation replicating it, if any, which deletes
    the replica and ends.  A wake-up lost to a crash here only delays that
    to the automation's next look."""
    from engine.core import api
    record = read(store, uuid)
    if record is None or not record.get("automation"):
        return
    held, _ = store.range(keys.vm(), keys_only=True)
    if not any(kv.key.endswith("/" + uuid) for kv in held):
        api.nudge(store, record["automation"], "the VM was destroyed")
