"""What placement keeps back on a host: the operator's ``reserved`` setting
plus what the host's foreign domains hold.

Promises:
- the host provider's ``reserved`` on VCPU, MEMORY_MB and DISK_GB is the
  operator's setting plus what :func:`engine.hypervisor.host.foreign.usage` says
  the foreign domains hold (the vCPUs and current memory of the running
  ones, their disks on the state directory's file system), capped at the
  total (a drained host: the total, as ever);
- foreign vCPUs are overcommitted as peerctl's are: they reserve their
  number divided by the provider's VCPU allocation ratio, rounded up (a
  foreign domain takes the capacity it would take once adopted, give or
  take that rounding, and a host running more foreign vCPUs than it has
  CPUs still has room);
- a foreign domain whose uuid holds an allocation on this host's provider
  (being adopted, or being let go by ``unmanage``) is left out: its
  allocation accounts for it, and counting it twice would hide capacity;
- :func:`refresh` recomputes and writes under :func:`lock`, one per host
  name in this process: the adopt request takes the same lock to lower
  reserved by one domain and claim it, so the two never interleave;
- writing what is already there writes nothing (``register_host``), so the
  peer may refresh on every stats tick;
- :func:`parse_reserved` reads the setting (``VCPU:2,MEMORY_MB:2048``):
  an unknown class, or an amount that is not a whole number, is a
  :class:`~engine.errors.UsageError` naming it.
"""
from __future__ import annotations

import math
import re
import threading

import libvirt

from engine.errors import UsageError
from engine.hypervisor.host import foreign
from engine.placement.host import DEFAULT_RATIOS, register_host
from engine.placement.model import NotFound

__all__ = ["CLASSES", "lock", "parse_reserved", "reserved_for", "refresh"]

CLASSES = ("VCPU", "MEMORY_MB", "DISK_GB")

_locks: dict[str, threading.RLock] = {}
_locks_guard = threading.Lock()


def lock(host_name: str) -> threading.RLock:
    """The lock held while ``host_name``'s reserved is recomputed and
    written (the same object every call, in this process).  Reentrant: an
    adopt holding it may call :func:`refresh`."""
    with _locks_guard:
        return _locks.setdefault(host_name, threading.RLock())


def parse_reserved(text: str | None, where: str = "in --reserved") -> dict:
    """``VCPU:2,MEMORY_MB:2048,DISK_GB:10`` -> ``{"VCPU": 2, ...}``; empty:
    ``{}``.  Amounts are whole numbers, 0 or more."""
    reserved = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        rc, sep, amount = item.partition(":")
        rc, amount = rc.strip(), amount.strip()
        if not sep or rc not in CLASSES:
            raise UsageError(f"bad reserved {item!r} {where} (want CLASS:AMOUNT, CLASS one "
                             f"of {', '.join(CLASSES)})")
        if not re.fullmatch(r"[0-9]+", amount):
            raise UsageError(f"bad reserved {item!r} {where} (the amount of {rc} must be a "
                             f"whole number, 0 or more)")
        if rc in reserved:
            raise UsageError(f"bad reserved {text!r} {where}: {rc} given twice")
        reserved[rc] = int(amount)
    return reserved


def _allocated_here(placement, provider: dict | None, uuids: set[str]) -> set[str]:
    """Those of ``uuids`` holding an allocation on ``provider``."""
    if provider is None:        # not registered yet: nothing is allocated on it
        return set()
    return {uuid for uuid in uuids
            if provider["uuid"] in (placement.allocations(uuid).get("allocations") or {})}


def _vcpu_ratio(provider: dict | None) -> float:
    inventory = (provider or {}).get("inventories", {}).get("VCPU") or {}
    return float(inventory.get("allocation_ratio") or DEFAULT_RATIOS["VCPU"])


def _foreign_uuids(conn, scanned) -> set[str]:
    uuids = set()
    for dom in foreign.foreign_domains(conn, scanned):
        try:
            uuids.add(dom.UUIDString())
        except libvirt.libvirtError as exc:     # undefined meanwhile
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
    return uuids


def reserved_for(host, placement, excluded=(), scanned=None) -> dict:
    """``{RC: amount}`` ``host`` (a HostContext) should reserve now: its
    setting plus what its foreign domains hold (their vCPUs over the VCPU
    allocation ratio), leaving out those in ``excluded`` and those holding
    an allocation on its provider.  Its domains are read once (or taken
    from ``scanned``: :func:`engine.hypervisor.host.foreign.scan`)."""
    excluded = set(excluded)
    scanned = foreign.scan(host.conn) if scanned is None else scanned
    try:
        provider = placement.provider(host.host)
    except NotFound:
        provider = None
    left_out = excluded | _allocated_here(placement, provider,
                                          _foreign_uuids(host.conn, scanned) - excluded)
    held = foreign.usage(host.conn, host.state_dir, left_out, scanned)
    held["VCPU"] = math.ceil(held["VCPU"] / _vcpu_ratio(provider))
    setting = host.reserved or {}
    return {rc: int(setting.get(rc, 0)) + held[rc] for rc in CLASSES}


def refresh(host, placement, excluded=(), scanned=None) -> dict:
    """Recompute ``host``'s reserved and write it (nothing when unchanged),
    under :func:`lock`; returns the host's provider.  ``scanned`` (taken
    under the same lock by a caller that holds it) spares reading every
    domain's metadata again."""
    with lock(host.host):
        return register_host(placement, host.host, host.conn, state_dir=host.state_dir,
                             reserved=reserved_for(host, placement, excluded, scanned))
