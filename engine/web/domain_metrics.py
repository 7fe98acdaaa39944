"""This host's domains as Prometheus sees them, under the names of
prometheus-libvirt-exporter, from what the hypervisor room reads of them at
scrape time (:mod:`engine.hypervisor.host.domain_stats`).  A libvirt that
does not answer: ``peerctl_libvirt_up 0`` and no domain family.  The call
blocks: scrape off the event loop."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Domains"]

_INFO = (  # family, help, the figure in bytes/seconds/count
    ("libvirt_domain_info_maximum_memory_bytes", "Maximum memory of the domain",
     lambda d: d.max_kib * 1024),
    ("libvirt_domain_info_memory_usage_bytes", "Memory the domain uses", lambda d: d.kib * 1024),
    ("libvirt_domain_info_virtual_cpus", "Virtual CPUs of the domain", lambda d: d.vcpus),
    ("libvirt_domain_info_vstate", "The domain's state, as libvirt numbers it "
     "(1 running, 3 paused, 5 shut off...)", lambda d: d.state),
)
_BLOCK = ("read_bytes", "write_bytes", "read_requests", "write_requests")
_NET = ("receive_bytes", "transmit_bytes", "receive_packets", "transmit_packets")


class Domains:
    """peerctl's domains on ``uri`` (those of ``host``), one bulk call a scrape."""

    def __init__(self, uri: str, host: str | None):
        from engine.hypervisor.host.domain_stats import DomainStats   # libvirt, at the first scrape's server
        self._stats = DomainStats(uri, host)

    def close(self) -> None:
        self._stats.close()

    def families(self) -> list:
        up = GaugeMetricFamily("peerctl_libvirt_up", "1 when this host's libvirt answered")
        domains = self._stats.read()
        if domains is None:
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, *_domain_families(domains)]


def _domain_families(domains: list):
    for name, what, figure in _INFO:
        family = GaugeMetricFamily(name, what, labels=["domain", "uuid"])
        for d in domains:
            family.add_metric([d.name, d.uuid], figure(d))
        yield family
    cpu = CounterMetricFamily("libvirt_domain_info_cpu_time_seconds_total",
                              "CPU time the domain used", labels=["domain", "uuid"])
    for d in domains:
        cpu.add_metric([d.name, d.uuid], d.cpu_ns / 1e9)
    yield cpu
    for prefix, parts, rows in (("block_stats", _BLOCK, "disks"),
                                ("interface_stats", _NET, "nics")):
        for index, part in enumerate(parts, start=1):
            family = CounterMetricFamily(f"libvirt_domain_{prefix}_{part}_total",
                                         f"{part.replace('_', ' ').capitalize()} of a device",
                                         labels=["domain", "uuid", "target_device"])
            for d in domains:
                for row in getattr(d, rows):
                    family.add_metric([d.name, d.uuid, row[0]], row[index])
            yield family
    delay = CounterMetricFamily("libvirt_domain_vcpu_delay_seconds_total",
                                "Time a vCPU waited for a host CPU (vcpu.N.delay)",
                                labels=["domain", "uuid", "vcpu"])
    for d in domains:
        for vcpu, ns in d.delays:
            delay.add_metric([d.name, d.uuid, vcpu], ns / 1e9)
    yield delay
