"""Where a VM's one record lives while an automation carries it from host
to host.

A VM exists, and belongs on host X, exactly while ``vms/X/<uuid>`` exists,
and it never has two records, at any etcd revision (docs/keyspace.md,
"Which VMs exist").  A move (its lock's kind ``migrate``) and an HA
restart (``recover``) are the automations that make a VM run on another
host; each carries the record in single transactions, with its lock:

- :func:`arrive`: the destination's request that makes the VM run there
  (a move's ``move_adopt``, an HA restart's ``build``) moves the record
  from where the lock says it is (``record_at``, else the lock's ``host``)
  to its own host, writes the new place into the lock and drops any
  ``disowned/`` mark of the VM on its host, in one transaction guarded by
  the lock and both records as read;
- :func:`release`: the automation's ``unlock_vm`` drops the lock and, in
  the same transaction, leaves the record where the outcome says: a
  confirmed move or restart (``drop_record``: the host it left) keeps it
  where it arrived; a reverted one (no ``drop_record``) carries it back to
  the lock's ``host``; a record that never left is never deleted.  A lock
  that is no longer the caller's (a re-sent unlock) writes nothing at all;
- :func:`leave`: ``destroy``, ``disown`` and the ghost sweep's
  ``keep_aside`` delete a host's record through it, which leaves the record
  alone while such a lock holds the VM: the unlock settles it.

So a reader (a listing, a recovery, ``lock_vm``) sees the VM in exactly
one place at every revision: where it ran before the move, then where it
arrived.
"""
from __future__ import annotations

import structlog

from engine.core import keys
from engine.core.store import Delete, Get, Put, absent, modified_at
from engine.core.values import readable
from engine.errors import StoreUnavailable

__all__ = ["CARRIED", "carries", "carried", "home_of", "arrive", "leave", "release",
           "release_all"]

log = structlog.get_logger("peerctl.vm_home")

CARRIED = ("migrate", "recover")    # lock kinds whose automation carries the record
_TRIES = 20


def _lock_key(uuid: str) -> str:
    return keys.lock(f"vm/{uuid}")


def _carrying(kv) -> dict | None:
    lock = readable(kv) if kv is not None else None
    return lock if lock is not None and lock.get("kind") in CARRIED else None


def home_of(lock: dict) -> str | None:
    """The host whose ``vms/`` key holds the VM's record, as its carrying
    lock says: where it arrived, else where it was locked."""
    return lock.get("record_at") or lock.get("host")


def carries(lock_kv) -> bool:
    """``lock_kv`` (a VM's lock as read, or None) is a move's or an HA
    restart's: the VM's record is theirs to settle."""
    return _carrying(lock_kv) is not None


def carried(store, uuid: str) -> bool:
    """A move or an HA restart holds the VM: its record is theirs to settle."""
    return carries(store.get(_lock_key(uuid)))


def _guard(key: str, kv):
    return modified_at(key, kv.mod_revision) if kv is not None else absent(key)


def leave(store, host: str, uuid: str, ops=()) -> bool:
    """Delete ``vms/<host>/<uuid>`` (the VM is no longer there for the
    cluster) with ``ops``, in one transaction that holds only while the
    VM's lock is as read; unless a move or an HA restart carries the VM:
    then ``ops`` alone, the record being its unlock's to settle.  True when
    the record's delete was part of the write."""
    lock_key = _lock_key(uuid)
    for _ in range(_TRIES):
        kv = store.get(lock_key)
        if carries(kv):
            if ops:
                store.txn([], list(ops))
            return False
        if store.txn([_guard(lock_key, kv)], [*ops, Delete(keys.vm(host, uuid))]).succeeded:
            return True
    raise StoreUnavailable(f"{lock_key}: changed {_TRIES} times in a row (concurrent writers)")


