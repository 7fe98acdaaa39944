"""HA restart: the cluster singleton that recovers a dead host's HA VMs.

A host is dead when its peer's lease has expired (``hosts/<host>`` is
gone).  The ``recoverer`` singleton follows ``hosts/`` with a watch and
notices it as etcd deletes the key (a watch that broke resumes from the last
revision seen; one whose revision was compacted reads the prefix whole
again), and reads ``hosts/`` whole again every :data:`REREAD` seconds
besides, so a watch gone quiet delays it by no more than that; it
waits the fencing margin (``ha_margin``: by then the host's guard has
stopped its HA VMs, see :mod:`engine.hypervisor.ha.guard`), and, if the host is
still dead, starts one ``recover`` automation (``automations/ha.py``)
for its VMs whose policy is ``restart``.  The automation and
``recovery/<host>``, which names it, are one fenced write: a deposed
recoverer starts nothing, and while that automation runs no second one
starts for the host.  A recovery that left VMs behind (no room anywhere) is
tried again :data:`RETRY` seconds after it ended.

The same singleton serves the ``restart/<uuid>`` requests that live hosts'
publishers write for HA VMs found crashed or missing there
(:func:`serve_restarts`), within :data:`RESTART_POLL` seconds of being
written (a watch on ``restart/``, looked at as the singleton wakes: news
of ``hosts/``, a due look, its stop, or that long at most), and again every
:data:`RESTART_POLL` seconds while any is left: one ``ha_restart``
automation per VM, in place when its domain is there, else elsewhere; at
most :data:`MAX_RESTARTS` within :data:`RESTART_WINDOW`.

A host that comes back within the margin recovers nothing (flapping): its
VMs stay its own.  The margin is counted from the moment this recoverer saw
the host dead, so a new recoverer (the old one died with its host) waits a
whole margin again: late, never early.
"""
from __future__ import annotations

import os
import threading
import time

import structlog

from engine.core import api, keys
from engine.core.hosts import is_live_record
from engine.core.store import Delete, Put, Store, StoreUnavailable, absent, modified_at
from engine.core.watch import PrefixWatch, Reset
from engine.core.values import readable
from engine.errors import Deposed
from engine.hypervisor.domain import shapes  # noqa: F401  (declares vms/, recovery/, restart/)
from engine.hypervisor.domain.harules import MAX_RESTARTS, RESTART_WINDOW, restarts_within, \
    wants_restart

__all__ = ["recoverer", "ha_vms", "serve_restarts", "DEFAULT_MARGIN", "POLL", "RETRY"]

log = structlog.get_logger("peerctl.ha")

DEFAULT_MARGIN = 3.0        # seconds after a host's lease expired
POLL = 0.25                 # the pause after etcd failed to answer
REREAD = 5.0                # how often hosts/ and restart/ are read whole, watched or not
RETRY = float(os.environ.get("PEERCTL_HA_RETRY", "30"))  # after a recovery that left VMs behind
RECHECK = 5.0               # how often a dead host's HA VMs are looked at again
_KNOWN_EVERY = 10.0         # how often every host ever seen is read again
RESTART_POLL = 1.0          # how often restart/ requests are looked at while any is left


def ha_vms(store: Store, host: str) -> list[dict]:
    """``host``'s VM records whose policy is ``restart``, but those disowned
    there (``disowned/<host>/<uuid>``: restarted elsewhere already, or left
    for an alternate by ``boot``).  A hung or partitioned peer may publish
    such a record again before it notices its lease is gone; it names a
    copy that is no longer the VM."""
    gone = _names(store, keys.disowned(host))
    return [vm for vm in (readable(kv) for kv in store.range(keys.vm(host))[0])
            if vm is not None and vm.get("ha") == "restart" and vm["uuid"] not in gone]


def _names(store: Store, prefix: str) -> set[str]:
    return {keys.suffix(kv.key, prefix) for kv in store.range(prefix, keys_only=True)[0]}


