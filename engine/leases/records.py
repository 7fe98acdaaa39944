"""Lease records in etcd, and what holding or freeing a lease writes.

Promises:
- :func:`read` / :func:`all_leases` skip unreadable records (reported once);
- :func:`update` is a read-modify-write guarded by the record's revision,
  retried on a lost race; it never resurrects a deleted record;
- :func:`hold` and :func:`free` are idempotent: a host lease's hosts get
  (or lose) the reserved and lease traits and their ``reserved/<host>``
  mark; a capacity lease's slots become (or stop being) allocations of its
  reservation consumer.  Repeating either after a crash finishes the job;
- :func:`release` frees everything a lease holds, drops its calendar
  entries, and leaves the record ``ended`` (or deletes it, ``forget``).
"""
from __future__ import annotations

import fnmatch

from engine.core import keys
from engine.core.store import Delete, Put, modified_at
from engine.core.values import readable
from engine.errors import Conflict, NotFound
from engine.placement.host import own_traits

from . import admission
from .model import CONSUMER_TYPE, LEASE_TRAIT_PREFIX, RESERVED_TRAIT, event, lease_trait

__all__ = ["read", "all_leases", "update", "lease_vms", "vms_by_lease", "reserved_hosts", "hold",
           "free", "release"]


def read(store, name: str) -> dict | None:
    return readable(store.get(keys.lease(name)))


def all_leases(store, pattern: str = "*") -> list[dict]:
    kvs, _ = store.range(keys.lease())
    found = [readable(kv) for kv in kvs]
    return sorted((r for r in found if r is not None and fnmatch.fnmatchcase(r["lease"], pattern)),
                  key=lambda r: (r["start"], r["lease"]))


def update(store, name: str, change, extra_ops=()) -> dict | None:
    """Apply ``change(record) -> record`` and write it (with ``extra_ops``)
    if the record did not change meanwhile; None when there is no record."""
    for _ in range(30):
        kv = store.get(keys.lease(name))
        record = readable(kv)
        if record is None:
            return None
        new = change(dict(record))
        if new == record and not extra_ops:
            return record
        if store.txn([modified_at(kv.key, kv.mod_revision)],
                     [Put(kv.key, new), *extra_ops]).succeeded:
            return new
    raise Conflict("concurrent_update", f"lease {name} kept changing")


def lease_vms(store, name: str) -> list[dict]:
    """The VMs booted into the lease that still exist: ``[{uuid, name,
    host, state}]`` (where the hosts' records place them)."""
    return vms_by_lease(store, name).get(name, [])


def vms_by_lease(store, name: str = "") -> dict[str, list[dict]]:
    """lease -> its VMs (as :func:`lease_vms`), for every lease or one, in
    two range reads whatever the number of leases."""
    prefix = keys.lease_vm(name)
    lease_of = {}
    for kv in store.range(prefix)[0]:
        mark = readable(kv)
        if mark is not None:
            lease_of[mark["uuid"]] = kv.key.split("/")[1]
    found: dict[str, list[dict]] = {}
    for kv in store.range(keys.vm())[0] if lease_of else ():
        vm = readable(kv)
        if vm is not None and vm["uuid"] in lease_of:
            found.setdefault(lease_of[vm["uuid"]], []).append(
                {"uuid": vm["uuid"], "name": vm["name"], "host": vm["host"], "state": vm["state"]})
    return {lease: sorted(vms, key=lambda v: v["name"]) for lease, vms in found.items()}


def reserved_hosts(store) -> dict[str, str]:
    """host -> the lease holding it now."""
    return {r["host"]: r["lease"] for r in (readable(kv) for kv in store.range(keys.reserved())[0])
            if r is not None}


def _traits(placement, host: str, lease: str | None) -> None:
    try:
        own_traits(placement, host, LEASE_TRAIT_PREFIX, [lease_trait(lease)] if lease else [])
        own_traits(placement, host, RESERVED_TRAIT, [RESERVED_TRAIT] if lease else [])
    except NotFound:
        pass        # no provider (a host gone for good): nothing to mark


def hold(store, placement, record: dict) -> dict:
    """Make the lease's reservation real; returns what could not be held
    (``{"short": n}`` slots for a capacity lease that no longer fits)."""
    name = record["lease"]
    if record["kind"] == "hosts":
        for host in record.get("hosts", []):
            store.put(keys.reserved(host), {"host": host, "lease": name})
            _traits(placement, host, name)
        return {}
    wanted = {}
    for host, count in sorted(record.get("slots", {}).items()):
        try:
            uuid = placement.provider(host)["uuid"]
        except NotFound:
            continue
        wanted[uuid] = {rc: n * count for rc, n in record["resources"].items()}
    held = placement.allocations(record["consumer"])["allocations"]
    if held:
        return {}       # held already (a repeat), perhaps less VMs took
    short = 0
    for _ in range(sum(record.get("slots", {}).values()) + 10):
        if not wanted:
            break
        try:
            placement.claim(record["consumer"], wanted, project="peerctl-lease",
                            user=name, consumer_type=CONSUMER_TYPE)
            break
        except Conflict as exc:
            if exc.reason != "capacity_exceeded":
                continue
            # Something grew since admission: hold what still fits, one slot less.
            rp = max(wanted, key=lambda u: sum(wanted[u].values()))
            less = {rc: n - record["resources"].get(rc, 0) for rc, n in wanted[rp].items()}
            short += 1
            if all(n <= 0 for n in less.values()):
                del wanted[rp]
            else:
                wanted[rp] = less
    store.txn([], admission.activate_ops(record))
    return {"short": short} if short else {}


def free(store, placement, record: dict) -> None:
    if record["kind"] == "hosts":
        for host in record.get("hosts", []):
            holder = readable(store.get(keys.reserved(host)))
            if holder is None or holder["lease"] == record["lease"]:
                _traits(placement, host, None)
                store.delete(keys.reserved(host))
    elif record.get("consumer"):
        placement.release(record["consumer"])


def release(store, placement, name: str, forget: bool = False) -> dict | None:
    """Free what the lease holds and its calendar entries; the record ends
    ``ended`` (deleted with its VM marks when ``forget``)."""
    record = read(store, name)
    if record is None:
        return None
    free(store, placement, record)
    drop = admission.release_ops(record)
    if forget:
        store.txn([], [*drop, Delete(keys.lease(name)), Delete(keys.lease_vm(name), prefix=True)])
        return {**record, "state": "ended", "deleted": True}
    return update(store, name, lambda r: event({**r, "state": "ended", "error": None}, "ended")
                  if r["state"] != "ended" else r, drop)
