"""A peer's lease, kept alive, with a signal for the moment it is lost.

Everything a peer holds in etcd that must vanish when it dies (its host
record, election candidacies, executor claims) is bound to this lease.  The
refresh runs every TTL/3, each one message on a keep-alive stream kept open
between renewals (:mod:`engine.core.lease_stream`); the session counts as
lost as soon as the lease may have expired on the server (no successful
refresh for a TTL) or etcd says it has.  Holders of leadership must stop at once on ``lost``: etcd-side fencing
makes their writes fail anyway, this just makes them stop trying.
"""
from __future__ import annotations

import threading
import time

import structlog

from .store import Store, StoreUnavailable

__all__ = ["Session"]

log = structlog.get_logger("peerctl.session")


class Session:
    def __init__(self, store: Store, ttl: int, on_renewed=None, adopt: int | None = None):
        """``on_renewed(valid_until)``, if given, is called after the grant
        and after every renewal with the CLOCK_MONOTONIC moment before which
        the lease cannot have expired on the server (its TTL counted from
        when the request was sent).  ``adopt`` is a lease a previous process
        of this peer handed over (``engine/releases/handover.py``): renewed
        and kept while it is still alive, else a new one is granted
        (``adopted`` says which)."""
        self.store = store
        self.ttl = ttl
        self.on_renewed = on_renewed
        sent = time.monotonic()
        self.adopted = False
        self.lease = None
        if adopt:
            try:
                remaining = store.keepalive(adopt)
            except StoreUnavailable:
                remaining = None
            if remaining:
                self.lease, self.adopted, ttl_left = adopt, True, remaining
        if self.lease is None:
            self.lease, ttl_left = store.grant(ttl), ttl
        self.first_renewal = time.time()
        self.lost = threading.Event()
        self._closed = threading.Event()
        self._valid_until = sent + ttl_left
        self._renewed()
        self._stream = store.keepalive_stream(self.lease)      # one gRPC stream, not one per renewal
        self._thread = threading.Thread(target=self._keepalive, daemon=True,
                                        name=f"lease:{self.lease:x}")
        self._thread.start()

    @property
    def alive(self) -> bool:
        return not self.lost.is_set() and time.monotonic() < self._valid_until

    def _keepalive(self):
        interval = max(self.ttl / 3.0, 0.2)
        while not self._closed.wait(interval):
            sent = time.monotonic()
            try:
                remaining = self._stream.renew()
            except StoreUnavailable:
                remaining = None
            except Exception as exc:    # a refusal or a bug: the lease runs out, said so
                log.warning("keepalive_failed", lease=f"{self.lease:x}", error=str(exc))
                remaining = None
            if remaining is not None and remaining > 0:
                self._valid_until = sent + remaining
                self._renewed()
            elif remaining is not None or time.monotonic() >= self._valid_until:
                log.warning("lease_lost", lease=f"{self.lease:x}",
                            reason="expired" if remaining is not None else "etcd unreachable")
                self.lost.set()
                self._stream.close()
                return

    def _renewed(self) -> None:
        if self.on_renewed is None:
            return
        try:
            self.on_renewed(self._valid_until)
        except Exception as exc:        # never the lease's concern
            log.warning("on_renewed_failed", error=str(exc))

    def renew(self) -> float:
        """Renew the lease now (a hand-over's last renewal): the wall-clock
        time it was renewed at."""
        sent = time.monotonic()
        remaining = self._stream.renew()
        if remaining:
            self._valid_until = sent + remaining
            self._renewed()
        return time.time()

    def close(self, revoke: bool = True) -> None:
        """End the session; revoking deletes every key bound to the lease now."""
        self._closed.set()
        self.lost.set()
        self._stream.close()
        if revoke:
            try:
                self.store.revoke(self.lease)
            except StoreUnavailable:
                pass
