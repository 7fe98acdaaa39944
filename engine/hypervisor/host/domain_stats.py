"""What libvirt says of this host's domains now, for peerctl's domains only
(those whose peerctl metadata names the host; any host when it is None):
one ``getAllDomainStats`` call, and for a driver whose bulk stats lack a
group (the test driver reports the state alone) the domain itself asked
(``info``, ``blockStats``, ``interfaceStats``).

Promises: :meth:`DomainStats.read` never raises for a libvirt that does
not answer: it returns None (logged once per outage) and opens the
connection again at the next read; a domain gone between the bulk call and
its own questions is left out.  It blocks: call it off an event loop."""
from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import libvirt
import structlog

from engine.hypervisor.domain.domain_xml import read_metadata

__all__ = ["DomainStats", "DomainFigures"]

log = structlog.get_logger("peerctl.metrics")


@dataclass
class DomainFigures:
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


class DomainStats:
    """peerctl's domains on ``uri`` (those of ``host``), one bulk call a read."""

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

    def read(self) -> list[DomainFigures] | None:
        """The figures of each of peerctl's domains, or None when libvirt
        does not answer."""
        with self._lock:
            try:
                domains = self._read()
            except libvirt.libvirtError as exc:
                if self._answered:      # once per outage, not once per read
                    log.warning("metrics_libvirt_unanswered", uri=self._uri, error=str(exc))
                self._answered = False
                self._drop()        # opened again at the next read
                return None
            self._answered = True
            return domains

    def _read(self) -> list[DomainFigures]:
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
                    found.append(_figures(dom, stats))
            except libvirt.libvirtError:
                continue        # gone since the bulk call
        return found

    def _ours(self, dom) -> bool:
        owner = read_metadata(dom).get("host")
        return owner == self._host if self._host else bool(owner)


def _figures(dom, stats: dict) -> DomainFigures:
    """A domain's figures from its bulk stats, asking the domain itself for
    what they lack."""
    info = None
    if any(key not in stats for key in ("state.state", "balloon.maximum", "balloon.current",
                                        "vcpu.current", "cpu.time")):
        info = dom.info()       # [state, max KiB, KiB, vCPUs, CPU ns]

    def pick(key, index):
        return stats[key] if key in stats else info[index]

    domain = DomainFigures(dom.name(), dom.UUIDString(), pick("state.state", 0),
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
            rd_reqs, rd_bytes, wr_reqs, wr_bytes, _errors = _asked(dom.blockStats, dev, 5)
            domain.disks.append((dev, rd_bytes, wr_bytes, rd_reqs, wr_reqs))
    if "net.count" in stats:
        domain.nics = [(stats.get(f"net.{i}.name", str(i)),
                        *(stats.get(f"net.{i}.{part}", 0)
                          for part in ("rx.bytes", "tx.bytes", "rx.pkts", "tx.pkts")))
                       for i in range(stats["net.count"])]
    else:
        for dev in targets.get("interface", []):
            rx, rx_pkts, _e, _d, tx, tx_pkts, _e2, _d2 = _asked(dom.interfaceStats, dev, 8)
            domain.nics.append((dev, rx, tx, rx_pkts, tx_pkts))
    domain.disks = [d for d in domain.disks if d[1] is not None]
    domain.nics = [n for n in domain.nics if n[1] is not None]
    domain.delays = sorted((key.split(".")[1], value) for key, value in stats.items()
                           if key.startswith("vcpu.") and key.endswith(".delay"))
    return domain


def _asked(call, dev: str, width: int) -> tuple:
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
