"""One automation at a time acts on a thing: named locks in etcd.

``locks/<name>`` holds ``{owner, why, time}``; the owner is an automation id.
A lock is not bound to a lease: the automation that holds it outlives any
one peer (another member resumes it), so it holds the lock until it
releases it or ends.

Promises:
- :func:`take` succeeds for one owner at a time, atomically (one
  transaction guarded by the lock's revision and the caller's extra
  conditions), and again for the owner that already holds it (a re-sent
  step);
- a lock whose owner has ended (terminal state, or gone) is stale and is
  taken over, so a crashed or aborted automation never blocks a thing for
  ever; unless its owner left it :func:`hold` for an operator, on purpose;
- :func:`release` drops only the caller's own lock, with the caller's
  extra operations in the same transaction;
- :func:`take_all` and :func:`release_all` do the same for many locks in one
  transaction, when nothing needs judging (none held yet; every one the
  caller's): else they write nothing and the caller goes lock by lock.  A
  lock taken in a batch holds the very value :func:`take` writes.
"""
from __future__ import annotations

import time

from engine.errors import Conflict

from . import keys
from .store import Delete, Get, Put, absent, modified_at
from .values import readable

__all__ = ["take", "take_all", "hold", "release", "release_all", "holder", "in_force"]


def holder(store, name: str) -> dict | None:
    """``{owner, why, time, state}`` of the lock's live holder, or None when
    nobody holds it (or only an automation that has ended)."""
    kv = store.get(keys.lock(name))
    lock = readable(kv)
    if lock is None:
        return None
    state = _state(store, lock["owner"])
    return None if state in keys.TERMINAL_STATES else {**lock, "state": state}


def in_force(store, name: str) -> bool:
    """Someone acts on the thing: its lock's owner is running, or left it
    held for an operator.  A lock that cannot be read counts as in force."""
    kv = store.get(keys.lock(name))
    if kv is None:
        return False
    lock = readable(kv)
    return lock is None or bool(lock.get("held")) \
        or _state(store, lock["owner"]) not in keys.TERMINAL_STATES


def _state(store, automation_id: str) -> str:
    status = readable(store.get(keys.status(automation_id)))
    return (status or {}).get("state", "done" if status is None else "running")


def take(store, name: str, owner: str, why: str, compares=(), *, force: bool = False,
         tries: int = 10, preempt: tuple = (), **extra) -> dict:
    """Hold lock ``name`` for automation ``owner`` (``extra``: more fields
    for readers of the lock).  Raises :class:`Conflict` (``reason``
    ``locked``) naming the live holder, (``held``) when an automation left it
    held for an operator (see :func:`hold`; ``force`` takes it all the same),
    or (``condition``) when ``compares`` failed.  A live holder whose
    ``kind`` is in ``preempt`` is taken over (its later steps find the lock
    gone)."""
    for _ in range(tries):
        kv = store.get(keys.lock(name))
        lock = readable(kv) if kv is not None else None
        if lock is not None and lock["owner"] == owner and not lock.get("held"):
            return lock
        if lock is not None and lock.get("held") and not force:
            raise Conflict("held", f"{lock.get('why') or 'held'} (automation {lock['owner']})")
        if lock is not None and not lock.get("held") and lock.get("kind") not in preempt \
                and _state(store, lock["owner"]) not in keys.TERMINAL_STATES:
            raise Conflict("locked", f"{lock.get('why') or 'busy'} (automation "
                                     f"{lock['owner']})")
        guard = absent(keys.lock(name)) if kv is None else modified_at(kv.key, kv.mod_revision)
        value = _value(owner, why, time.time(), extra)
        result = store.txn([guard, *compares], [Put(keys.lock(name), value)],
                           [Get(keys.lock(name))])
        if result.succeeded:
            return value
        now = result.ranges[0] if result.ranges else []
        if (now[0].mod_revision if now else 0) == (kv.mod_revision if kv else 0):
            raise Conflict("condition", "its condition does not hold")
    raise Conflict("concurrent_update", f"lock {name} kept changing")


def _value(owner: str, why: str, now: float, extra: dict) -> dict:
    """What a held lock holds: ``extra`` (more fields for its readers), then
    ``{owner, why, time}``."""
    return {**extra, "owner": owner, "why": why, "time": now}


def take_all(store, owner: str, why: str, wanted: dict[str, dict], compares=()) -> bool:
    """Hold every lock in ``wanted`` (name -> its ``extra`` fields, as
    :func:`take`'s) for ``owner``, in one transaction, when none of them
    exists and ``compares`` hold.  False, and nothing written, otherwise:
    the caller then takes each with :func:`take`, which tells a re-sent
    step, a stale lock and a live holder apart."""
    now = time.time()
    return store.txn([*(absent(keys.lock(name)) for name in wanted), *compares],
                     [Put(keys.lock(name), _value(owner, why, now, extra))
                      for name, extra in wanted.items()]).succeeded


def hold(store, name: str, owner: str, why: str, ops=()) -> bool:
    """Leave ``owner``'s lock held when it ends, for an operator: it is no
    longer stale once its owner has ended, only ``take(..., force=True)``
    takes it.  ``ops`` land in the same transaction."""
    kv = store.get(keys.lock(name))
    lock = readable(kv) if kv is not None else None
    if lock is None or lock["owner"] != owner:
        return False
    return store.txn([modified_at(kv.key, kv.mod_revision)],
                     [Put(kv.key, {**lock, "why": why, "held": True, "time": time.time()}),
                      *ops]).succeeded


def release(store, name: str, owner: str, ops=()) -> bool:
    """Drop ``owner``'s lock ``name`` and apply ``ops`` in the same
    transaction.  False (and nothing written) when ``owner`` does not hold
    it; ``ops`` are then applied on their own."""
    kv = store.get(keys.lock(name))
    lock = readable(kv) if kv is not None else None
    if lock is not None and lock["owner"] == owner:
        if store.txn([modified_at(kv.key, kv.mod_revision)],
                     [Delete(keys.lock(name)), *ops]).succeeded:
            return True
    if ops:
        store.txn([], list(ops))
    return False


def release_all(store, names: list[str], owner: str, ops=()) -> bool:
    """Drop every lock of ``names`` and apply ``ops``, in one transaction,
    when each is ``owner``'s and none is held for an operator.  False, and
    nothing written, otherwise (or when one changed meanwhile): the caller
    then releases each with :func:`release`."""
    ranges = store.txn([], [Get(keys.lock(name)) for name in names]).ranges
    now = [kvs[0] if kvs else None for kvs in ranges]
    for kv in now:
        lock = readable(kv) if kv is not None else None
        if lock is None or lock.get("owner") != owner or lock.get("held"):
            return False
    return store.txn([modified_at(kv.key, kv.mod_revision) for kv in now],
                     [*(Delete(keys.lock(name)) for name in names), *ops]).succeeded