def _may_start(store: Store, host: str, now: float):
    """``(go, kv)``: whether a recovery of ``host`` may start now, and its
    ``recovery/`` record as read (for the write's guard)."""
    kv = store.get(keys.recovery(host))
    record = readable(kv)
    if record is None:
        return kv is None, kv           # an unreadable record blocks: scrub it
    status = readable(store.get(keys.status(record["automation"]))) or {}
    state = status.get("state", "done" if status == {} else "running")
    if state not in keys.TERMINAL_STATES:
        return False, kv
    ended = status.get("updated") or record.get("time") or 0
    return now - ended >= RETRY, kv


def start_recovery(store: Store, candidacy, host: str, vms: list[dict]) -> str | None:
    """Start the ``recover`` automation for ``vms`` of dead ``host``, fenced
    by ``candidacy``; None when one runs already or ended too recently."""
    go, kv = _may_start(store, host, time.time())
    if not go:
        return None
    targets = [{"name": vm["name"], "uuid": vm["uuid"], "host": host} for vm in vms]
    automation_id, compares, ops = api.automation_ops(store, "recover",
                                                      {"host": host, "vms": targets})
    guard = absent(keys.recovery(host)) if kv is None else modified_at(kv.key, kv.mod_revision)
    record = {"host": host, "automation": automation_id, "time": time.time(),
              "vms": len(targets)}
    if not candidacy.txn([*compares, guard], [*ops, Put(keys.recovery(host), record)]).succeeded:
        return None
    log.warning("host_recovery_started", host=host, automation=automation_id, vms=len(targets))
    return automation_id


def serve_restarts(store: Store, candidacy, live: set[str], now: float) -> list[str]:
    """Act on the ``restart/<uuid>`` requests of live hosts' publishers:
    start an ``ha_restart`` automation for each HA VM still down or missing
    on a live host, one at a time per VM (the automation is named in the
    request, in the same fenced write that starts it; a failed one is tried
    again :data:`RETRY` seconds after it ended), at most
    :data:`MAX_RESTARTS` within :data:`RESTART_WINDOW` (then the request is
    marked ``gave_up`` and the VM left as it is); a request whose VM is up
    again, gone, or no longer HA is dropped.  The automations started."""
    started = []
    for kv in store.range(keys.restart())[0]:
        request = readable(kv)
        if request is None:
            continue                # left for ``peerctl scrub``
        if request["host"] not in live:
            continue                # a dead host's VMs are the host recovery's
        record = readable(store.get(keys.vm(request["host"], request["uuid"])))
        status = _status(store, request.get("automation"))
        if status is not None and status["state"] not in keys.TERMINAL_STATES:
            continue
        if not wants_restart(record):
            store.txn([modified_at(kv.key, kv.mod_revision)], [Delete(kv.key)])
            continue
        if status is not None and now - (status.get("updated") or request.get("time") or 0) \
                < RETRY:
            continue
        if restarts_within(record, now) >= MAX_RESTARTS:
            if not request.get("gave_up"):
                store.txn([modified_at(kv.key, kv.mod_revision)],
                          [Put(kv.key, {**request, "gave_up": True, "time": now})])
                log.error("vm_restart_given_up", host=request["host"], uuid=request["uuid"],
                          vm=record.get("name"), restarts=MAX_RESTARTS, window=RESTART_WINDOW)
            continue
        vm = {"name": record["name"], "uuid": record["uuid"], "host": record["host"],
              "why": request.get("why")}
        automation_id, compares, ops = api.automation_ops(store, "ha_restart", {"vm": vm})
        update = {**request, "automation": automation_id, "time": now}
        update.pop("gave_up", None)
        if candidacy.txn([*compares, modified_at(kv.key, kv.mod_revision)],
                         [*ops, Put(kv.key, update)]).succeeded:
            log.warning("vm_restart_started", host=vm["host"], vm=vm["name"],
                        uuid=vm["uuid"], why=vm["why"], automation=automation_id)
            started.append(automation_id)
    return started


def _status(store: Store, automation_id) -> dict | None:
    """The automation's status (``state`` running while it cannot be read,
    done once it is gone), or None when there is no automation."""
    if not automation_id:
        return None
    kv = store.get(keys.status(automation_id))
    if kv is None:
        return {"state": "done"}        # ended long ago, cleaned up since
    status = readable(kv) or {}
    return {**status, "state": status.get("state", "running")}


