"""What a host record says about its host: XenoControl's hostlist and
hoststats columns, measured now.

The hypervisor's capacity (CPUs, memory) comes from libvirt, because that is
what VMs can be given (on test:///default it is the test driver's fake host);
usage, disk and network come from psutil, for the machine the peer runs on.
``free_memory_mb`` is the smaller of what the machine has available and what
the hypervisor has not yet promised to running VMs (peerctl's and foreign).

Domains peerctl did not make (foreign, :mod:`engine.hypervisor.host.foreign`)
are reported apart: ``vms`` counts peerctl's only, ``foreign_vms`` the
foreign ones, and ``foreign_vcpus``, ``foreign_memory_mb`` (current memory
of the running ones) and ``foreign_disk_gb`` are what they hold, from
which placement's reserved is made (:mod:`engine.hypervisor.host.accounting`).

``pool_free_gb`` is what the peer's storage pool (where its VMs' disks
live) has free, and ``vm_disk_growth_gb`` what those disks may still grow
into: their capacity minus their allocation, summed over the pool's volumes
of this host's VMs (thin qcow2 overlays grow as guests write).  Both are
absent until the pool exists; ``cluster verify`` compares them.

When a record is worth writing again (:class:`Publication`, the one rule
the peer and ``bench/scale.py``'s light peers share): the lease, not the
record, proves that the host is alive, so an unchanged record is never
rewritten (each write is history etcd keeps, an hour by default).  What the
host is and holds (its VMs, foreign domains, networks, code, errors...) is
published on the first tick that sees it change.  The gauges
(:data:`GAUGES`: CPU usage, free memory and disk, network counters) move
by themselves on every tick: a move of at least its step (:data:`STEPS`)
is published, at most once every :data:`MOVED_EVERY` seconds, and any
smaller drift every :data:`DRIFT_EVERY` seconds.  ``updated`` says when
the published figures were measured; it is never a reason to write.  At
1,000 hosts whose gauges all move on every tick, that is one write per host
a minute, whatever the tick.
"""
from __future__ import annotations

import os
import platform

import libvirt
import psutil

from engine.hypervisor.host import foreign
from engine.hypervisor.storage.images import POOL_NAME

__all__ = ["host_facts", "pool_space", "hypervisor_version", "cpu_model", "Publication", "GAUGES",
           "MOVED_EVERY", "DRIFT_EVERY"]

_MiB = 1 << 20
_GiB = 1 << 30

psutil.cpu_percent(interval=None)   # the first reading only starts the clock

GAUGES = ("cpu_usage", "free_memory_mb", "free_disk_gb", "net_rx_bytes", "net_tx_bytes",
          "pool_free_gb", "vm_disk_growth_gb")
# A move worth publishing soon: percentage points, or a share of the field
# named (with no such field, any change).  The network counters only ever
# grow: they drift.  hostlist shows free memory and disk, hoststats CPU
# usage too: nobody picks hosts by them (placement keeps its own books), a
# person reads them.
STEPS = {"cpu_usage": (10.0, None),
         "free_memory_mb": (0.05, "memory_mb"),
         "free_disk_gb": (0.02, "disk_gb"),
         "pool_free_gb": (0.02, "disk_gb"),
         "vm_disk_growth_gb": (0.02, "disk_gb")}
MOVED_EVERY = 60.0
DRIFT_EVERY = 300.0
_NOT_COMPARED = ("updated",) + GAUGES


def _steady(record: dict) -> dict:
    """What the host is and holds: the record but its gauges and ``updated``."""
    return {k: v for k, v in record.items() if k not in _NOT_COMPARED}


def _version(number: int) -> str:
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"


def hypervisor_version(conn) -> str:
    """``QEMU 7.2.0``, ``TEST 0.0.2``: the driver and its version."""
    return f"{conn.getType()} {_version(conn.getVersion())}"


def _max_kib(dom, memo) -> int:
    """A running domain's maximum memory, remembered by ``memo`` (a
    :class:`~engine.hypervisor.domain.metadata_memo.MetadataMemo`, or None):
    only a start, a stop or a new definition changes it, and each is an
    event that makes the memo forget."""
    if memo is None:
        return dom.info()[1]
    return memo.read(dom.UUIDString(), lambda: dom.info()[1], what="max_kib")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def pool_space(conn, host: str | None, uuids: set[str]) -> dict:
    """``{pool_free_gb, vm_disk_growth_gb}`` of ``host``'s pool, the growth
    over the volumes of the VMs ``uuids`` (named ``<uuid>...``); ``{}`` when
    the pool does not exist or is not running."""
    if not host:
        return {}
    try:
        pool = conn.storagePoolLookupByName(f"{POOL_NAME}-{host}")
        if not pool.isActive():
            return {}
        available = pool.info()[3]
        growth = 0
        for vol in pool.listAllVolumes(0):
            if vol.name()[:36] in uuids:
                _kind, capacity, allocation = vol.info()
                growth += max(capacity - allocation, 0)
    except libvirt.libvirtError:        # no pool yet, or a volume deleted meanwhile
        return {}
    return {"pool_free_gb": round(available / _GiB, 1),
            "vm_disk_growth_gb": round(growth / _GiB, 1)}


