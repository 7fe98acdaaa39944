"""``GET /metrics``: the cluster as Prometheus sees it, from a cache that
etcd watches keep, never from a read of etcd per scrape.

``ClusterMetrics(store, host, libvirt_uri).start()`` reads the keys it
needs once (``tasks/``, ``hosts/``, ``hostcfg/``, ``drained/``,
``reserved/``, ``vms/``, ``locks/vm/``, ``placement/rp/``), then follows
each prefix with a :class:`~engine.core.watch.PrefixWatch` (a compaction is
a Reset: the prefix read again, the difference applied as changes);
``render()`` answers in text format 0.0.4 from memory.  docs/metrics.md
lists every family.  Promises:

- a scrape reads nothing from etcd: etcd's health is a background poll of
  ``status()`` every ``etcd_poll`` seconds; until the first read has
  answered, the cluster's families are absent (``wait_ready``);
- hosts and VMs are counted by the rules ``hostlist`` and ``vmlist`` apply
  (:func:`engine.cluster.read_hosts`, :func:`engine.cluster.read_vms`, run
  over the cache); each prefix is as current as its own watch;
- no label holds an automation id, a time or any other value that grows
  with the work done: the series are bounded by automation kinds, hosts,
  resource classes and this host's domains;
- ``peerctl_automation_duration_seconds{kind, outcome}``: an automation is
  observed once, when its ``tasks/`` record is seen to go from running (or
  absent) to a terminal state while this process watches, for
  ``finished - created`` of that record (both written by peerctl; a record
  lacking either is not observed); automations that ended before
  ``start`` are not;
- ``peerctl_ha_recoveries_total``: the HA restarts noted in VM records
  (``restarts: {automation: time}``, one entry per ``recover`` or
  ``ha_restart`` that restarted the VM, in place or elsewhere, the last 10
  kept), counted once each: at start the entries the records hold, then
  each entry newer than the newest counted for that VM.  Memory: one time
  per VM that has a record; a VM whose records are all gone is forgotten;
- per-domain figures (only with ``libvirt_uri``) are read at scrape time,
  with one ``getAllDomainStats`` call, under the names of
  prometheus-libvirt-exporter, for peerctl's domains only: those whose
  peerctl metadata names ``host`` (any host when ``host`` is None), as the
  hypervisor room decides ownership.  A driver whose bulk stats lack a
  group (the test driver reports the state alone) is asked per domain
  (``info``, ``blockStats``, ``interfaceStats``).  A libvirt that does not
  answer: ``peerctl_libvirt_up 0`` and no domain family.  That call
  blocks: run ``render`` off the event loop.
"""
from __future__ import annotations

import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.utils import floatToGoString

import engine.placement.etcd  # noqa: F401  (declares the shape of placement/ keys)
from engine.cluster import read_hosts, read_vms
from engine.core import keys
from engine.core.maintenance import space
from engine.core.store import Get, KV, TxnResult
from engine.core.values import readable
from engine.core.watch import PrefixWatch, Reset
from engine.errors import PeerctlError
from engine.hypervisor.shapes import VM
from engine.placement.model import capacity

__all__ = ["ClusterMetrics", "CONTENT_TYPE", "DURATION_BUCKETS"]