class _Followed:
    """A prefix's keys as etcd has them: read whole (:meth:`read`), then
    kept current from a watch started at that read's revision
    (:meth:`follow`); an event the last whole read already saw is skipped,
    and a compacted watch's Reset replaces what is kept unless a later
    read did."""

    def __init__(self, store: Store, prefix: str):
        self.store, self.prefix = store, prefix
        self.kvs: dict = {}
        self.revision = 0           # of the last whole read (or Reset)
        self.read_at = float("-inf")
        self.watch: PrefixWatch | None = None

    def read(self) -> None:
        kvs, revision = self.store.range(self.prefix)
        self.kvs, self.revision = {kv.key: kv for kv in kvs}, revision
        self.read_at = time.monotonic()
        if self.watch is None:
            self.watch = PrefixWatch(self.store, self.prefix, revision).start()

    def follow(self, timeout: float) -> bool:
        """Apply what the watch says, waiting up to ``timeout`` for news;
        whether anything changed."""
        changed = False
        for batch in self.watch.drain(timeout) if self.watch else []:
            if isinstance(batch, Reset):
                if batch.revision >= self.revision:
                    self.kvs, self.revision = {kv.key: kv for kv in batch.kvs}, batch.revision
                    changed = True
                continue
            for event in batch:
                if event.kv.mod_revision <= self.revision:
                    continue            # the last whole read has it already
                if event.kind == "put":
                    self.kvs[event.kv.key] = event.kv
                else:
                    self.kvs.pop(event.kv.key, None)
                changed = True
        return changed

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()


def _wake_on(stop: threading.Event, watch: PrefixWatch) -> None:
    """A stop wakes a reader waiting on ``watch`` (an empty batch: no news)."""
    threading.Thread(target=lambda: (stop.wait(), watch.events.put([])), daemon=True,
                     name="recoverer-stop").start()


def _live(hosts: _Followed) -> set[str]:
    """The live hosts' names (the rule of :mod:`engine.core.hosts`)."""
    return {keys.suffix(kv.key, keys.host()) for kv in hosts.kvs.values() if is_live_record(kv)}


def recoverer(store: Store, margin: float = DEFAULT_MARGIN, poll: float = POLL):
    """The singleton's duty (see the module docstring)."""
    def duty(stop: threading.Event, candidacy):
        due: dict[str, float] = {}      # dead host -> when to look at its VMs
        known: set[str] = set()
        known_read = restarts_due = 0.0
        hosts, restarts = _Followed(store, keys.host()), _Followed(store, keys.restart())
        try:
            while not stop.is_set():
                try:
                    now = time.monotonic()
                    if now - hosts.read_at >= REREAD:
                        first = hosts.watch is None
                        hosts.read()
                        if first:
                            _wake_on(stop, hosts.watch)     # a stop ends the wait below
                    else:
                        wake = min([known_read + _KNOWN_EVERY, hosts.read_at + REREAD,
                                    restarts.read_at + REREAD, *due.values(),
                                    *([restarts_due] if restarts.kvs else [])])
                        hosts.follow(min(max(wake - now, 0.0), RESTART_POLL))
                        if stop.is_set():
                            return
                    now = time.monotonic()
                    live = _live(hosts)
                    if now - known_read >= _KNOWN_EVERY:
                        known, known_read = _names(store, keys.host_config()), now
                    known |= live
                    for host in set(due) - known:
                        del due[host]           # forgotten by the cluster
                    for host in live & set(due):
                        del due[host]
                        log.info("host_back", host=host)
                    for host in known - live:
                        if now < due.setdefault(host, now + margin):
                            continue
                        due[host] = now + RECHECK
                        vms = ha_vms(store, host)
                        if vms:
                            start_recovery(store, candidacy, host, vms)
                    if now - restarts.read_at >= REREAD:
                        restarts.read()
                        asked = bool(restarts.kvs)
                    else:
                        asked = restarts.follow(0)
                    if asked or (restarts.kvs and now >= restarts_due):
                        serve_restarts(store, candidacy, live, time.time())
                        restarts_due = now + RESTART_POLL
                except Deposed:
                    return          # the new recoverer carries on
                except StoreUnavailable as exc:
                    log.warning("recoverer_unavailable", error=str(exc))
                    stop.wait(poll)
        finally:
            hosts.stop()
            restarts.stop()
    return duty
