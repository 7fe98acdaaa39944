"""Reconciling: placement, ``vms/`` and the hypervisors made to agree.

Two halves.

The cluster half, :func:`reconcile_once`, runs on one peer at a time (the
``reconciler`` singleton):

- an allocation whose consumer nobody holds is an orphan: left behind by an
  automation that was aborted between claim and build, or by a host that
  vanished with its VMs.  Who may hold a consumer is written in one place,
  :func:`held_consumers` (a VM's record in any state, a live lease's
  reservation and its VMs, what a running automation names, a locked VM);
  everything else is released once it has been seen orphaned on two passes
  in a row (a VM that was just built may not be published yet);
- a ``vms/<host>/<uuid>`` record of a dead host (no ``hosts/<host>``) whose
  VM was disowned there or is allocated on another host, and which has a
  record on another host too, is a ghost (a duplicate a peer older than
  the one-record rule left; docs/keyspace.md): it is deleted.  A VM's only
  record is never deleted here, nor one of a VM an automation holds: it is
  the VM's existence (allocations move before records do);
- a VM definition (``vmdef/<uuid>``) whose VM has no allocation and is
  held by nobody (the same list), on two passes in a row, is deleted; so
  is a group's member (``groups/<name>/<uuid>``, ``groupof/<uuid>``):
  a destroyed VM leaves its group;
- VMs without allocations are reported (``reconcile/report``), not touched:
  they may be someone's VM started by hand.

Every write of a pass carries the election's fence: a reconciler deposed
mid-pass (lease expired while it was paused) has its releases refused by
etcd and stops with :class:`Deposed`.

The host half, :func:`sweep_ghosts`, runs on every peer, at start and
periodically, against its own hypervisor: it destroys (undefine, volumes,
console log) each of its peerctl domains that the cluster placed elsewhere,
which is how a host whose build was reported ``lost`` (SIGKILLed peer, but
libvirtd and the domain lived on) drops the copy when it comes back:

- the VM is disowned on this host (``disowned/<host>/<uuid>``, written by
  ``boot`` before it took an alternate, or by an HA restart elsewhere: that
  mark says ``keep``, and the copy's disks are kept aside instead of
  deleted, see :mod:`engine.hypervisor.host.aside`), or
- its allocation is held on other providers only, no running automation
  names it (a migration in flight names it) and it is not locked (a move
  whose outcome nobody could tell leaves its lock held, both copies kept).
  Nothing then says this copy was given up, and it may be the only one (an
  etcd restored from a snapshot older than the VM's last move places it
  where it was): a running copy is left alone and reported once
  (``ghost_vm_running_left_alone``), a stopped one has its disks kept
  aside, never deleted.

A mark beside this host's own ``vms/`` record of the VM (no move or
restart carrying it) is stale, left by an automation older than the VM's
return here: it is dropped and the VM left alone.  A peerctl domain
without any allocation is left alone (reported by the cluster half).  A ``disowned/`` mark is dropped once this host holds no such
domain and the automation that wrote it has finished.
"""
from __future__ import annotations

import os
import threading
import time

import libvirt
import structlog

from engine.core import keys
from engine.core.hosts import live_host_names
from engine.core.store import Delete, Put, Store
from engine.core.values import readable
from engine.errors import Deposed, RequestError, StoreUnavailable
from engine.placement.groups import leave_ops
from engine.hypervisor.domain import shapes  # noqa: F401  (declares vms/, disowned/)
from engine.hypervisor.host import vm as lifecycle
from engine.hypervisor.domain.lookup import find_domain
from engine.hypervisor.host.aside import keep_aside
from engine.hypervisor.domain.records import owned_by
from engine.hypervisor.host.vm_home import carried

__all__ = ["reconciler", "reconcile_once", "held_consumers", "sweep_ghosts",
           "DEFAULT_INTERVAL", "GHOST_INTERVAL"]

log = structlog.get_logger("peerctl.reconciler")