log = structlog.get_logger("peerctl.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

TASKS, VMS, PROVIDERS = keys.task(), keys.vm(), keys.placement("rp/")
WATCHED = (TASKS, keys.host(), keys.host_config(), keys.drained(), keys.reserved(), VMS,
           keys.lock("vm/"), PROVIDERS)

AUTOMATION_STATES = ("running", *keys.TERMINAL_STATES)
HOST_STATUSES = ("up", "drained", "reserved", "disabled", "down")
VM_STATES = ("running", "paused", "shutoff", "building", "error", "missing", "unknown",
             "migrating")
OTHER = "other"     # a state no peerctl writes: counted, under one label value


class ClusterMetrics:
    """The metrics a peer's HTTP server exposes (``engine/web/app.py``)."""

    CONTENT_TYPE = CONTENT_TYPE

    def __init__(self, store, host: str | None = None, libvirt_uri: str | None = None,
                 *, etcd_poll: float = 5.0):
        self._durations = _Durations()
        self._restarts = _HaRestarts()
        self._cache = _Cache(store, WATCHED, self._changed)
        self._etcd = _EtcdHealth(store, etcd_poll)
        self._libvirt = _Domains(libvirt_uri, host) if libvirt_uri else None
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)
        self._counted = (None, [])      # (cache changes, the cluster's families then)

    def start(self) -> "ClusterMetrics":
        """Read, then follow, in the background (etcd may be down: it is
        read again until it answers)."""
        self._cache.start()
        self._etcd.start()
        return self

    def stop(self) -> None:
        self._cache.stop()
        self._etcd.stop()
        if self._libvirt:
            self._libvirt.close()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once the keys were read and etcd polled once."""
        return self._cache.loaded.wait(timeout) and self._etcd.polled.wait(timeout)

    def render(self) -> bytes:
        """The exposition (:data:`CONTENT_TYPE`), from memory; with a
        libvirt, after its one bulk call."""
        return generate_latest(self._registry)

    # -- what the watches bring ---------------------------------------------------

    def _changed(self, prefix: str, changes: list, initial: bool) -> None:
        """Called by the cache, in order, with ``(key, old KV, new KV)``
        (None: absent) for every key that changed under ``prefix``."""
        if prefix == VMS:
            for key, _old, new in changes:
                self._restarts.saw(key, new)
        elif prefix == TASKS and not initial:
            for _key, old, new in changes:
                self._durations.ended(readable(old) if old else None,
                                      readable(new) if new else None)

    # -- the Collector protocol (prometheus_client) -------------------------------

    def collect(self):
        yield from self._etcd.families()
        if self._cache.loaded.is_set():
            yield from self._cluster_families()
        if self._libvirt:
            yield from self._libvirt.families()

    def _cluster_families(self) -> list:
        """Counted again only when a watch changed what the cache holds:
        counting 10,000 VMs on every scrape would cost tens of ms."""
        changes = self._cache.changes
        if self._counted[0] != changes:
            self._counted = (changes, [
                _automations(self._cache.held(TASKS)), self._durations.family(),
                CounterMetricFamily("peerctl_ha_recoveries",
                                    "HA restarts noted in VM records (docs/metrics.md)",
                                    value=self._restarts.total),
                _hosts(read_hosts(self._cache)), _vms(read_vms(self._cache)),
                *_placement(self._cache.held(PROVIDERS))])
        return self._counted[1]


# -- the cache -----------------------------------------------------------------------


class _Cache:
    """The keys under ``prefixes`` as etcd holds them, one watch each; it
    answers ``txn`` with Get operations only, as a Store would, so that
    the listings' readers run over it unchanged."""

    def __init__(self, store, prefixes, on_change):
        self._store = store
        self._kvs: dict[str, dict[str, KV]] = {prefix: {} for prefix in prefixes}
        self._on_change = on_change
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watches: list[PrefixWatch] = []
        self._threads: list[threading.Thread] = []
        self.loaded = threading.Event()
        self.revision = 0
        self.changes = 0        # bumped whenever what is held changes

    def start(self) -> None:
        self._spawn(self._load, "metrics:load")

    def stop(self) -> None:
        self._stopped.set()
        for watch in self._watches:
            watch.stop()
        for thread in self._threads:
            thread.join(5)

    def held(self, prefix: str) -> list[KV]:
        with self._lock:
            return list(self._kvs[prefix].values())

    def txn(self, compares, ops) -> TxnResult:
        if compares or not all(isinstance(op, Get) for op in ops):
            raise TypeError("the metrics cache answers reads only")
        with self._lock:
            return TxnResult(True, self.revision, [self._matching(op) for op in ops])

    def _matching(self, get: Get) -> list[KV]:
        held = next((kvs for prefix, kvs in self._kvs.items() if get.key.startswith(prefix)),
                    None)
        if held is None:
            raise LookupError(f"{get.key!r} is not among the keys the metrics watch")
        if not get.prefix:
            return [held[get.key]] if get.key in held else []
        return [held[key] for key in sorted(held) if key.startswith(get.key)]

    def _spawn(self, target, name, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _load(self) -> None:
        """Every prefix at one revision, then a watch of each from there."""
        warned = False
        while not self._stopped.is_set():
            try:
                revision = self._store.revision()
                read = {prefix: self._store.range(prefix, revision=revision)[0]
                        for prefix in self._kvs}
                break
            except PeerctlError as exc:
                if not warned:
                    log.warning("metrics_waiting_for_etcd", error=str(exc))
                    warned = True
                self._stopped.wait(1.0)
        else:
            return
        with self._lock:
            self.revision = revision
            for prefix, kvs in read.items():
                self._kvs[prefix] = {kv.key: kv for kv in kvs}
                self._on_change(prefix, [(kv.key, None, kv) for kv in kvs], True)
        for prefix in self._kvs:
            watch = PrefixWatch(self._store, prefix, revision).start()
            self._watches.append(watch)
            self._spawn(self._follow, f"metrics:{prefix}", prefix, watch)
        if self._stopped.is_set():      # stop() came while the watches started
            for watch in self._watches:
                watch.stop()
        self.loaded.set()

    def _follow(self, prefix: str, watch: PrefixWatch) -> None:
        while not self._stopped.is_set():
            for batch in watch.drain(timeout=0.5):
                with self._lock:
                    self._apply(prefix, batch)

    def _apply(self, prefix: str, batch) -> None:
        held = self._kvs[prefix]
        changes = []
        if isinstance(batch, Reset):
            fresh = {kv.key: kv for kv in batch.kvs}
            changes += [(key, held[key], None) for key in held.keys() - fresh.keys()]
            changes += [(key, held.get(key), kv) for key, kv in fresh.items()
                        if key not in held or held[key].mod_revision != kv.mod_revision]
            self._kvs[prefix] = fresh
            self.revision = max(self.revision, batch.revision)
        else:
            for event in batch:
                key = event.kv.key
                new = event.kv if event.kind == "put" else None
                changes.append((key, held.get(key), new))
                if new is None:
                    held.pop(key, None)
                else:
                    held[key] = new
                self.revision = max(self.revision, event.kv.mod_revision)
        if changes:
            self._on_change(prefix, changes, False)
            self.changes += 1       # after: a scrape then counts what it brought


# -- what is counted as it happens ----------------------------------------------------


class _Durations:
    """The duration histogram, by kind and outcome (a terminal state)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str], list] = {}     # -> [counts per bucket + inf, sum]

    def ended(self, old: dict | None, new: dict | None) -> None:
        if not new or new.get("state") not in keys.TERMINAL_STATES:
            return
        if old and old.get("state") in keys.TERMINAL_STATES:
            return      # already over (a rewrite of a finished record)
        created, finished = new.get("created"), new.get("finished")
        if not all(type(t) in (int, float) for t in (created, finished)):
            return
        seconds = max(0.0, finished - created)
        index = next((i for i, bound in enumerate(DURATION_BUCKETS) if seconds <= bound),
                     len(DURATION_BUCKETS))
        with self._lock:
            series = self._series.setdefault((new["kind"], new["state"]),
                                             [[0] * (len(DURATION_BUCKETS) + 1), 0.0])
            series[0][index] += 1
            series[1] += seconds

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            "peerctl_automation_duration_seconds",
            "Automations seen to end, from created to finished, by kind and outcome",
            labels=["kind", "outcome"])
        with self._lock:
            series = {labels: (list(counts), total)
                      for labels, (counts, total) in self._series.items()}
        for (kind, outcome), (counts, total) in sorted(series.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*DURATION_BUCKETS, float("inf")), counts):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric([kind, outcome], buckets, total)
        return family


class _HaRestarts:
    """The HA restart counter: see the module's docstring."""

    def __init__(self):
        self._lock = threading.Lock()
        self._records: dict[str, set[str]] = {}     # uuid -> its vms/ keys
        self._newest: dict[str, float] = {}         # uuid -> newest restart counted
        self.total = 0

    def saw(self, key: str, kv: KV | None) -> None:
        uuid = key.rsplit("/", 1)[-1]
        with self._lock:
            records = self._records.setdefault(uuid, set())
            if kv is None:
                records.discard(key)
                if not records:
                    del self._records[uuid]
                    self._newest.pop(uuid, None)
                return
            records.add(key)
            record = readable(kv, VM)
            restarts = record.get("restarts") if record else None
            if not isinstance(restarts, dict):
                return
            times = [t for t in restarts.values() if type(t) in (int, float)]
            newest = self._newest.get(uuid)
            self.total += sum(1 for t in times if newest is None or t > newest)
            if times:
                self._newest[uuid] = max(times + ([newest] if newest is not None else []))


class _EtcdHealth:
    """``peerctl_etcd_up`` and the database's size, polled in the background."""

    def __init__(self, store, interval: float):
        self._store = store
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics:etcd", daemon=True)
        self.polled = threading.Event()
        self.db_size: int | None = None     # None: the last poll had no answer

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while True:
            try:
                self.db_size = space(self._store)["db_size"]
            except PeerctlError:
                self.db_size = None
            self.polled.set()
            if self._stopped.wait(self._interval):
                return

    def families(self):
        if not self.polled.is_set():
            return
        size = self.db_size
        yield GaugeMetricFamily("peerctl_etcd_up", "1 when etcd answered the last poll",
                                value=0 if size is None else 1)
        if size is not None:
            yield GaugeMetricFamily("peerctl_etcd_db_size_bytes",
                                    "Size of the answering member's database", value=size)


# -- the cluster's families, from the cache -------------------------------------------


def _automations(kvs: list[KV]) -> GaugeMetricFamily:
    """Every kind seen, with every state (zeros too: a series does not vanish)."""
    counts: dict[tuple[str, str], int] = {}
    for kv in kvs:
        task = readable(kv)
        if task is None:
            continue
        state = task["state"] if task["state"] in AUTOMATION_STATES else OTHER
        for each in AUTOMATION_STATES:
            counts.setdefault((task["kind"], each), 0)
        counts[(task["kind"], state)] = counts.get((task["kind"], state), 0) + 1
    family = GaugeMetricFamily("peerctl_automations",
                               "Automations kept in etcd (tasks/), by kind and state",
                               labels=["kind", "state"])
    for labels, count in sorted(counts.items()):
        family.add_metric(list(labels), count)
    return family


def _hosts(hosts: list[dict]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("peerctl_hosts", "Hosts by status, as hostlist shows them",
                               labels=["status"])
    for status, count in _tally((h["status"] for h in hosts), HOST_STATUSES).items():
        family.add_metric([status], count)
    return family


def _vms(vms: list[dict]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("peerctl_vms", "VMs by state, as vmlist shows them",
                               labels=["state"])
    for state, count in _tally((vm["state"] for vm in vms), VM_STATES).items():
        family.add_metric([state], count)
    return family


def _tally(values, known) -> dict[str, int]:
    counts = dict.fromkeys(known, 0)
    for value in values:
        value = value if value in counts else OTHER
        counts[value] = counts.get(value, 0) + 1
    return counts


def _placement(kvs: list[KV]):
    """Each root provider's (a host's) inventories, its nested providers'
    added in; capacity is what a claim may use: placement's own rule,
    ``(total - reserved) * allocation_ratio``."""
    providers = [p for p in (readable(kv) for kv in kvs) if p is not None]
    names = {p["uuid"]: p["name"] for p in providers}
    figures: dict[tuple[str, str], list[int]] = {}     # (host, rc) -> [capacity, used, reserved]
    for provider in providers:
        host = names.get(provider["root"], provider["name"])
        for rc, inventory in provider["inventories"].items():
            try:
                found = (capacity(inventory), provider["usages"].get(rc, 0),
                         inventory["reserved"])
            except (KeyError, TypeError):
                continue        # an inventory without its fields: nothing to say
            sums = figures.setdefault((host, rc), [0, 0, 0])
            for i, value in enumerate(found):
                sums[i] += value
    for index, (name, what) in enumerate((
            ("capacity", "What claims may use: (total - reserved) * allocation_ratio"),
            ("used", "What allocations hold"),
            ("reserved", "What the inventory keeps back (a drained host: all of it)"))):
        family = GaugeMetricFamily(f"peerctl_placement_{name}", what,
                                   labels=["host", "resource_class"])
        for (host, rc), sums in sorted(figures.items()):
            family.add_metric([host, rc], sums[index])
        yield family


# -- this host's domains, from libvirt at scrape time -----------------------------------


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


class _Domains:
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
