"""The lease guard learns of a reserved host's death from a watch on
``hosts/``, not from reading etcd once a second: idle, it reads ``reserved/``
once every ``REREAD`` seconds, and a host whose lease goes has its lease
nudged at once; a stop ends it at once (docs/leases.md)."""
import threading
import time

from engine.core import keys
from engine.core.duties import Singleton
from engine.core.session import Session
from engine.leases import guard
from engine.leases import model  # noqa: F401  (declares the leases/ and reserved/ shapes)
from tests.support import wait_for


class ReservedReads:
    """Counts the reads of ``reserved/`` made through ``store``."""

    def __init__(self, store, monkeypatch):
        self.count = 0
        self.lock = threading.Lock()
        real = store.range

        def range_(prefix, *args, **kwargs):
            if prefix == keys.reserved():
                with self.lock:
                    self.count += 1
            return real(prefix, *args, **kwargs)
        monkeypatch.setattr(store, "range", range_)


def _wakes(store, automation):
    return store.range(keys.wake(automation))[0]


def test_a_reserved_host_that_dies_is_told_at_once_and_an_idle_guard_reads_little(
        store, monkeypatch):
    now = time.time()
    doomed = store.grant(600)
    store.put(keys.host("h1"), {"host": "h1"}, doomed)
    session = Session(store, 10)
    store.put(keys.host("h2"), {"host": "h2"}, session.lease)
    store.put(keys.lease("night"), {"lease": "night", "kind": "hosts", "start": now,
                                    "end": now + 3600, "state": "active",
                                    "automation": "lease-auto"})
    store.put(keys.reserved("h1"), {"host": "h1", "lease": "night"})
    reads = ReservedReads(store, monkeypatch)
    started = time.monotonic()
    singleton = Singleton(store, session, "h2", "lease-guard",
                          guard.lease_guard(store, reread=30.0)).start()
    try:
        wait_for(lambda: reads.count >= 1, what="the guard's first look")
        store.put(keys.host("h2"), {"host": "h2", "note": "a stats tick"}, session.lease)
        time.sleep(1.5)     # what is measured: how often an idle guard reads
        assert reads.count == 1, f"an idle guard read reserved/ {reads.count} times in 1.5 s"
        assert _wakes(store, "lease-auto") == []

        store.revoke(doomed)                    # h1's peer is gone
        revoked = time.monotonic()
        wait_for(lambda: _wakes(store, "lease-auto"), timeout=5,
                 what="the lease's automation nudged")
        assert time.monotonic() - revoked < 1.0, "the guard waited for its period"
        assert len(_wakes(store, "lease-auto")) == 1
        assert time.monotonic() - started < guard.REREAD * 6
        stopping = time.monotonic()
        singleton.stop()
        assert time.monotonic() - stopping < 2.0, "the guard's stop waited for its period"
    finally:
        singleton.stop()
        session.close()
