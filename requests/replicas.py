"""The requests of replication (``automations/replicas.py``) and of HA
restarts from a replica (``automations/ha.py``).

On hosts, from :mod:`engine.hypervisor.data.replicas`: ``replica_store``,
``replica_apply``, ``replica_drop`` and ``replica_promote`` (the replica's
host), ``replica_take``, ``replica_take_delta`` and ``replica_prune`` (the VM's
host), ``replica_base_map`` (the replica's host, from
:mod:`engine.hypervisor.data.replica_delta`),
``replica_discard`` (either); from :mod:`engine.hypervisor.moves.handoff`, a
migration to the replica's host: ``handoff_take`` (the VM's host) and
``handoff_prepare`` (the replica's).

Run by the initiator (no target), reading and writing ``replicas/<uuid>``:

- ``replica_plan`` ``{uuid, owner}`` -> ``{state, ...}``: ``gone`` (no
  record) or ``ended`` (another automation carries it); ``stop`` (with the
  ``replica`` to delete, the VM destroyed or ``--stop`` asked); ``wait``
  until ``next`` (with ``why`` when an update is due but cannot run: the
  VM's host is down, so nothing is copied from a stale source, or no other
  host can keep it); ``update``: ``{vm, seq, candidates, parent, why_full,
  expect, old}``, the hosts that may keep it (the replica's host first, then
  live, undrained hosts matching ``to``, never the VM's own), the parent to
  start from when the replica's host is first, and the replica as the plan
  saw it (the record moves on only from that one);
- ``replica_noted`` ``{uuid, owner, attempt}``: ``last`` becomes
  ``attempt`` ``{time, kind, bytes, error}``;
- ``replica_ended`` ``{uuid, owner}``: a stopped record is deleted;
- ``replica_continue`` ``{uuid, owner}`` -> ``{automation}``: a new
  automation carries the replication, swapped in with its creation;
- ``replica_of`` ``{uuid}`` -> ``{replicated, replica, usable, why,
  fallback, next_seq}`` for an HA restart or a migration.
"""
from __future__ import annotations

import fnmatch
import time

from engine.backups import replicas as records
from engine.cluster import read_vms
from engine.core import api, keys, locks
from engine.core.values import readable
from engine.core.handlers import handler
from engine.core.hosts import live_host_names
from engine.placement.drains import drained_hosts
from engine.errors import RequestError
from engine.hypervisor.moves import handoff
from engine.hypervisor.data import replica_delta, replicas
from engine.natural import natural_key

MOVING_RECHECK = 2.0     # seconds: a VM a move holds, listed nowhere, is looked at again
ASIDE_WAIT = 600.0       # seconds after a disown its host may take to put the copy aside

handler("replica_store")(replicas.prepare)
handler("replica_take")(replicas.take)
handler("replica_base_map")(replica_delta.base_map)
handler("replica_take_delta")(replica_delta.take)
handler("replica_apply")(replicas.apply)
handler("replica_prune")(replicas.prune)
handler("replica_discard")(replicas.discard)
handler("replica_drop")(replicas.drop)
handler("replica_promote")(replicas.promote)
handler("handoff_take")(handoff.take)
handler("handoff_prepare")(handoff.prepare)


def _uuid(args: dict) -> str:
    value = args.get("uuid")
    if not isinstance(value, str) or not value:
        raise RequestError("a replica request needs the VM's uuid")
    return value


def _vm(store, uuid: str) -> dict | None:
    return next((vm for vm in read_vms(store) if vm["uuid"] == uuid), None)


def _moving(store, uuid: str) -> bool:
    """A move or an HA restart of the VM is in flight (its lock)."""
    lock = locks.holder(store, f"vm/{uuid}")
    return lock is not None and lock.get("kind") in ("migrate", "recover")


