"""HA restart: the cluster singleton that recovers a dead host's HA VMs.

A host is dead when its peer's lease has expired (``hosts/<host>`` is
gone).  The ``recoverer`` singleton notices it within :data:`POLL` seconds,
waits the fencing margin (``ha_margin``: by then the host's guard has
stopped its HA VMs, see :mod:`engine.hypervisor.guard`), and, if the host is
still dead, starts one ``recover`` automation (``automations/ha.py``)
for its VMs whose policy is ``restart``.  The automation and
``recovery/<host>``, which names it, are one fenced write: a deposed
recoverer starts nothing, and while that automation runs no second one
starts for the host.  A recovery that left VMs behind (no room anywhere) is
tried again :data:`RETRY` seconds after it ended.

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
from engine.core.store import Put, Store, StoreUnavailable, absent, modified_at
from engine.core.values import readable
from engine.errors import Deposed
from engine.hypervisor import shapes  # noqa: F401  (declares vms/, recovery/)

__all__ = ["recoverer", "ha_vms", "DEFAULT_MARGIN", "POLL", "RETRY"]

log = structlog.get_logger("peerctl.ha")

DEFAULT_MARGIN = 3.0        # seconds after a host's lease expired
POLL = 0.25                 # how often live hosts are compared
RETRY = float(os.environ.get("PEERCTL_HA_RETRY", "30"))  # after a recovery that left VMs behind
RECHECK = 5.0               # how often a dead host's HA VMs are looked at again
_KNOWN_EVERY = 10.0         # how often every host ever seen is read again


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


def recoverer(store: Store, margin: float = DEFAULT_MARGIN, poll: float = POLL):
    """The singleton's duty (see the module docstring)."""
    def duty(stop: threading.Event, candidacy):
        due: dict[str, float] = {}      # dead host -> when to look at its VMs
        known: set[str] = set()
        known_read = 0.0
        while not stop.wait(poll):
            try:
                now = time.monotonic()
                live = _names(store, keys.host())
                if now - known_read >= _KNOWN_EVERY:
                    known, known_read = _names(store, keys.host_config()), now
                known |= live
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
            except Deposed:
                return          # the new recoverer carries on
            except StoreUnavailable as exc:
                log.warning("recoverer_unavailable", error=str(exc))
    return duty
