"""Election order against the real etcd: the oldest candidate leads, and
each candidate waits on its predecessor only (no thundering herd)."""
import threading

from engine.core.election import Candidacy
from engine.core.session import Session
from tests.support import wait_for


def test_each_candidate_waits_on_its_predecessor_only(store):
    sessions = [Session(store, 10) for _ in range(3)]
    stop = threading.Event()
    try:
        first, second, third = (Candidacy(store, s, "elect-test/", f"c{n}")
                                for n, s in enumerate(sessions, 1))
        assert first.revision < second.revision < third.revision
        assert first.wait_until_leader(stop) and first.is_leader()

        waited_on = {second.key: [], third.key: []}       # candidate -> keys it waited on

        def recording(candidacy):
            original = candidacy._wait_for_delete

            def wait_for_delete(key, after_revision, stop):
                waited_on[candidacy.key].append(key)
                return original(key, after_revision, stop)
            candidacy._wait_for_delete = wait_for_delete

        leads = {}
        threads = []
        for candidacy in (second, third):
            recording(candidacy)
            thread = threading.Thread(target=lambda c=candidacy: leads.__setitem__(
                c.key, c.wait_until_leader(stop)), daemon=True)
            thread.start()
            threads.append(thread)
        wait_for(lambda: waited_on[second.key] and waited_on[third.key],
                 what="both followers waiting")
        assert waited_on == {second.key: [first.key], third.key: [second.key]}

        first.resign()                                  # #1 goes: #2 leads
        wait_for(lambda: second.key in leads, what="#2 to lead")
        assert leads[second.key] is True and second.is_leader()
        assert not third.is_leader() and third.key not in leads
        # #3 was not woken by #1's delete: it still waits on #2, having
        # waited on nothing else (a woken one re-checks and waits again).
        assert waited_on[third.key] == [second.key]

        second.resign()                                 # #2 goes: #3 leads
        threads[1].join(10)
        assert leads[third.key] is True and third.is_leader()
        assert waited_on[third.key] == [second.key]
    finally:
        stop.set()
        for session in sessions:
            session.close()