@handler("replica_plan")
def replica_plan(host, args: dict) -> dict:
    uuid, owner = _uuid(args), args.get("owner")
    record = records.read(host.store, uuid)
    if record is None:
        return {"state": "gone"}
    if record.get("automation") != owner:
        return {"state": "ended", "automation": record.get("automation")}
    replica = record.get("replica")
    vm = _vm(host.store, uuid)
    if vm is None and not record.get("stop") and _moving(host.store, uuid):
        # Between a move's cleanup of the source and its unlock, the VM is
        # listed nowhere: it is not gone, look again shortly.
        return {"state": "wait", "next": time.time() + MOVING_RECHECK}
    if record.get("stop") or vm is None:
        return {"state": "stop", "replica": replica,
                "why": "asked to stop" if record.get("stop") else "the VM is gone"}
    now = time.time()
    last = record.get("last") or {}
    due = float(last.get("time") or 0) + float(record["every"])
    if now < due:
        return {"state": "wait", "next": due}
    alive, drained = live_host_names(host.store), drained_hosts(host.store)
    later = now + float(record["every"])
    if vm["host"] not in alive or vm.get("state") in ("unknown", "missing"):
        return {"state": "wait", "next": later,
                "why": f"its host {vm['host']} is down: nothing is copied from a stale source"
                if vm["host"] not in alive else f"it is {vm.get('state')} on {vm['host']}"}
    pattern = record.get("to") or "*"
    eligible = sorted((name for name in alive if name != vm["host"] and name not in drained
                       and fnmatch.fnmatchcase(name, pattern)), key=natural_key)
    if not eligible:
        return {"state": "wait", "next": later,
                "why": "no host to keep its replica: none but its own is up and undrained"
                + (f" and matches {pattern!r}" if record.get("to") else "")}
    if any(_putting_aside(host.store, name, uuid, now) for name in eligible):
        # its disks will be a base the next update sends only differences from
        return {"state": "wait", "next": now + MOVING_RECHECK}
    parent, why_full, base = None, None, None
    aside = None if replica and replica["host"] in eligible else _kept_aside(host.store,
                                                                              eligible, uuid)
    frozen = record.get("kept")
    if aside is not None:
        eligible.remove(aside["host"])
        eligible.insert(0, aside["host"])
        base = {"kind": "aside", "id": aside["id"],
                "what": f"the disks kept aside on {aside['host']}"}
    elif not replica and frozen and frozen.get("host") in eligible:
        eligible.remove(frozen["host"])
        eligible.insert(0, frozen["host"])
        base = {"kind": "kept", "what": f"the disk a move left on {frozen['host']}"}
    if replica and replica["host"] in eligible:
        eligible.remove(replica["host"])
        eligible.insert(0, replica["host"])
        parent = {"id": records.replica_id(uuid, replica["seq"]),
                  "checkpoint": replica.get("checkpoint"), "time": replica.get("time"),
                  "what": f"replica update {replica['seq']}"}
        base = {"kind": "replica", "what": f"replica update {replica['seq']}"}
    elif replica:
        why = "down" if replica["host"] not in alive else "drained" \
            if replica["host"] in drained else "the VM's own host now" \
            if replica["host"] == vm["host"] else "not in --to"
        why_full = f"a new replica: the last one's host {replica['host']} is {why}"
    elif record.get("consumed"):
        why_full = (f"a new replica: the last one became the VM's disks on "
                    f"{record['consumed']['host']} (an HA restart or a move onto it)")
    else:
        why_full = "the VM's first replica"
    seq = int(record.get("seq") or 0) + 1
    return {"state": "update", "vm": {k: vm[k] for k in ("name", "uuid", "host", "state")},
            "seq": seq, "candidates": eligible, "parent": parent, "why_full": why_full,
            "base": base,
            "expect": {"host": replica["host"], "seq": replica["seq"]} if replica else None,
            "old": replica["host"] if replica and replica["host"] != eligible[0] else None,
            "frozen_on": frozen["host"] if frozen and frozen.get("host") != eligible[0]
            else None}


def _putting_aside(store, name: str, uuid: str, now: float) -> bool:
    """``name`` runs or is about to put aside a stale copy of the VM (a
    fresh disowned mark): its disks are about to become a base."""
    mark = readable(store.get(keys.disowned(name, uuid)))
    return isinstance(mark, dict) and now - float(mark.get("time") or 0) < ASIDE_WAIT


def _kept_aside(store, hosts: list[str], uuid: str) -> dict | None:
    """The newest disks of the VM kept aside on one of ``hosts``."""
    found = [record for name in hosts
             for record in (readable(kv) for kv in store.range(keys.aside(name))[0])
             if isinstance(record, dict) and record.get("uuid") == uuid
             and record.get("host") == name]
    return max(found, key=lambda r: float(r.get("time") or 0), default=None)


def _owned(store, args: dict, edit):
    """``edit(record)`` -> ``(answer, record)`` applied while ``owner``
    carries the record (``record`` False: deleted)."""
    uuid, owner = _uuid(args), args.get("owner")

    def guarded(known):
        if known is None or known.get("automation") != owner:
            return None, None, [], []
        answer, record = edit(known)
        return answer, record, [], []
    return records.change(store, uuid, guarded)


@handler("replica_noted")
def replica_noted(host, args: dict) -> dict:
    attempt = args.get("attempt")
    if not isinstance(attempt, dict):
        raise RequestError("replica_noted needs the attempt")
    return {"noted": bool(_owned(host.store, args,
                                 lambda known: (True, {**known, "last": attempt})))}


@handler("replica_ended")
def replica_ended(host, args: dict) -> dict:
    def ended(known):
        if known.get("stop") or _vm(host.store, known["uuid"]) is None:
            return True, False
        return False, None
    return {"deleted": bool(_owned(host.store, args, ended))}


@handler("replica_continue")
def replica_continue(host, args: dict) -> dict:
    uuid, owner = _uuid(args), args.get("owner")

    def carried(known):
        if known is None or known.get("automation") != owner:    # done already, or taken
            return {"automation": (known or {}).get("automation")}, None, [], []
        automation_id, compares, ops = api.automation_ops(host.store, records.KIND,
                                                          {"uuid": uuid})
        return {"automation": automation_id}, {**known, "automation": automation_id}, \
            compares, ops
    return records.change(host.store, uuid, carried)


@handler("replica_of")
def replica_of(host, args: dict) -> dict:
    uuid = _uuid(args)
    record = records.read(host.store, uuid)
    if record is None:
        return {"replicated": False}
    replica = record.get("replica")
    fallback = record.get("fallback")
    if replica is None:
        why = "it has no complete replica yet"
    elif replica["host"] not in live_host_names(host.store):
        why = f"its replica's host {replica['host']} is down too"
    else:
        return {"replicated": True, "usable": True, "replica": replica, "fallback": fallback,
                "next_seq": int(record.get("seq") or 0) + 1}
    return {"replicated": True, "usable": False, "replica": replica, "why": why,
            "fallback": fallback}
