"""Hosts as resource providers.

The peer calls, at start and on every stats tick (through
``engine/hypervisor/host/accounting.py``, which says what is reserved)::

    register_host(placement, host_name, source, state_dir=STATE_DIR,
                  reserved={RC: amount}) -> provider

``source`` is a libvirt connection (``getInfo()`` gives CPUs and memory), a
mapping ``{"vcpus", "memory_mb", "disk_gb"}`` already measured, or None
(psutil).  DISK_GB is the size of the file system holding ``state_dir``.

Promises:
- one provider per host, ever: an existing provider of that name is reused,
  and a new one gets ``uuid5(cluster, host)``, so a restarted peer finds its
  provider again and never leaves an orphan;
- registering again with the same measurements (and the same ``reserved``)
  writes nothing, and with new ones changes only what is measured (total,
  max_unit) and, when given, ``reserved``: allocation_ratio, min_unit and
  step_size an operator set are kept, and so is reserved when none is given;
- ``reserved`` given is exactly the reserved, every class it does not name
  0 (the peer gives what its operator's setting and the host's foreign
  domains hold: ``engine/hypervisor/host/accounting.py``), capped at the total;
- a drained host (``drain(placement, host)``: reserved = total, trait
  COMPUTE_STATUS_DISABLED) stays drained across restarts until undrained,
  whatever ``reserved`` says;
- a write is guarded by the provider's generation (retried on a conflict),
  so that it never undoes a drain or a claim made meanwhile.

Nested children (NUMA cells, devices) are created with
``placement.ensure_provider(name, parent=host_uuid)``; hosts report none today.
"""
from __future__ import annotations

import os
import uuid as uuidlib

from engine.placement.api import Placement
from engine.placement.model import DISABLED_TRAIT, Conflict, NotFound

__all__ = ["register_host", "drain", "measure", "host_provider_uuid", "own_traits"]

_NAMESPACE = uuidlib.UUID("5b1d3c52-6f0e-4c39-9d7a-4f3c7c1c7e10")
# nova's initial_*_allocation_ratio defaults
DEFAULT_RATIOS = {"VCPU": 4.0, "MEMORY_MB": 1.0, "DISK_GB": 1.0}


def host_provider_uuid(cluster: str, host: str) -> str:
    return str(uuidlib.uuid5(_NAMESPACE, f"{cluster}/{host}"))


def measure(source=None, state_dir: str = "/") -> dict:
    """``{VCPU, MEMORY_MB, DISK_GB}`` totals of this host."""
    if isinstance(source, dict):
        return {"VCPU": int(source["vcpus"]), "MEMORY_MB": int(source["memory_mb"]),
                "DISK_GB": int(source["disk_gb"])}
    import psutil
    if source is not None:
        info = source.getInfo()         # [model, memory MiB, cpus, mhz, nodes, ...]
        vcpus, memory_mb = int(info[2]), int(info[1])
    else:
        vcpus, memory_mb = psutil.cpu_count() or 1, psutil.virtual_memory().total >> 20
    path = state_dir if os.path.exists(state_dir) else "/"
    return {"VCPU": vcpus, "MEMORY_MB": memory_mb,
            "DISK_GB": psutil.disk_usage(path).total >> 30}


def register_host(placement: Placement, host: str, source=None, *, state_dir: str = "/",
                  reserved: dict | None = None, ratios: dict | None = None) -> dict:
    """Create or refresh ``host``'s provider; returns the provider document.

    Only what is measured is the peer's: ``total`` and ``max_unit`` (=
    total), and ``reserved`` when given (exactly that: a class it does not
    name gets 0).  A class registered before keeps the ``allocation_ratio``,
    ``min_unit`` and ``step_size`` it has (an operator's settings survive a
    restart), and its ``reserved`` when none is given, unless ``ratios``
    names it here; a new class gets those or the defaults.  Reserved is
    capped at the new total (min_unit at max_unit), and a drained host keeps
    reserved = total."""
    totals = measure(source, state_dir)
    ratios = ratios or {}
    for _ in range(10):
        try:
            rp = placement.provider(host)
        except NotFound:
            cluster = getattr(getattr(placement, "store", None), "cluster", None) \
                or placement.backend
            rp = placement.ensure_provider(host, uuid=host_provider_uuid(cluster, host))
        inventories = _inventories(rp, totals, reserved, ratios)
        if inventories == rp["inventories"]:
            return rp
        try:
            return placement.set_inventory(rp["uuid"], inventories, generation=rp["generation"])
        except Conflict:        # a claim, a drain or another peer's write: read again
            continue
    raise Conflict(f"inventory of {host}: changed by others 10 times in a row")


def _inventories(rp: dict, totals: dict, reserved: dict | None, ratios: dict) -> dict:
    """The inventories ``rp`` should have for measured ``totals``."""
    drained = DISABLED_TRAIT in rp["traits"]
    inventories = {}
    for rc, total in totals.items():
        if total < 1:
            continue
        old = rp["inventories"].get(rc) or {
            "reserved": 0, "min_unit": 1, "step_size": 1,
            "allocation_ratio": float(DEFAULT_RATIOS[rc])}
        wanted = old["reserved"] if reserved is None else reserved.get(rc, 0)
        inventories[rc] = {"total": total, "reserved": total if drained else min(wanted, total),
                           "min_unit": min(old["min_unit"], total), "max_unit": total,
                           "step_size": old["step_size"],
                           "allocation_ratio": float(ratios.get(rc, old["allocation_ratio"]))}
    # classes measured before but not now stay while in use
    for rc, inv in rp["inventories"].items():
        if rc not in inventories and rp["usages"].get(rc):
            inventories[rc] = inv
    return inventories


def own_traits(placement: Placement, host: str, prefix: str, traits) -> dict:
    """Make ``host``'s traits that start with ``prefix`` exactly ``traits``
    (the others, an operator's or a drain's, are kept); written only when
    they differ, guarded by the provider's generation and retried."""
    wanted = set(traits)
    for _ in range(10):
        rp = placement.provider(host)
        current = set(rp["traits"])
        new = {t for t in current if not t.startswith(prefix)} | wanted
        if new == current:
            return rp
        try:
            return placement.set_traits(rp["uuid"], sorted(new), generation=rp["generation"])
        except Conflict:
            continue
    raise Conflict(f"traits of {host}: changed by others 10 times in a row")


def drain(placement: Placement, host: str, drained: bool = True) -> dict:
    """No new claims fit on ``host`` (existing allocations stay)."""
    return placement.drain(host, drained)
