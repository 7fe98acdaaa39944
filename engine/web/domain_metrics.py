"""This host's domains as Prometheus sees them, read from libvirt at scrape
time with one ``getAllDomainStats`` call, under the names of
prometheus-libvirt-exporter, for peerctl's domains only: those whose
peerctl metadata names the host (any host when it is None).  A driver whose
bulk stats lack a group (the test driver reports the state alone) is asked
per domain (``info``, ``blockStats``, ``interfaceStats``).  A libvirt that
does not answer: ``peerctl_libvirt_up 0`` and no domain family.  The call
blocks: scrape off the event loop."""
from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Domains"]

log = structlog.get_logger("peerctl.metrics")


@dataclass
class _Domain:
    name: str
    uuid: str
    state: int
    max_kib: int
    kib: int
    vcpus: int
    cpu_ns: int
    disks: list = field(default_factory=list)       # (dev, rd bytes, wr bytes, rd reqs, wr reqs)
    nics: list = field(default_factory=list)        # (dev, rx bytes, tx bytes, rx pkts, tx pkts)
    delays: list = field(default_factory=list)      # (vcpu, ns)


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
        self._uri = uri
        self._host = host
        self._conn = None
        self._answered = True
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:   # a connection already broken
                pass
            self._conn = None

    def families(self) -> list:
        import libvirt
        up = GaugeMetricFamily("peerctl_libvirt_up", "1 when this host's libvirt answered")
        with self._lock:
            try:
                domains = self._read(libvirt)
            except libvirt.libvirtError as exc:
                if self._answered:      # once per outage, not once per scrape
                    log.warning("metrics_libvirt_unanswered", uri=self._uri, error=str(exc))
                self._answered = False
                self._drop()        # opened again at the next scrape
                up.add_metric([], 0)
                return [up]
            self._answered = True
        up.add_metric([], 1)
        return [up, *_domain_families(domains)]

    def _read(self, libvirt) -> list[_Domain]:
        if self._conn is None:
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)    # raised, not printed
            self._conn = libvirt.openReadOnly(self._uri)
        groups = (libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_CPU_TOTAL
                  | libvirt.VIR_DOMAIN_STATS_BALLOON | libvirt.VIR_DOMAIN_STATS_VCPU
                  | libvirt.VIR_DOMAIN_STATS_INTERFACE | libvirt.VIR_DOMAIN_STATS_BLOCK)
        found = []
        for dom, stats in self._conn.getAllDomainStats(groups, 0):
            try:
                if self._ours(dom):
                    found.append(_figures(dom, stats, libvirt))
            except libvirt.libvirtError:
                continue        # gone since the bulk call
        return found

    def _ours(self, dom) -> bool:
        from engine.hypervisor.domain_xml import read_metadata
        owner = read_metadata(dom).get("host")
        return owner == self._host if self._host else bool(owner)


def _figures(dom, stats: dict, libvirt) -> _Domain:
    """A domain's figures from its bulk stats, asking the domain itself for
    what they lack."""
    info = None
    if any(key not in stats for key in ("state.state", "balloon.maximum", "balloon.current",
                                        "vcpu.current", "cpu.time")):
        info = dom.info()       # [state, max KiB, KiB, vCPUs, CPU ns]

    def pick(key, index):
        return stats[key] if key in stats else info[index]

    domain = _Domain(dom.name(), dom.UUIDString(), pick("state.state", 0),
                     pick("balloon.maximum", 1), pick("balloon.current", 2),
                     pick("vcpu.current", 3), pick("cpu.time", 4))
    active = domain.state in (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED,
                              libvirt.VIR_DOMAIN_PAUSED)
    targets = _targets(dom) if active and ("block.count" not in stats
                                           or "net.count" not in stats) else {}
    if "block.count" in stats:
        domain.disks = [(stats.get(f"block.{i}.name", str(i)),
                         *(stats.get(f"block.{i}.{part}", 0)
                           for part in ("rd.bytes", "wr.bytes", "rd.reqs", "wr.reqs")))
                        for i in range(stats["block.count"])]
    else:
        for dev in targets.get("disk", []):
            rd_reqs, rd_bytes, wr_reqs, wr_bytes, _errors = _asked(dom.blockStats, dev, 5,
                                                                   libvirt)
            domain.disks.append((dev, rd_bytes, wr_bytes, rd_reqs, wr_reqs))
    if "net.count" in stats:
        domain.nics = [(stats.get(f"net.{i}.name", str(i)),
                        *(stats.get(f"net.{i}.{part}", 0)
                          for part in ("rx.bytes", "tx.bytes", "rx.pkts", "tx.pkts")))
                       for i in range(stats["net.count"])]
    else:
        for dev in targets.get("interface", []):
            rx, rx_pkts, _e, _d, tx, tx_pkts, _e2, _d2 = _asked(dom.interfaceStats, dev, 8,
                                                                libvirt)
            domain.nics.append((dev, rx, tx, rx_pkts, tx_pkts))
    domain.disks = [d for d in domain.disks if d[1] is not None]
    domain.nics = [n for n in domain.nics if n[1] is not None]
    domain.delays = sorted((key.split(".")[1], value) for key, value in stats.items()
                           if key.startswith("vcpu.") and key.endswith(".delay"))
    return domain


def _asked(call, dev: str, width: int, libvirt) -> tuple:
    """A device's figures; ``width`` Nones for a device libvirt has none for."""
    try:
        return tuple(call(dev))
    except libvirt.libvirtError:
        return (None,) * width


def _targets(dom) -> dict[str, list[str]]:
    """``{"disk": [dev...], "interface": [dev...]}`` from the live XML."""
    devices = ET.fromstring(dom.XMLDesc(0)).find("devices")
    found: dict[str, list[str]] = {"disk": [], "interface": []}
    for kind in found:
        for element in devices.findall(kind) if devices is not None else []:
            target = element.find("target")
            if target is not None and target.get("dev"):
                found[kind].append(target.get("dev"))
    return found


def _domain_families(domains: list[_Domain]):
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
