"""Replication of VMs to another host (docs/replicas.md): start or change
it, stop it, and what vmlist shows of it.

Every refusal is one line with nothing written: an interval under
:data:`engine.backups.replicas.MIN_EVERY`, a pattern matching nothing, a VM whose
host is down, no other live, undrained host (matching ``to``) to keep its
replica: a replica is never on the VM's own host."""
from __future__ import annotations

import fnmatch
import time

from engine.errors import Failed, UsageError
from engine.wording import option

from .plans import failed_doc, refuse_down_hosts
from .select import host_pattern, select_vms, vm_pattern
from .tasks import iso

__all__ = ["replicate", "replicated", "row_of", "stop", "replicas_by_uuid", "check_every"]


def check_every(every: float) -> float:
    from engine.backups.replicas import MIN_EVERY
    if every < MIN_EVERY:
        raise UsageError(f"{option('every')} {every:g}s is too short: a replica is updated at most "
                         f"every {MIN_EVERY:g}s")
    return every


def _chosen(ctx, patterns: list[str]) -> list[dict]:
    for text in patterns:
        vm_pattern(text)        # bad patterns are usage errors before any read
    from engine.cluster import read_vms
    return select_vms(lambda: read_vms(ctx.store()), list(patterns))


def _nowhere(vm: dict, to: str | None, hosts: list[dict]) -> str | None:
    """Why ``vm`` has no host for its replica, or None when it has one."""
    matched = [h for h in hosts if fnmatch.fnmatchcase(h["host"], to or "*")]
    usable = sorted(h["host"] for h in matched if h.get("alive") and not h.get("drained"))
    if set(usable) - {vm["host"]}:
        return None
    head = f"no host to keep a replica of VM {vm['name']!r}: "
    where = f"--to {to!r}" if to is not None else "the cluster"
    if not matched:
        return head + f"{where} matches no host"
    if not usable:
        return head + f"{where} has no live, undrained host"
    return head + f"{where} offers only {vm['host']}, where it runs (a replica is always " \
        "on another host)"


def replicate(ctx, patterns: list[str], every: float, to: str | None = None,
              fallback: str | None = None, dry_run: bool = False) -> dict:
    """Replicate the VMs matching ``patterns`` every ``every`` seconds to a
    host matching ``to``; ``fallback`` ``image``: an HA restart with no
    usable replica may start the VM from its image.  ``{vms: [{name, uuid,
    host, replica_host, every, state}]}`` (state ``started`` or
    ``changed``); ``dry_run``: nothing written, the doc's ``state`` is
    ``dry-run`` and each VM's ``would start`` or ``would change``."""
    from engine.backups import replicas
    from engine.cluster import read_hosts
    every = check_every(every)
    to = host_pattern(to) if to is not None else None
    vms = _chosen(ctx, patterns)
    refuse_down_hosts(vms, "it can be replicated")
    store = ctx.store()
    hosts = read_hosts(store)
    for vm in vms:
        why = _nowhere(vm, to, hosts)
        if why:
            raise Failed(why, result=failed_doc())
    rows = []
    for vm in vms:
        if dry_run:
            known = replicas.read(store, vm["uuid"])
            rows.append(dict(_row(vm, {**(known or {}), "every": every, "to": to,
                                       "fallback": fallback}),
                             state="would change" if known else "would start"))
            continue
        record = replicas.put(store, vm, every, to, fallback)
        rows.append(_row(vm, record))
    return {"state": "dry-run" if dry_run else "done", "vms": rows}


def _row(vm: dict, record: dict) -> dict:
    replica = record.get("replica") or {}
    return {"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"],
            "replica_host": replica.get("host"), "every": record["every"],
            "to": record.get("to"), "fallback": record.get("fallback"),
            "state": record.get("state", "stopping" if record.get("stop") else "set")}


def replicated(ctx, patterns: list[str]) -> list[dict]:
    """The VMs matching ``patterns`` that are replicated (each with its
    record as ``replication``); none: :class:`Failed`."""
    from engine.backups import replicas
    store = ctx.store()
    chosen = []
    for vm in _chosen(ctx, patterns):
        record = replicas.read(store, vm["uuid"])
        if record is not None:
            chosen.append({**vm, "replication": record})
    if not chosen:
        raise Failed("none of the VMs matching " + " ".join(repr(p) for p in patterns)
                     + " is replicated", result=failed_doc())
    return chosen


def row_of(vm: dict) -> dict:
    """A VM from :func:`replicated` as every face lists it."""
    return _row(vm, vm["replication"])


def stop(ctx, vms: list[dict]) -> dict:
    """Stop replicating ``vms`` (from :func:`replicated`): their automations
    delete each replica, then its record.  ``{vms: [...]}`` (state
    ``stopping``)."""
    from engine.backups import replicas
    store = ctx.store()
    rows = []
    for vm in vms:
        record = replicas.stop(store, vm["uuid"])
        if record is not None:
            rows.append(_row(vm, {**record, "state": "stopping"}))
    return {"state": "done", "vms": rows}


def replicas_by_uuid(store) -> dict[str, dict]:
    """``{uuid: {host, time, age_s, every, alive, error}}``: what vmlist
    shows as a VM's ``replica`` (one range read of ``replicas/`` and one of
    ``hosts/``).  ``host`` and ``time`` are None while the VM has no
    complete replica; ``alive`` False when the replica's host is down
    (the gap until a new replica is made elsewhere); ``error``: why the
    last update did not happen, or None."""
    from engine.backups import replicas
    from engine.core.hosts import live_host_names
    alive = live_host_names(store)
    now = time.time()
    shown = {}
    for record in replicas.read_all(store):
        replica = record.get("replica") or {}
        when = replica.get("time")
        last = record.get("last") or {}
        shown[record["uuid"]] = {
            "host": replica.get("host"), "time": iso(when) if when else None,
            "age_s": round(max(now - when, 0.0), 1) if when else None,
            "every": record.get("every"),
            "alive": replica.get("host") in alive if replica else None,
            "stopping": bool(record.get("stop")),
            "error": last.get("error") if isinstance(last.get("error"), str) else None}
    return shown
