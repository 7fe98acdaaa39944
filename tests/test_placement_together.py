"""Claims of new consumers from several threads of one peer, placed together
and written in one transaction (engine/placement/together.py): never more
than fits, spread as one-by-one claims would spread them, and a batch that
cannot claim leaves every claim to the usual path."""
from __future__ import annotations

import threading

import pytest

from engine.errors import RequestError
from engine.placement import Conflict, open_placement
from engine.placement.together import NewClaim, claim_new
from tests.support.handlers import call, new_host
from tests.support.placement import make_provider, new_uuid

OWNER = {"project": "p", "user": "u", "consumer_type": "INSTANCE"}


def new(consumer, query="VCPU:1", allowed=lambda host: True):
    return NewClaim(consumer, query, None, allowed, OWNER)


def test_claims_from_many_threads_land_together_and_never_overcommit(store, tmp_path):
    placement = open_placement("etcd", store)
    for name in "abcd":
        make_provider(placement, name, {"VCPU": 4})
    host = new_host(tmp_path, store)
    start, granted, refused = threading.Barrier(24), [], []

    def claimer():
        consumer = new_uuid()
        start.wait()
        try:
            granted.append(call(host, "claim", consumer=consumer, resources="VCPU:1"))
        except RequestError as exc:
            refused.append(str(exc))
    threads = [threading.Thread(target=claimer) for _ in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert len(granted) == 16 and len(refused) == 8
    assert all("no host can fit" in why for why in refused)
    assert {p["name"]: p["usages"] for p in placement.providers()} == {
        name: {"VCPU": 4} for name in "abcd"}
    revisions = {store.get(f"placement/consumer/{g['consumer']}").mod_revision for g in granted}
    assert len(revisions) < len(granted)            # some were written together


def test_a_batch_places_each_claim_on_the_usages_of_those_before_it(store):
    placement = open_placement("etcd", store)
    for name in "abcd":
        make_provider(placement, name, {"VCPU": 4})
    placed = placement.claim_new_together([new(new_uuid()) for _ in range(4)])
    assert sorted(p["host"] for p in placed) == ["a", "b", "c", "d"]     # spread

    small = open_placement("etcd", store)
    for name in "xy":
        make_provider(small, name, {"VCPU": 1, "MEMORY_MB": 64})
    placed = small.claim_new_together([new(new_uuid(), "MEMORY_MB:64") for _ in range(3)])
    assert sorted(p["host"] for p in placed[:2]) == ["x", "y"]
    assert placed[2] is None                        # nothing left: claimed alone, refused there


def test_a_consumer_holding_elsewhere_sends_the_whole_batch_the_usual_way(store, tmp_path):
    placement = open_placement("etcd", store)
    a = make_provider(placement, "a", {"VCPU": 4})
    make_provider(placement, "b", {"VCPU": 4})
    held, fresh = new_uuid(), new_uuid()
    placement.claim(held, {a["uuid"]: {"VCPU": 1}}, project="p", user="u")
    batch = [new(held, allowed=lambda host: host == "b"), new(fresh)]
    with pytest.raises(Conflict):
        placement.claim_new_together(batch)
    assert placement.allocations(fresh)["allocations"] == {}        # nothing claimed
    assert claim_new(store, batch[0]) is None       # alone, too: the usual way decides

    host = new_host(tmp_path, store)
    again = call(host, "claim", consumer=held, resources="VCPU:1")
    assert again["host"] == "a"                     # what it holds, unchanged
    assert call(host, "claim", consumer=fresh, resources="VCPU:1")["host"] in ("a", "b")
    assert sum(p["usages"].get("VCPU", 0) for p in placement.providers()) == 2


def test_releases_from_many_threads_land_together(store, tmp_path):
    placement = open_placement("etcd", store)
    a = make_provider(placement, "a", {"VCPU": 64})
    consumers = [new_uuid() for _ in range(24)]
    for consumer in consumers:
        placement.claim(consumer, {a["uuid"]: {"VCPU": 1}}, project="p", user="u")
    host = new_host(tmp_path, store)
    start = threading.Barrier(len(consumers))

    def releaser(consumer):
        start.wait()
        call(host, "release", consumer=consumer)
    threads = [threading.Thread(target=releaser, args=(c,)) for c in consumers]
    before = store.revision()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert placement.provider("a")["usages"] == {}
    assert all(placement.allocations(c)["allocations"] == {} for c in consumers)
    revisions = store.revision() - before
    assert revisions < len(consumers)               # some were written together
