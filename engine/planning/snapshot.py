"""The cluster as the planners see it, read from etcd and placement now.

:func:`read_cluster` reads, once each: placement's providers and every
consumer's allocations, the live hosts, drains, reserved hosts, the VM
records, their definitions (traits), groups, VM locks, leases' VMs and
``balance``'s holds; and gives a :class:`~engine.planning.model.Cluster`.

What each part becomes:
- a **host** is a placement root provider that is not a sharing provider;
  its capacity and usage of a class are the sums over its tree (a host's
  NUMA cells, devices), its traits the union of its tree's; it is closed
  when its peer is down, it is drained, or a lease holds it;
- a **VM** is a ``vms/`` record whose consumer holds allocations: its size
  is what it holds; its required and forbidden traits are those it was
  built with (``vmdef/``); it is ``stuck`` (never moved by a planner) when
  it is not running, paused or shut off, an automation acts on it, it is in
  a lease, it has snapshots (libvirt will not migrate it), it is in a
  ``together`` group (moved only as a group, which no planner does yet),
  or ``balance`` moved it less than ``hold`` seconds ago.
"""
from __future__ import annotations

import time

from engine.core import keys
from engine.core.hosts import live_host_names
from engine.core.store import Get
from engine.core.values import readable
from engine.placement.drains import drained_hosts
from engine.placement.groups import read_groups
from engine.placement.model import DISABLED_TRAIT, SHARING_TRAIT, capacity

from .model import Cluster, Host, Vm

__all__ = ["read_cluster", "read_hosts", "MOVABLE_STATES", "HOLD_SECONDS"]

MOVABLE_STATES = ("running", "paused", "shutoff")
HOLD_SECONDS = 3600.0        # default hold after a balance moved a VM (setting balance_hold)


def _hosts(providers: list[dict], live: set, drained: set, reserved: dict) -> dict:
    by_uuid = {p["uuid"]: p for p in providers}
    hosts = {}
    for p in providers:
        if p["uuid"] != p.get("root", p["uuid"]) or SHARING_TRAIT in p["traits"]:
            continue
        tree = [q for q in providers if q.get("root") == p["uuid"] and q["uuid"] in by_uuid]
        cap, used, traits = {}, {}, set()
        for q in tree:
            traits |= set(q["traits"])
            for rc, inv in q["inventories"].items():
                cap[rc] = cap.get(rc, 0) + capacity(inv)
                used[rc] = used.get(rc, 0) + q["usages"].get(rc, 0)
        name = p["name"]
        closed = ("down" if name not in live else
                  "drained" if name in drained or DISABLED_TRAIT in traits else
                  f"reserved by lease {reserved[name]}" if name in reserved else None)
        hosts[name] = Host(name, cap, used, frozenset(traits), closed is None, closed)
    return hosts


def _traits(build: dict) -> tuple[frozenset, frozenset]:
    text = (build or {}).get("required") or ""
    items = [t.strip() for t in text.split(",") if t.strip()]
    return (frozenset(t for t in items if not t.startswith("!")),
            frozenset(t[1:] for t in items if t.startswith("!")))


def _leased(kvs) -> dict:
    """Host -> the lease holding it, from ``reserved/`` entries."""
    held = {}
    for kv in kvs:
        value = readable(kv)
        if value is not None:
            held[value["host"]] = value.get("lease", "?")
    return held


def read_hosts(store, placement) -> Cluster:
    """The hosts now, and of the VMs only the groups' members (where they
    are, no sizes): what a boot's plan needs."""
    hosts = _hosts(placement.providers(), live_host_names(store), drained_hosts(store),
                   _leased(store.range(keys.reserved())[0]))
    vms: dict = {}
    groups = read_groups(store)
    rules = {name: next(iter(members.values()))["rule"] for name, members in groups.items()}
    _members_elsewhere(vms, groups)
    return Cluster(hosts, vms, rules)


