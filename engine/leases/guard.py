"""The lease guard: a cluster singleton that tells a host lease when one of
its hosts dies.

It compares the hosts active leases hold (``reserved/``) with the live host
records; for each held host that is gone it nudges the lease's automation
once (``engine.core.api.nudge``), whose worker then heals the lease (a
replacement host, or ``degraded``).  A host that comes back and dies again
is reported again.

It looks when a host may have died, and every :data:`REREAD` seconds
besides: a watch on ``hosts/`` wakes it as etcd deletes a host's key (its
lease expired) or a put leaves a record that is no live host's (a put of a
live record wakes nobody); a watch that broke resumes from the last revision
seen, one whose revision was compacted reads the prefix again (a wake-up
either way).  The periodic look catches what no ``hosts/`` event announces
(a reservation written for a host already gone) and a watch gone quiet.
Idle, it reads etcd twice per :data:`REREAD` (once when no lease holds a
host), not once a second; its stop wakes it at once.
"""
from __future__ import annotations

import threading

import structlog

from engine.core import api, keys
from engine.core.hosts import live_host_names, why_not_live
from engine.core.store import StoreUnavailable
from engine.core.watch import PrefixWatch

from . import records

__all__ = ["lease_guard", "REREAD"]

log = structlog.get_logger("peerctl.leases")

REREAD = 5.0                # seconds between looks when no hosts/ event wakes it
RETRY = 1.0                 # the pause after etcd failed to answer the watch's start


def _still_live(event) -> bool:
    """An event that cannot mean a host died: a put of a live record."""
    return event.kind == "put" and why_not_live(event.kv) is None


def _tell(store, told: set) -> set:
    """Nudge the leases whose held host is gone and was not told yet; the
    (host, lease) pairs gone now."""
    held = records.reserved_hosts(store)
    if not held and not told:
        return told
    alive = live_host_names(store)
    gone = {(host, lease) for host, lease in held.items() if host not in alive}
    for host, lease in sorted(gone - told):
        record = records.read(store, lease)
        if record and record.get("automation"):
            api.nudge(store, record["automation"], f"host {host} is gone")
            log.info("lease_host_gone", lease=lease, host=host)
    return gone


def lease_guard(store, reread: float = REREAD):
    def duty(stop: threading.Event, candidacy):
        told: set[tuple[str, str]] = set()
        watch = None
        try:
            while not stop.is_set():
                if watch is None:
                    try:
                        _, revision = store.range(keys.host(), keys_only=True)
                    except StoreUnavailable:
                        stop.wait(RETRY)
                        continue
                    watch = PrefixWatch(store, keys.host(), revision, quiet=_still_live).start()
                    # A stop ends the wait below (an empty batch: no news).
                    threading.Thread(target=lambda w=watch: (stop.wait(), w.events.put([])),
                                     daemon=True, name="lease-guard-stop").start()
                try:
                    told = _tell(store, told)
                except StoreUnavailable:
                    pass
                watch.drain(reread)
        finally:
            if watch is not None:
                watch.stop()
    return duty
