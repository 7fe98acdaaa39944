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
- per-domain figures (only with ``libvirt_uri``) are read from libvirt at
  scrape time (:mod:`.domain_metrics`): run ``render`` off the event loop.

The cache is :class:`~.watched.WatchedKeys`.
"""
from __future__ import annotations

import threading

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.utils import floatToGoString

import engine.placement.etcd  # noqa: F401  (declares the shape of placement/ keys)
from engine.cluster import read_hosts, read_vms
from engine.core import keys
from engine.core.maintenance import space
from engine.core.store import KV
from engine.core.values import readable
from engine.errors import PeerctlError
from engine.hypervisor.domain.shapes import VM
from engine.placement.model import capacity

from .domain_metrics import Domains
from .watched import WatchedKeys

__all__ = ["ClusterMetrics", "CONTENT_TYPE", "DURATION_BUCKETS"]

log = structlog.get_logger("peerctl.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

TASKS, VMS, PROVIDERS = keys.task(), keys.vm(), keys.placement("rp/")
WATCHED = (TASKS, keys.host(), keys.host_config(), keys.drained(), keys.reserved(), VMS,
           keys.lock("vm/"), PROVIDERS, keys.verified())   # verified/: read_hosts reads it

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
        self._cache = WatchedKeys(store, WATCHED, self._changed)
        self._etcd = _EtcdHealth(store, etcd_poll)
        self._libvirt = Domains(libvirt_uri, host) if libvirt_uri else None
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
