"""A singleton duty (janitor, reconciler, recoverer...) always has a peer
running it while peers live: a duty that crashes or is deposed campaigns
again instead of leaving its thread dead and the cluster without it."""
import threading

from engine.core import keys
from engine.core.duties import Singleton
from engine.core.session import Session
from engine.errors import Deposed
from tests.support import wait_for


class Duty:
    """Records who ran it; the first ``failures`` runs end as told."""

    def __init__(self, failures):
        self.failures = list(failures)
        self.runs: list[str] = []
        self.running: set[str] = set()
        self.overlaps = 0
        self.lock = threading.Lock()

    def on(self, host):
        def duty(stop, candidacy):
            with self.lock:
                self.runs.append(host)
                self.overlaps += bool(self.running)
                self.running.add(host)
                failure = self.failures.pop(0) if self.failures else None
            try:
                if failure is not None:
                    raise failure
                while not stop.wait(0.05):
                    candidacy.txn([], [])           # a leader's write: Deposed once deposed
            finally:
                with self.lock:
                    self.running.discard(host)
        return duty


def _run_singletons(store, duty, hosts):
    sessions = [Session(store, 10) for _ in hosts]
    singletons = [Singleton(store, session, host, "test-duty", duty.on(host)).start()
                  for session, host in zip(sessions, hosts)]
    return sessions, singletons


def _stop(sessions, singletons):
    for singleton in singletons:
        singleton.stop()
    for session in sessions:
        session.close()


def test_a_duty_that_crashes_is_taken_up_again(store):
    duty = Duty([RuntimeError("an engine bug"), RuntimeError("the same bug, elsewhere")])
    sessions, singletons = _run_singletons(store, duty, ["h1", "h2"])
    try:
        wait_for(lambda: len(duty.runs) >= 3 and duty.running, timeout=20,
                 what="the duty running again after two crashes")
        assert duty.overlaps == 0
        assert all(s._thread.is_alive() for s in singletons)
    finally:
        _stop(sessions, singletons)


def test_a_deposed_leader_campaigns_again(store):
    duty = Duty([])
    sessions, singletons = _run_singletons(store, duty, ["h1"])
    try:
        wait_for(lambda: duty.running, what="h1 leading")
        kvs, _ = store.range(keys.singleton("test-duty"))
        store.delete(kvs[0].key)                    # deposed: its election key is gone
        wait_for(lambda: len(duty.runs) == 2 and duty.running, timeout=20,
                 what="h1 leading again after being deposed")
        assert singletons[0]._thread.is_alive()
    finally:
        _stop(sessions, singletons)


def test_a_duty_that_ends_deposed_campaigns_again(store):
    duty = Duty([Deposed("told so")])
    sessions, singletons = _run_singletons(store, duty, ["h1"])
    try:
        wait_for(lambda: len(duty.runs) == 2 and duty.running, timeout=20,
                 what="the duty again after Deposed")
    finally:
        _stop(sessions, singletons)
