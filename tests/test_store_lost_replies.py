"""A write whose reply is lost lands once.

When an etcd member dies with a transaction in flight, the client cannot
tell whether it was applied.  ``Store.txn_once`` tries a guarded write
again and, whenever its guard fails, asks its proof key whether an
earlier attempt wrote it.  Here the loss is injected at the one RPC door
(``Store._call``) of a real etcd, before or after the write reaches it; the
real thing, a leader member SIGKILLed under a stream of commands, is in
``test_etcd_members.py``.
"""
from __future__ import annotations

import pytest

from engine.core import api, keys
from engine.core.store import Put, Store, StoreUnavailable, absent
from engine.leases import admission
from engine.placement import open_placement
from tests.support.placement import make_provider


def lose_replies(store, monkeypatch, count, landed=True):
    """The next ``count`` writing transactions fail as if their member died:
    after etcd applied them (``landed``) or before they reached it."""
    real, lost = store._call, []

    def call(stub, method, request, read=None):
        if method != "Txn" or read or len(lost) >= count:
            return real(stub, method, request, read)
        lost.append(method)
        if landed:
            real(stub, method, request, read)
        raise StoreUnavailable("etcd at test unreachable (reply lost)")
    monkeypatch.setattr(store, "_call", call)
    return lost


def specs(store):
    return [kv.key for kv in store.range(keys.auto())[0] if kv.key.endswith("/spec")]


@pytest.fixture
def live_host(store):
    store.put(keys.host("h1"), {"host": "h1"}, store.grant(60))     # as a peer holds it


def test_an_automation_whose_reply_was_lost_is_created_once(store, monkeypatch, live_host):
    lost = lose_replies(store, monkeypatch, 1, landed=True)
    automation = api.start_automation(store, "ping", {"hosts": ["h1"], "rounds": 1})
    assert lost == ["Txn"]           # the retry's guard failed: the proof said it was ours
    assert specs(store) == [keys.spec(automation)]


def test_a_write_lost_before_it_reached_etcd_is_written_by_the_retry(store, monkeypatch,
                                                                      live_host):
    lost = lose_replies(store, monkeypatch, 3, landed=False)
    automation = api.start_automation(store, "ping", {"hosts": ["h1"], "rounds": 1})
    assert lost == ["Txn"] * 3
    assert specs(store) == [keys.spec(automation)]


def test_a_write_the_failover_sent_twice_is_known_for_its_own(store, monkeypatch, live_host):
    """The first member applied the write and died; the failover judged it
    unsent and sent it to the next member, whose guard failed: what
    ``Store._call`` answers is a plain refusal, with no lost reply to see."""
    real, sent = store._call, []

    def sent_twice(stub, method, request, read=None):
        if method == "Txn" and not read and not sent:
            sent.append(real(stub, method, request, read))     # applied, reply lost
        return real(stub, method, request, read)
    monkeypatch.setattr(store, "_call", sent_twice)
    automation = api.start_automation(store, "ping", {"hosts": ["h1"], "rounds": 1})
    assert sent[0].succeeded
    assert specs(store) == [keys.spec(automation)]


def test_a_guard_failing_after_a_lost_reply_is_not_taken_for_a_success(store, monkeypatch):
    lose_replies(store, monkeypatch, 1, landed=False)
    real, someone_else = store._call, Store(store.endpoints, store.cluster)

    def someone_else_writes_first(stub, method, request, read=None):
        if method == "Txn" and not read:
            someone_else.create("claim", {"by": "someone else"})
        return real(stub, method, request, read)
    monkeypatch.setattr(store, "_call", someone_else_writes_first)
    try:
        assert store.txn_once([absent("claim")], [Put("claim", {"by": "me"})],
                              proof="claim") is False
    finally:
        someone_else.close()
    assert store.get("claim").value == {"by": "someone else"}


def test_etcd_that_stays_unreachable_is_reported_after_the_deadline(store, monkeypatch):
    lost = lose_replies(store, monkeypatch, 10 ** 6, landed=False)
    with pytest.raises(StoreUnavailable):
        store.txn_once([absent("k")], [Put("k", 1)], proof="k", within=0.5)
    assert 3 <= len(lost) <= 7          # tried again every 0.1 s until the deadline
    assert store.get("k") is None


def test_a_lease_whose_grant_reply_was_lost_is_granted_once(store, monkeypatch):
    placement = open_placement(None, store)
    try:
        for name in ("host1", "host2"):
            make_provider(placement, name, {"VCPU": 8, "MEMORY_MB": 8192, "DISK_GB": 100})
            store.put(keys.host(name), {"host": name}, store.grant(60))
        lost = lose_replies(store, monkeypatch, 1, landed=True)
        now = 1_800_000_000.0
        record = admission.grant(store, placement, {
            "lease": "night", "kind": "hosts", "count": 2, "start": now,
            "end": now + 3600}, now=now)
        assert lost == ["Txn"]
        assert placement.races_lost == 0        # the lost reply is not a race lost
    finally:
        placement.close()
    assert store.get(keys.lease("night")).value == record
    entries = [kv.key for kv in store.range(keys.lease_calendar())[0]]
    assert len(entries) == 1 and entries[0].endswith("/night")