DEFAULT_INTERVAL = float(os.environ.get("PEERCTL_RECONCILE_INTERVAL", "30"))
GHOST_INTERVAL = float(os.environ.get("PEERCTL_GHOST_INTERVAL", "30"))
_BATCH = 64



class _FencedStore:
    """A store whose every transaction is ``candidacy``'s (fenced, see
    :meth:`~engine.core.election.Candidacy.txn`), so that a placement backend
    writing through it writes only while the candidacy leads, and raises
    :class:`Deposed` instead of retrying a refusal as a lost race."""

    def __init__(self, store: Store, candidacy):
        self._store = store
        self._candidacy = candidacy

    def __getattr__(self, name):
        return getattr(self._store, name)

    def txn(self, compares, success=(), failure=()):
        return self._candidacy.txn(compares, success, failure)


def _fenced_writer(placement, fence):
    """The placement to release through: fenced on the etcd backend."""
    if fence is None:
        return placement
    from engine.placement.etcd import EtcdPlacement
    if isinstance(placement, EtcdPlacement):
        return EtcdPlacement(_FencedStore(placement.store, fence))
    return None     # another backend cannot carry an etcd compare: check first


def _running(store: Store, automation_id) -> bool:
    if not automation_id:
        return False
    kv = store.get(keys.task(automation_id))
    return kv is not None and (readable(kv) or {}).get("state", "running") == "running"


def _referenced_consumers(store: Store) -> set[str]:
    """Consumers and VM uuids named by the steps of running automations.
    An automation whose summary cannot be read counts as running, and what
    cannot be read of it names nothing: releasing less is the safe side."""
    named = set()
    tasks, _ = store.range(keys.task())
    for kv in tasks:
        if (readable(kv) or {}).get("state", "running") != "running":
            continue
        automation_id = keys.suffix(kv.key, keys.task())
        spec = readable(store.get(keys.spec(automation_id))) or {}
        for vm in (spec.get("args") or {}).get("vms", []):
            if isinstance(vm, dict) and vm.get("uuid"):
                named.add(vm["uuid"])
        entries, _ = store.range(keys.auto(automation_id, "log/"))
        for entry in entries:
            args = (readable(entry) or {}).get("args") or {}
            if not isinstance(args, dict):
                continue
            for field in ("consumer", "uuid"):
                if isinstance(args.get(field), str):
                    named.add(args[field])
    return named


def _locked_vms(store: Store) -> set[str]:
    """VMs an automation acts on, or that a failed move left held for an
    operator (``locks/vm/<uuid>``): no sweep destroys a copy of those."""
    prefix = keys.lock("vm/")
    return {keys.suffix(kv.key, prefix) for kv in store.range(prefix, keys_only=True)[0]}


def _live_leases(store) -> tuple[dict, set[str]]:
    """``({lease: reservation consumer or None}, names of unreadable records)``
    for every lease not ended.  Read through the keys, not the lease room:
    the hypervisor and the leases are sibling rooms (a lease record's
    ``state`` and ``consumer`` are its promises, docs/leases.md)."""
    live, unread = {}, set()
    for kv in store.range(keys.lease())[0]:
        name = keys.suffix(kv.key, keys.lease())
        record = readable(kv)
        if record is None:
            unread.add(name)
        elif record.get("state") != "ended":
            consumer = record.get("consumer")
            live[name] = consumer if isinstance(consumer, str) else None
    return live, unread