def host_facts(conn, state_dir: str, host: str | None = None,
               scanned: list[tuple] | None = None, memo=None) -> dict:
    """The host's numbers.  ``vms`` counts peerctl's domains (those of
    ``host`` when given: peers may share one libvirtd); ``domains`` counts
    every domain libvirt has; ``foreign_*`` the domains without peerctl
    metadata.  Every domain's metadata is read once, or taken from
    ``scanned`` (:func:`engine.hypervisor.host.foreign.scan`); ``memo``
    remembers each running domain's maximum memory (see :func:`_max_kib`)."""
    _arch, memory_mb, cpus, *_ = conn.getInfo()
    scanned = foreign.scan(conn) if scanned is None else scanned
    ours = [dom for dom, metadata in scanned
            if (metadata.get("host") == host if host else metadata)]
    strangers = foreign.foreign_domains(conn, scanned)
    held = foreign.usage(conn, _existing(state_dir), scanned=scanned)
    # ID(): the domain's id as the listing had it, -1 when it was not
    # running (no call to libvirt: the tick's view is the scan's moment).
    promised_mb = sum(_max_kib(d, memo) // 1024 for d in ours if d.ID() != -1) \
        + held["MEMORY_MB"]
    available_mb = psutil.virtual_memory().available // _MiB
    disk = psutil.disk_usage(_existing(state_dir))
    net = psutil.net_io_counters(pernic=True)
    rx = sum(c.bytes_recv for nic, c in net.items() if nic != "lo")
    tx = sum(c.bytes_sent for nic, c in net.items() if nic != "lo")
    return {
        "vcpus": cpus,
        "cpu_usage": psutil.cpu_percent(interval=None),
        "memory_mb": memory_mb,
        "free_memory_mb": max(0, min(available_mb, memory_mb - promised_mb)),
        "disk_gb": round(disk.total / _GiB, 1),
        "free_disk_gb": round(disk.free / _GiB, 1),
        "net_rx_bytes": rx,
        "net_tx_bytes": tx,
        "vms": len(ours),
        "domains": len(scanned),
        "foreign_vms": len(strangers),
        "foreign_vcpus": held["VCPU"],
        "foreign_memory_mb": held["MEMORY_MB"],
        "foreign_disk_gb": held["DISK_GB"],
        "hypervisor": hypervisor_version(conn),
        "libvirt": _version(conn.getLibVersion()),
        "kernel": platform.release(),
        "cpu_model": cpu_model(),
        **pool_space(conn, host, {dom.UUIDString() for dom in ours}),
    }


def _moved(published: dict, measured: dict) -> bool:
    """A gauge moved by at least its step since ``published``."""
    for gauge, (step, against) in STEPS.items():
        before, now = published.get(gauge), measured.get(gauge)
        if not all(isinstance(v, (int, float)) for v in (before, now)):
            continue
        if against is not None:
            whole = measured.get(against)
            step = step * whole if isinstance(whole, (int, float)) and whole > 0 else 0
        if before != now and abs(now - before) >= step:
            return True
    return False


class Publication:
    """When a host's record is worth writing again (the rule in the module's
    docstring): ``due(record, now)`` says why (``"changed"``, ``"moved"``,
    ``"drifted"``) or None; ``written(record, now)`` notes what etcd has.
    ``now`` is monotonic seconds; ``record`` is the whole value written."""

    def __init__(self):
        self.record: dict | None = None
        self.at = 0.0

    def due(self, record: dict, now: float) -> str | None:
        published = self.record
        if published is None:
            return "changed"
        if set(record) != set(published) or _steady(record) != _steady(published):
            return "changed"
        age = now - self.at
        if age >= MOVED_EVERY and _moved(published, record):
            return "moved"
        if age >= DRIFT_EVERY and any(record.get(g) != published.get(g) for g in GAUGES):
            return "drifted"
        return None

    def written(self, record: dict, now: float) -> None:
        self.record, self.at = record, now
