"""The lease guard: a cluster singleton that tells a host lease when one of
its hosts dies.

Every :data:`INTERVAL` seconds it compares the hosts active leases hold
(``reserved/``) with the live host records; for each held host that is
gone it nudges the lease's automation once (``engine.core.api.nudge``),
whose worker then heals the lease (a replacement host, or ``degraded``).
A host that comes back and dies again is reported again.
"""
from __future__ import annotations

import threading

import structlog

from engine.core import api
from engine.core.hosts import live_host_names
from engine.core.store import StoreUnavailable

from . import records

__all__ = ["lease_guard", "INTERVAL"]

log = structlog.get_logger("peerctl.leases")

INTERVAL = 1.0


def lease_guard(store, interval: float = INTERVAL):
    def duty(stop: threading.Event, candidacy):
        told: set[tuple[str, str]] = set()
        while not stop.wait(interval):
            try:
                held = records.reserved_hosts(store)
                if not held and not told:
                    continue
                alive = live_host_names(store)
                gone = {(host, lease) for host, lease in held.items() if host not in alive}
                for host, lease in sorted(gone - told):
                    record = records.read(store, lease)
                    if record and record.get("automation"):
                        api.nudge(store, record["automation"], f"host {host} is gone")
                        log.info("lease_host_gone", lease=lease, host=host)
                told = gone
            except StoreUnavailable:
                continue
    return duty