def held_consumers(store: Store, allocations: dict | None = None) -> set[str]:
    """Every placement consumer that is legitimately held: the one list the
    reconciler works from; what is in none of these kinds, on two passes in
    a row, is an orphan and released.

    1. **A VM with a record**: ``vms/<host>/<uuid>``, in any state
       (``running``, ``shutoff``, ``missing``, ``unknown``, ...), readable or
       not (its key names it).  Ghost records are deleted before this is
       read, so they do not count.
    2. **A capacity lease's reservation consumer** (the ``consumer`` of
       ``leases/<name>``) while the lease's record exists and is not
       ``ended``: pending, active, degraded, ending or in error.  A lease
       record that cannot be read holds every consumer whose placement
       ``user`` names it (its reservation and its VMs' claims; from
       ``allocations``, as the pass read them).
    3. **A lease's VMs** (``leasevm/<lease>/<uuid>``) while that lease's
       record exists and is not ``ended`` (or cannot be read): a VM booted
       into it, from its claim on, built or not yet.
    4. **Whatever a running automation names**: the ``vms`` of its spec and
       the ``consumer`` and ``uuid`` of its steps: a boot between claim and
       publish, a migration consumer (``claim_move``), a recovery consumer,
       a release or a lease step in flight.  An automation whose summary
       cannot be read counts as running.
    5. **A locked VM** (``locks/vm/<uuid>``): one automation acts on it, or a
       move whose outcome nobody could tell left it held for an operator.
    """
    held = {kv.key.rsplit("/", 1)[-1] for kv in store.range(keys.vm(), keys_only=True)[0]}
    live, unread = _live_leases(store)
    held.update(consumer for consumer in live.values() if consumer)
    if unread:
        held.update(c for c, doc in (allocations or {}).items() if doc.get("user") in unread)
    for kv in store.range(keys.lease_vm(), keys_only=True)[0]:
        lease, _, uuid = keys.suffix(kv.key, keys.lease_vm()).partition("/")
        if uuid and (lease in live or lease in unread):
            held.add(uuid)
    held |= _referenced_consumers(store)
    held |= _locked_vms(store)
    return held


def _ghost_records(store: Store, placement, vms, allocations) -> list:
    """``vms/`` records of dead hosts whose VM belongs elsewhere and has a
    record there (a duplicate), unless an automation holds the VM."""
    live = live_host_names(store)
    dead = [kv for kv in vms if kv.value["host"] not in live]
    if not dead:
        return []
    hosts_of: dict[str, set] = {}
    for kv in vms:
        hosts_of.setdefault(kv.value["uuid"], set()).add(kv.value["host"])
    dead = [kv for kv in dead if len(hosts_of[kv.value["uuid"]]) > 1]
    if not dead:
        return []
    locked = _locked_vms(store)
    dead = [kv for kv in dead if kv.value["uuid"] not in locked]
    disowned = {tuple(keys.suffix(kv.key, keys.disowned()).split("/", 1))
                for kv in store.range(keys.disowned())[0] if readable(kv) is not None}
    names = {rp["uuid"]: rp["name"] for rp in placement.providers()}
    ghosts = []
    for kv in dead:
        host, uuid = kv.value["host"], kv.value["uuid"]
        held_on = {names.get(rp) for rp in allocations.get(uuid, {}).get("allocations", {})}
        if (host, uuid) in disowned or (held_on and host not in held_on):
            ghosts.append(kv)
    return ghosts