def arrive(store, host: str, uuid: str, make_record) -> bool:
    """Make ``vms/<host>/<uuid>`` the VM's one record, ``make_record(previous)``
    (``previous``: the record it had, or None).  Under a carrying lock whose
    home is another host, that host's record is deleted and the lock notes
    ``record_at: host`` in the same transaction; True.  False, writing
    nothing, when no carrying lock names another home: the caller writes
    the record the usual way."""
    lock_key, here = _lock_key(uuid), keys.vm(host, uuid)
    for _ in range(_TRIES):
        lock_kv, dst_kv = (kvs[0] if kvs else None
                           for kvs in store.txn([], [Get(lock_key), Get(here)]).ranges)
        lock = _carrying(lock_kv)
        home = home_of(lock) if lock is not None else None
        if not home or home == host:
            return False
        there = keys.vm(home, uuid)
        src_kv = store.get(there)
        previous = readable(src_kv) if src_kv is not None else None
        if previous is None and dst_kv is not None:
            previous = readable(dst_kv)
        record = make_record(previous)
        # A VM arriving here is no longer disowned here: an older automation's
        # mark would make this host's ghost sweep take the copy that is the VM.
        ops = [Put(here, record), Put(lock_key, {**lock, "record_at": host}),
               Delete(keys.disowned(host, uuid))]
        if src_kv is not None:
            ops.append(Delete(there))
        if store.txn([modified_at(lock_key, lock_kv.mod_revision), _guard(there, src_kv),
                      _guard(here, dst_kv)], ops).succeeded:
            log.info("vm_record_carried", uuid=uuid, frm=home, to=host,
                     automation=lock.get("owner"))
            return True
    raise StoreUnavailable(f"{here}: refused {_TRIES} times in a row (concurrent writers)")


def _settle(store, uuid: str, lock: dict, drop_record: str | None) -> tuple[list, list]:
    """(compares, ops) that leave the record where the ``lock``'s outcome
    says (see the module's docstring); a lock of another kind drops
    ``vms/<drop_record>/<uuid>``, as it always did.  Reads the store only to
    carry a record back (:func:`_carries_back`)."""
    if lock.get("kind") not in CARRIED:
        return [], [Delete(keys.vm(drop_record, uuid))] if drop_record else []
    arrived, origin = lock.get("record_at"), lock.get("host")
    if drop_record:
        if arrived and arrived != drop_record:
            return [], [Delete(keys.vm(drop_record, uuid))]     # absent: a no-op
        if arrived or origin == drop_record:
            log.warning("vm_record_kept", uuid=uuid, host=arrived or origin,
                        why="the automation confirmed a move the record never made")
        return [], []
    if not _carries_back(lock, drop_record):
        return [], []
    there, back = keys.vm(arrived, uuid), keys.vm(origin, uuid)
    kv = store.get(there)
    record = readable(kv) if kv is not None else None
    if record is None:
        return [], []
    return [modified_at(there, kv.mod_revision), absent(back)], \
        [Delete(there), Put(back, {**record, "host": origin})]


def _carries_back(lock: dict, drop_record: str | None) -> bool:
    """A reverted move or restart whose record had arrived elsewhere."""
    arrived, origin = lock.get("record_at"), lock.get("host")
    return lock.get("kind") in CARRIED and not drop_record and bool(arrived) \
        and bool(origin) and arrived != origin


def release(store, uuid: str, owner: str, drop_record: str | None = None) -> bool:
    """Drop ``owner``'s lock of the VM, with what its outcome asks of the
    record (:func:`_settle`), in one transaction.  False, writing nothing,
    when ``owner`` does not hold the lock."""
    lock_key = _lock_key(uuid)
    for _ in range(_TRIES):
        kv = store.get(lock_key)
        lock = readable(kv) if kv is not None else None
        if lock is None or lock.get("owner") != owner:
            return False
        compares, ops = _settle(store, uuid, lock, drop_record)
        if store.txn([modified_at(lock_key, kv.mod_revision), *compares],
                     [Delete(lock_key), *ops]).succeeded:
            return True
    raise StoreUnavailable(f"{lock_key}: refused {_TRIES} times in a row (concurrent writers)")


def release_all(store, owner: str, drops: dict[str, str | None]) -> bool:
    """:func:`release` for each VM of ``drops`` (uuid -> its ``drop_record``)
    in one transaction, when every lock is ``owner``'s, none is held for an
    operator and none needs its record carried back (a reverted move: read
    first).  False, and nothing written, otherwise: the caller then
    releases each with :func:`release`."""
    uuids = list(drops)
    ranges = store.txn([], [Get(_lock_key(uuid)) for uuid in uuids]).ranges
    compares, ops = [], []
    for uuid, kvs in zip(uuids, ranges):
        kv = kvs[0] if kvs else None
        lock = readable(kv) if kv is not None else None
        if lock is None or lock.get("owner") != owner or lock.get("held"):
            return False
        if _carries_back(lock, drops[uuid]):
            return False
        _, settled = _settle(store, uuid, lock, drops[uuid])     # no read: nothing carried back
        compares.append(modified_at(kv.key, kv.mod_revision))
        ops += [*settled, Delete(kv.key)]
    return store.txn(compares, ops).succeeded
