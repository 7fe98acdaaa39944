"""The ``recoverer`` singleton learns of hosts dying and of restart
requests from watches, not from reading etcd several times a second: an
idle cluster costs it one whole read of ``hosts/`` every ``REREAD``
seconds, and a host whose lease goes is still recovered the fencing margin
after, a restart request served within a second of being written, and a
stop ends it at once (docs/ha.md)."""
import threading
import time

from engine.core import keys
from engine.core.duties import Singleton
from engine.core.registry import load_automations
from engine.core.session import Session
from engine.hypervisor.ha import recoverer as ha
from tests.support import wait_for

DEAD_VM = "3b0e7c1a-5d2f-4e8b-9c6a-1f2e3d4c5b6a"
CRASHED_VM = "8d9c0b1a-2e3f-4a5b-8c7d-6e5f4a3b2c1d"
MARGIN = 2.0
STARTS = 2        # each automation started reads hosts/ for its members


class HostsReads:
    """Counts the whole reads of ``hosts/`` made through ``store``."""

    def __init__(self, store, monkeypatch):
        self.count = 0
        self.lock = threading.Lock()
        real = store.range

        def range_(prefix, *args, **kwargs):
            if prefix == keys.host():
                with self.lock:
                    self.count += 1
            return real(prefix, *args, **kwargs)
        monkeypatch.setattr(store, "range", range_)


def _vm(host, uuid, name, **more):
    return {"host": host, "name": name, "uuid": uuid, "state": "shutoff", "ha": "restart",
            **more}


def test_a_watching_recoverer_recovers_a_dead_host_and_serves_a_restart_reading_little(
        store, monkeypatch):
    load_automations()
    doomed = store.grant(600)
    store.put(keys.host("h1"), {"host": "h1"}, doomed)
    store.put(keys.vm("h1", DEAD_VM), _vm("h1", DEAD_VM, "dead"))
    session = Session(store, 10)
    store.put(keys.host("h2"), {"host": "h2"}, session.lease)
    store.put(keys.vm("h2", CRASHED_VM), _vm("h2", CRASHED_VM, "crashed", crashed=True))
    reads = HostsReads(store, monkeypatch)
    started = time.monotonic()
    singleton = Singleton(store, session, "h2", "recoverer",
                          ha.recoverer(store, margin=MARGIN)).start()
    try:
        wait_for(lambda: reads.count >= 1, what="the recoverer's first read of hosts/")

        store.revoke(doomed)                    # h1's peer is gone
        revoked = time.monotonic()
        recovery = wait_for(lambda: store.get(keys.recovery("h1")), timeout=10,
                            what="the recovery of h1")
        took = time.monotonic() - revoked
        assert recovery.value["vms"] == 1
        assert MARGIN <= took < MARGIN + 1.0, f"h1 recovered {took:.2f} s after its lease went"

        asked = time.monotonic()
        store.put(keys.restart(CRASHED_VM), {"uuid": CRASHED_VM, "host": "h2",
                                             "name": "crashed", "why": "crashed",
                                             "time": time.time()})
        wait_for(lambda: (store.get(keys.restart(CRASHED_VM)).value or {}).get("automation"),
                 timeout=5, what="an ha_restart started for the crashed VM")
        assert time.monotonic() - asked < ha.RESTART_POLL + 0.5, "a restart request waited"

        elapsed = time.monotonic() - started
        assert reads.count <= 1 + STARTS + elapsed / ha.REREAD, \
            f"{reads.count} whole reads of hosts/ in {elapsed:.1f} s"
        stopping = time.monotonic()
        singleton.stop()
        assert time.monotonic() - stopping < 1.0, "the recoverer slept through its stop"
    finally:
        singleton.stop()
        session.close()