def read_cluster(store, placement, *, hold: float = HOLD_SECONDS,
                 now: float | None = None) -> Cluster:
    """The cluster now (module docstring)."""
    from engine.cluster import read_vms
    from engine.core.locks import in_force
    now = time.time() if now is None else now
    providers = placement.providers()
    allocations = {a["consumer"]: a["allocations"] for a in placement.all_allocations()
                   if a["allocations"]}
    definitions, reserved_kvs, leased, balanced, snapshots, locks = store.txn([], [
        Get(keys.vm_definition(), True), Get(keys.reserved(), True),
        Get(keys.lease_vm(), True), Get(keys.balanced(), True),
        Get(keys.snapshot(), True), Get(keys.lock("vm/"), True)]).ranges
    locked = {keys.suffix(kv.key, keys.lock("vm/")) for kv in locks}
    hosts = _hosts(providers, live_host_names(store), drained_hosts(store),
                   _leased(reserved_kvs))
    root_of = {p["uuid"]: p.get("root", p["uuid"]) for p in providers}
    name_of = {p["uuid"]: p["name"] for p in providers}
    builds = {}
    for kv in definitions:
        value = readable(kv)
        if value is not None:
            builds[value["uuid"]] = value["build"]
    in_lease = {keys.suffix(kv.key, keys.lease_vm()).partition("/")[2]:
                keys.suffix(kv.key, keys.lease_vm()).partition("/")[0] for kv in leased}
    held_at = {}
    for kv in balanced:
        value = readable(kv)
        if isinstance(value, dict) and isinstance(value.get("time"), (int, float)):
            held_at[keys.suffix(kv.key, keys.balanced())] = value["time"]
    with_snapshots = {keys.suffix(kv.key, keys.snapshot()).partition("/")[0] for kv in snapshots}
    groups = read_groups(store)
    rules, group_of = {}, {}
    for name, members in groups.items():
        for uuid, member in members.items():
            rules.setdefault(name, member["rule"])
            group_of[uuid] = name
    vms = {}
    for record in read_vms(store):
        uuid = record["uuid"]
        held = allocations.get(uuid)
        if not held:
            continue
        size: dict = {}
        where = set()
        for rp, resources in held.items():
            where.add(name_of.get(root_of.get(rp)))
            for rc, n in resources.items():
                size[rc] = size.get(rc, 0) + n
        required, forbidden = _traits(builds.get(uuid))
        group = group_of.get(uuid)
        stuck = _stuck(record, where, group and rules.get(group), in_lease.get(uuid),
                       uuid in with_snapshots, held_at.get(uuid), hold, now,
                       uuid in locked and in_force(store, "vm/" + uuid))
        vms[uuid] = Vm(uuid, record["name"], record["host"], size, required, forbidden,
                       group, stuck)
    _members_elsewhere(vms, groups)
    return Cluster(hosts, vms, rules)


def _members_elsewhere(vms: dict, groups: dict) -> None:
    """Group members the VMs above do not show where they are held (a boot
    or a move under way): kept as sizeless, stuck VMs, so that a plan
    counts them for their group's rule."""
    for name, members in groups.items():
        for uuid, member in members.items():
            for where, suffix in ((member["host"], ""), (member.get("leaving"), "/leaving")):
                known = vms.get(uuid)
                if where and (known is None or known.host != where):
                    vms[uuid + (suffix or "/claimed")] = Vm(
                        uuid + (suffix or "/claimed"), member["name"], where, {}, group=name,
                        stuck="placed, not yet listed there")


def _stuck(record, where, rule, lease, snapshots, moved_at, hold, now,
           busy) -> str | None:
    if record["state"] not in MOVABLE_STATES:
        return f"it is {record['state']}"
    if where != {record["host"]}:
        return "its allocation is not where it is"
    if lease:
        return f"it is in lease {lease}"
    if snapshots:
        return "it has snapshots"
    if rule == "together":
        return "its group keeps it together"
    if moved_at is not None and now - moved_at < hold:
        return f"balance moved it {int(now - moved_at)} s ago (hold {int(hold)} s)"
    if busy:
        return "an automation acts on it"
    return None
