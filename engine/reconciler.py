"""The reconciler: one peer at a time squares placement with reality.

An allocation whose consumer has neither a VM (in ``vms/``) nor a running
automation that names it is an orphan: left behind by an automation that
was aborted between claim and build, or by a host that vanished with its
VMs.  Orphans are released once they have been seen orphaned on two passes
in a row (a VM that was just built may not be published yet).  VMs without
allocations are reported (``reconcile/report``), not touched: they may be
someone's VM started by hand.
"""
from __future__ import annotations

import os
import threading
import time

import structlog

from . import keys
from .store import Store, StoreUnavailable

__all__ = ["reconciler", "reconcile_once", "DEFAULT_INTERVAL"]

log = structlog.get_logger("peerctl.reconciler")

DEFAULT_INTERVAL = float(os.environ.get("PEERCTL_RECONCILE_INTERVAL", "30"))


def _referenced_consumers(store: Store) -> set[str]:
    """Consumers and VM uuids named by the steps of running automations."""
    named = set()
    tasks, _ = store.range("tasks/")
    for kv in tasks:
        task = kv.value or {}
        if task.get("state") != "running":
            continue
        spec = store.get(keys.spec(task["id"]))
        for vm in ((spec.value or {}).get("args") or {}).get("vms", []) if spec else []:
            if isinstance(vm, dict) and vm.get("uuid"):
                named.add(vm["uuid"])
        entries, _ = store.range(keys.auto(task["id"], "log/"))
        for entry in entries:
            args = (entry.value or {}).get("args") or {}
            for field in ("consumer", "uuid"):
                if isinstance(args.get(field), str):
                    named.add(args[field])
    return named


def reconcile_once(store: Store, placement, suspects: set[str], fence=None) -> dict:
    """One pass; ``suspects`` carries orphans seen on the previous pass."""
    allocations = {a["consumer"]: a for a in placement.all_allocations() if a["allocations"]}
    vms, _ = store.range("vms/")
    vm_uuids = {kv.value["uuid"] for kv in vms if kv.value}
    busy = _referenced_consumers(store)
    orphans = {c for c in allocations if c not in vm_uuids and c not in busy}
    released = sorted(orphans & suspects)
    for consumer in released:
        placement.release(consumer)
        log.warning("orphan_allocation_released", consumer=consumer,
                    allocations=allocations[consumer]["allocations"])
    unallocated = sorted(f"{kv.value['host']}/{kv.value['name']}" for kv in vms
                         if kv.value and kv.value["uuid"] not in allocations)
    for vm in unallocated:
        log.info("vm_without_allocation", vm=vm)
    report = {"time": time.time(), "released": released, "unallocated_vms": unallocated,
              "suspects": sorted(orphans - set(released))}
    store.put("reconcile/report", report)
    suspects.clear()
    suspects.update(orphans - set(released))
    return report


def reconciler(store: Store, interval: float = DEFAULT_INTERVAL):
    def duty(stop: threading.Event, candidacy):
        from .placement import open_placement
        placement = open_placement(None, store)
        suspects: set[str] = set()
        try:
            while not stop.wait(interval):
                try:
                    if candidacy.is_leader():
                        reconcile_once(store, placement, suspects)
                except StoreUnavailable as exc:
                    log.warning("reconcile_unavailable", error=str(exc))
                except Exception:
                    log.exception("reconcile_failed")
        finally:
            placement.close()
    return duty