def reconcile_once(store: Store, placement, suspects: set[str], fence=None,
                   host: str | None = None) -> dict:
    """One pass; ``suspects`` carries orphans seen on the previous pass.
    ``fence``: the reconciler's :class:`~engine.core.election.Candidacy`; every
    write then carries it, and a deposed reconciler raises :class:`Deposed`
    having released nothing."""
    allocations = {a["consumer"]: a for a in placement.all_allocations() if a["allocations"]}
    records, _ = store.range(keys.vm())
    vms = [kv for kv in records if readable(kv) is not None]
    ghosts = _ghost_records(store, placement, vms, allocations)
    ghost_keys = {kv.key for kv in ghosts}
    txn = fence.txn if fence is not None else store.txn
    for start in range(0, len(ghosts), _BATCH):
        batch = ghosts[start:start + _BATCH]
        txn([], [Delete(kv.key) for kv in batch])
        for kv in batch:
            log.warning("ghost_vm_record_deleted", host=kv.value["host"], uuid=kv.value["uuid"],
                        vm=kv.value.get("name"))
    vms = [kv for kv in vms if kv.key not in ghost_keys]
    held = held_consumers(store, allocations)
    orphans = {c for c in allocations if c not in held}
    released = sorted(orphans & suspects)
    writer = _fenced_writer(placement, fence)
    for consumer in released:
        if writer is None:
            if not fence.is_leader():
                raise Deposed("no longer the reconciler")
            placement.release(consumer)
        else:
            writer.release(consumer)
        log.warning("orphan_allocation_released", consumer=consumer,
                    allocations=allocations[consumer]["allocations"])
    # A VM's definition outlives it by two passes: no record, no allocation,
    # no running automation naming it (the same rule as for orphans).
    defined = {keys.suffix(kv.key, keys.vm_definition())
               for kv in store.range(keys.vm_definition(), keys_only=True)[0]}
    undefined = {f"vmdef:{u}" for u in defined if u not in allocations and u not in held}
    forgotten = sorted(undefined & suspects)
    for start in range(0, len(forgotten), _BATCH):
        batch = [mark.split(":", 1)[1] for mark in forgotten[start:start + _BATCH]]
        txn([], [Delete(keys.vm_definition(uuid)) for uuid in batch])
        for uuid in batch:
            log.warning("vm_definition_forgotten", uuid=uuid)
    # A group's member outlives its VM by two passes, by the same rule.
    members = [readable(kv) for kv in store.range(keys.group())[0]]
    gone = {f"group:{m['group']}/{m['uuid']}" for m in members
            if m is not None and m["uuid"] not in allocations and m["uuid"] not in held}
    left = sorted(gone & suspects)
    for start in range(0, len(left), _BATCH // 2):
        batch = [mark.split(":", 1)[1].split("/") for mark in left[start:start + _BATCH // 2]]
        txn([], [op for group, uuid in batch for op in leave_ops(group, uuid)])
        for group, uuid in batch:
            log.warning("group_member_forgotten", group=group, uuid=uuid)
    unallocated = sorted(f"{kv.value['host']}/{kv.value['name']}" for kv in vms
                         if kv.value["uuid"] not in allocations)
    for vm in unallocated:
        log.info("vm_without_allocation", vm=vm)
    report = {"time": time.time(), "released": released, "unallocated_vms": unallocated,
              "suspects": sorted(orphans - set(released)),
              "ghost_records": sorted(kv.key for kv in ghosts),
              "host": host}
    txn([], [Put(keys.RECONCILE_REPORT, report)])
    suspects.clear()
    suspects.update(orphans - set(released), undefined - set(forgotten), gone - set(left))
    return report


def reconciler(store: Store, interval: float | None = None, host: str | None = None):
    interval = DEFAULT_INTERVAL if interval is None else interval

    def duty(stop: threading.Event, candidacy):
        from engine.placement import open_placement
        placement = open_placement(None, store)
        suspects: set[str] = set()
        try:
            while not stop.wait(interval):
                try:
                    reconcile_once(store, placement, suspects, fence=candidacy, host=host)
                except Deposed as exc:
                    log.warning("reconciler_deposed", host=host, error=str(exc))
                    return
                except StoreUnavailable as exc:
                    log.warning("reconcile_unavailable", error=str(exc))
                except Exception:
                    log.exception("reconcile_failed")
        finally:
            placement.close()
    return duty


_reported: set[tuple[str, str]] = set()     # (host, uuid) said left alone, once a process


def _running_here(host, uuid: str) -> bool:
    """Whether this host's copy of ``uuid`` runs; a libvirt that fails to
    say raises (the sweep tries again), never "not running", which would
    set a running copy aside."""
    dom = find_domain(host, uuid)
    return dom is not None and dom.isActive() == 1


def _report_once(host_name: str, uuid: str) -> None:
    if (host_name, uuid) not in _reported:
        _reported.add((host_name, uuid))
        log.warning("ghost_vm_running_left_alone", host=host_name, uuid=uuid,
                    why="allocated on another host, and nothing says this copy was given up "
                        "(etcd restored from an older snapshot?): docs/deploy.md")


def sweep_ghosts(store: Store, host, placement=None) -> list[str]:
    """Destroy ``host``'s (a :class:`~engine.hypervisor.host.hostctx.HostContext`) copies of
    VMs the cluster placed elsewhere; returns their uuids.  See the module
    docstring for the rules."""
    prefix = keys.disowned(host.host)
    # An unreadable mark destroys nothing: it is left for ``peerctl scrub``.
    marks = {kv.key[len(prefix):]: kv.value for kv in store.range(prefix)[0]
             if readable(kv) is not None}
    domains = set()
    for dom in host.conn.listAllDomains(0):
        try:
            if owned_by(dom, host.host):
                domains.add(dom.UUIDString())
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
    # A mark beside this host's own record of the VM, which no move or
    # restart carries, is stale: the VM came back here since (its record
    # is its existence, docs/keyspace.md).  The mark goes, the VM stays.
    for uuid in [u for u in marks if store.get(keys.vm(host.host, u)) is not None
                 and not carried(store, u)]:
        log.warning("stale_disowned_mark", host=host.host, uuid=uuid,
                    automation=marks.pop(uuid).get("automation"))
        store.delete(prefix + uuid)
    # Every mark, with a domain here or not: a move that died here may have
    # left only volumes (libvirt drops an incoming domain whose copy failed).
    ghosts = {uuid: f"disowned by automation {marks[uuid].get('automation')}"
              for uuid in marks}
    marks_for_aside: dict[str, dict] = {}
    rest = domains - set(marks)
    if rest:
        from engine.placement import open_placement
        from engine.placement.model import NotFound
        own = placement is None
        placement = placement or open_placement(None, store)
        try:
            mine = placement.provider(host.host)["uuid"]
            held = {a["consumer"]: a["allocations"] for a in placement.all_allocations()
                    if a["allocations"] and a["consumer"] in rest}
        except NotFound:
            held, mine = {}, None
        finally:
            if own:
                placement.close()
        elsewhere = {uuid for uuid, allocations in held.items() if mine not in allocations}
        if elsewhere:
            busy = _referenced_consumers(store) | _locked_vms(store)
            ghosts.update({uuid: "allocated on another host" for uuid in elsewhere - busy})
    failed = set()
    for uuid in [u for u in ghosts if u not in marks]:
        # Allocated elsewhere, and nothing says this copy was given up: it
        # may be the only one (an etcd restored from a snapshot older than
        # the VM's last move places it where it was).  Running, it is left
        # alone and reported; stopped, its disks are kept aside.
        if _running_here(host, uuid):
            del ghosts[uuid]
            _report_once(host.host, uuid)
        else:
            marks_for_aside[uuid] = {"time": time.time()}
    for uuid, why in sorted(ghosts.items()):
        try:
            if marks.get(uuid, {}).get("keep") or uuid in marks_for_aside:
                # Restarted elsewhere from its image: this copy's disks may
                # hold data someone needs.
                keep_aside(host, uuid, marks.get(uuid) or marks_for_aside[uuid])
                log.warning("ghost_vm_kept_aside", host=host.host, uuid=uuid, why=why)
            else:
                lifecycle.destroy(host, {"uuid": uuid})
                log.warning("ghost_vm_destroyed", host=host.host, uuid=uuid, why=why)
        except (RequestError, libvirt.libvirtError, OSError) as exc:
            failed.add(uuid)
            log.error("ghost_vm_not_destroyed", host=host.host, uuid=uuid, why=why,
                      error=str(exc))
    for uuid, mark in marks.items():
        if uuid not in failed and not _running(store, mark.get("automation")):
            store.delete(prefix + uuid)     # done with: no copy here, no boot left
    return sorted(set(ghosts) - failed)
