"""Claims of new consumers from several threads of one peer, placed together
and written in one transaction (engine/placement/together.py): never more
than fits, spread as one-by-one claims would spread them, and a batch that
cannot claim leaves every claim to the usual path.  A ``claim_vms`` step
hands its claims over from one thread (``claim_many``), and a peer killed
while writing them leaves each batch whole or absent, and a re-run of the
step claims each VM once."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from engine.core.store import Store
from engine.errors import RequestError
from engine.placement import Conflict, open_placement
from engine.placement.together import LIMIT, NewClaim, claim_many, claim_new
from tests.support import ROOT, revisions_since
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


def test_claims_handed_over_at_once_land_in_batches_of_the_limit(store):
    placement = open_placement("etcd", store)
    for name in "abcd":
        make_provider(placement, name, {"VCPU": 40})
    before = store.revision()
    placed = claim_many(store, [new(new_uuid()) for _ in range(2 * LIMIT)])
    assert len(revisions_since(store, before)) == 2     # one transaction per batch
    assert sorted(p["host"] for p in placed).count("a") == 2 * LIMIT // 4    # spread evenly
    assert {p["name"]: p["usages"] for p in placement.providers()} == {
        name: {"VCPU": 2 * LIMIT // 4} for name in "abcd"}


def test_a_claim_vms_step_writes_what_fits_in_one_transaction_and_refuses_the_rest(
        store, tmp_path):
    placement = open_placement("etcd", store)
    for name in "ab":
        make_provider(placement, name, {"VCPU": 3})
    host = new_host(tmp_path, store)
    consumers = [new_uuid() for _ in range(8)]
    claims = [{"consumer": c, "resources": {"VCPU": 1}} for c in consumers]
    claims[0]["hosts"] = "b"                        # a glob still holds
    replies = call(host, "claim_vms", claims=claims)["claims"]
    granted = {r["consumer"]: r["host"] for r in replies if "host" in r}
    assert replies[0]["host"] == "b"
    assert len(granted) == 6 and [r["consumer"] for r in replies] == consumers
    assert all("no host can fit" in r["error"] for r in replies if "error" in r)
    assert {p["name"]: p["usages"] for p in placement.providers()} == {
        "a": {"VCPU": 3}, "b": {"VCPU": 3}}
    revisions = {store.get(f"placement/consumer/{c}").mod_revision for c in granted}
    assert len(revisions) == 1                      # the six in one transaction

    again = call(host, "claim_vms", claims=claims)["claims"]       # the step run again
    assert {r["consumer"]: r["host"] for r in again if "host" in r} == granted
    assert sum(p["usages"]["VCPU"] for p in placement.providers()) == 6


# A peer's claim_vms steps, one after the other, each announcing its
# consumers on stdout right before the transaction that writes them.
CLAIMING_PEER = """
import sys, uuid
from engine.core.store import Put, Store
from tests.support.handlers import call, new_host
store = Store(sys.argv[1], sys.argv[2])
real_txn = store.txn
def announced_txn(compares, success=(), *args, **kwargs):
    consumers = [op.key.rsplit("/", 1)[1] for op in success
                 if isinstance(op, Put) and op.key.startswith("placement/consumer/")]
    if consumers:
        sys.stdout.write("txn " + " ".join(consumers) + "\\n")
        sys.stdout.flush()
    return real_txn(compares, success, *args, **kwargs)
store.txn = announced_txn
host = new_host(sys.argv[3], store)
while True:
    call(host, "claim_vms", claims=[{"consumer": str(uuid.uuid4()), "resources": "VCPU:1"}
                                    for _ in range(48)])
"""

KILL_ROUNDS = 6


def test_a_peer_killed_inside_its_claims_leaves_each_batch_whole_and_a_rerun_claims_once(
        etcd, cluster_name, tmp_path):
    """The claiming peer is SIGKILLed right after it announces a batch's
    transaction, KILL_ROUNDS times: that batch is held whole or not at
    all, usages are the sum of the allocations (none counted twice, none
    without its consumer), and the step run again holds each of its VMs
    exactly once."""
    store = Store(etcd.url, cluster_name)
    placement = open_placement("etcd", store)
    for name in "abcd":
        make_provider(placement, name, {"VCPU": 100000})
    host = new_host(tmp_path / "rerun", store)
    rng, outcomes = random.Random(), []
    for round_ in range(KILL_ROUNDS):
        peer = subprocess.Popen([sys.executable, "-c", CLAIMING_PEER, etcd.url, cluster_name,
                                 str(tmp_path / f"peer{round_}")],
                                cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
        try:
            line = ""
            for _ in range(rng.randint(2, 8)):      # let some whole batches land
                line = peer.stdout.readline()
                assert line.startswith("txn "), peer.stderr.read()[-2000:] if not line else line
            time.sleep(rng.uniform(0, 0.0005))      # the announced batch: in flight
        finally:
            peer.send_signal(signal.SIGKILL)
            peer.wait()
            # The peer may have gone on until the kill (a batch that lost a
            # race is claimed again in a transaction of its own): the one in
            # flight is the last it announced.
            line = ([line] + [later for later in peer.stdout if later.startswith("txn ")])[-1]
            peer.stdout.close()
            peer.stderr.close()
        batch = line.split()[1:]
        held = [bool(placement.allocations(c)["allocations"]) for c in batch]
        assert all(held) or not any(held), f"a batch landed in part: {held}"
        outcomes.append(all(held))
        check_usages_are_the_allocations(placement)

        again = call(host, "claim_vms", claims=[{"consumer": c, "resources": "VCPU:1"}
                                                for c in batch])["claims"]
        assert all("host" in reply for reply in again), again
        assert all(placement.allocations(c)["allocations"] for c in batch)
        check_usages_are_the_allocations(placement)
    print("the killed batch had landed:", outcomes)
    store.close()


def check_usages_are_the_allocations(placement):
    held = placement.all_allocations()
    per_provider: dict = {}
    for consumer in held:
        [(rp, resources)] = consumer["allocations"].items()
        assert resources == {"VCPU": 1}, consumer
        per_provider[rp] = per_provider.get(rp, 0) + 1
    for provider in placement.providers():
        assert provider["usages"].get("VCPU", 0) == per_provider.get(provider["uuid"], 0)
