"""What feeds a peer's graphs (:mod:`engine.hypervisor.host.graphs`): every
:data:`~engine.hypervisor.host.graphs.STEP` seconds, on a thread of its
own, the host as psutil reads it and peerctl's domains on it as libvirt's
bulk stats give them (:class:`~engine.hypervisor.host.domain_stats.DomainStats`:
one ``getAllDomainStats`` call, the domains themselves asked only for what
a driver's bulk stats lack).

Promises:
- it never holds up the peer's other work: it runs on its own daemon
  thread, apart from the peer's stats tick and the API's pools, and a
  sample that fails is logged and skipped (its points are absent);
- a libvirt that does not answer leaves the VMs' points of that sample
  absent (their series are kept); the host's are still read;
- samples fall on the step's boundaries of wall time (:00, :10, :20...),
  so that every peer's points line up;
- the host's figures: CPU busy (all but idle and iowait) of all its CPUs;
  memory in use (total less available); disk bytes read and written, all
  disks (absent where the kernel shows none); network bytes received and
  sent, all interfaces but ``lo``.  A VM's: its CPU time over its vCPUs;
  its current memory (the balloon's, as libvirt reports it); bytes read
  and written over its disks, received and sent over its interfaces (each
  absent when libvirt reports no such device); a VM not running has
  nothing but its memory absent too.
"""
from __future__ import annotations

import threading
import time

import libvirt
import psutil
import structlog

from .domain_stats import DomainFigures, DomainStats
from .graphs import STEP, Graphs, Reading

__all__ = ["GraphSampler", "host_reading", "vm_reading"]

log = structlog.get_logger("peerctl.graphs")

_ACTIVE = (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED, libvirt.VIR_DOMAIN_PAUSED)


def host_reading() -> Reading:
    times = psutil.cpu_times()
    # guest time is counted in user and nice already (as psutil.cpu_percent says)
    busy = sum(times) - times.idle - getattr(times, "iowait", 0.0) \
        - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    memory = psutil.virtual_memory()
    try:
        disks = psutil.disk_io_counters(perdisk=False)
    except (OSError, RuntimeError):     # no /proc/diskstats (some containers)
        disks = None
    nics = psutil.net_io_counters(pernic=True)
    outside = [counters for nic, counters in nics.items() if nic != "lo"]
    return Reading(busy, psutil.cpu_count() or 1, memory.total - memory.available,
                   disks.read_bytes if disks else None, disks.write_bytes if disks else None,
                   sum(c.bytes_recv for c in outside) if outside else None,
                   sum(c.bytes_sent for c in outside) if outside else None)


def vm_reading(domain: DomainFigures) -> Reading:
    if domain.state not in _ACTIVE:
        return Reading()
    disks, nics = domain.disks, domain.nics
    return Reading(domain.cpu_ns / 1e9, domain.vcpus or 1, domain.kib * 1024,
                   sum(d[1] for d in disks) if disks else None,
                   sum(d[2] for d in disks) if disks else None,
                   sum(n[1] for n in nics) if nics else None,
                   sum(n[2] for n in nics) if nics else None)


class GraphSampler:
    """Samples ``host`` (its libvirt at ``uri``) into :attr:`graphs`;
    ``start()`` it, ``stop()`` it."""

    def __init__(self, host: str, uri: str, step: float = STEP):
        self.graphs = Graphs(host)
        self.host, self.step = host, step
        self._domains = DomainStats(uri, host)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graphs", daemon=True)

    def start(self) -> "GraphSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._domains.close()

    def sample(self, t: float) -> None:
        """One sample, of time ``t``."""
        host = host_reading()
        domains = self._domains.read()      # None: libvirt did not answer
        vms = {d.uuid: vm_reading(d) for d in domains or ()}
        self.graphs.put(t, host, vms)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.sample(time.time())
            except Exception as exc:        # never the end of the graphs: the next step
                log.warning("graph_sample_failed", host=self.host, error=str(exc))
            # just past the next boundary: a wake a hair early would sample
            # the same step twice, a rate over a millisecond
            self._stopping.wait(self.step - time.time() % self.step + 0.05)
