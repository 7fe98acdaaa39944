"""The one rule for "which hosts are alive" (engine/core/hosts.py), against
a real etcd: a ``hosts/`` record counts only while a lease holds it and it
names its own host; anything else under ``hosts/`` is reported once, saying
why, and never counted.  A real peer's record is written when it says
something new, not on every tick: the lease alone keeps its host alive."""
from __future__ import annotations

import uuid

import pytest

from engine.core import hosts, keys, values
from engine.core.watch import PrefixWatch
from engine.peer import STATS_INTERVAL
from tests.support import wait_for, wait_until
from tests.support.cluster import ready_hosts
from tests.support.raw import put_raw

UNLEASED = "bound to no lease: no peer holds it, not a live host"
NAMELESS = "names no host ('host' is no name): not a live host"


def fresh(name: str) -> str:
    """A host name of this test only: a key is reported once per process."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def reported():
    """``{key: [why...]}`` of the keys the rule turned away."""
    seen = {}
    values.set_reporter(lambda key, why, skipped: seen.setdefault(key, []).append(why))
    yield seen
    values.set_reporter(None)


def test_a_leased_record_naming_its_host_is_alive(store, reported):
    store.put(keys.host("host1"), {"host": "host1", "vcpus": 4}, store.grant(60))
    assert hosts.live_hosts(store) == {"host1": {"host": "host1", "vcpus": 4}}
    assert hosts.live_host_names(store) == {"host1"}
    assert reported == {}


def test_a_record_no_lease_holds_is_no_live_host_whatever_it_says(store, reported):
    named, numbered = fresh("ghost"), fresh("ghost")
    store.put(keys.host("host1"), {"host": "host1"}, store.grant(60))
    store.put(keys.host(named), {"host": named, "vcpus": 4})
    store.put(keys.host(numbered), {"host": 7})
    assert hosts.live_host_names(store) == {"host1"}
    assert hosts.live_host_names(store) == {"host1"}        # reported once, not per read
    assert reported == {keys.host(named): [UNLEASED], keys.host(numbered): [UNLEASED]}


def test_a_leased_record_naming_another_host_or_none_is_no_live_host(store, reported):
    impostor, nameless, numbered = fresh("impostor"), fresh("nameless"), fresh("numbered")
    lease = store.grant(60)
    store.put(keys.host("host1"), {"host": "host1"}, lease)
    store.put(keys.host(impostor), {"host": "host1"}, lease)
    store.put(keys.host(nameless), {"vcpus": 4}, lease)
    store.put(keys.host(numbered), {"host": 7}, lease)
    assert hosts.live_host_names(store) == {"host1"}
    assert reported == {
        keys.host(impostor): [f"names host 'host1', not {impostor!r}: not a live host"],
        keys.host(nameless): [NAMELESS], keys.host(numbered): [NAMELESS]}


def test_bytes_that_are_no_record_are_no_live_host(store, etcd, reported):
    garbled = fresh("ghost")
    store.put(keys.host("host1"), {"host": "host1"}, store.grant(60))
    put_raw(etcd.url, f"/peerctl/{store.cluster}/{keys.host(garbled)}", b"\xc1garbage")
    assert hosts.live_host_names(store) == {"host1"}
    assert list(reported) == [keys.host(garbled)]


def test_a_host_whose_lease_is_revoked_is_alive_no_more(store, reported):
    lease = store.grant(60)
    store.put(keys.host("host1"), {"host": "host1"}, lease)
    store.put(keys.host("host2"), {"host": "host2"}, store.grant(60))
    store.revoke(lease)
    assert hosts.live_host_names(store) == {"host2"}
    assert reported == {}


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_real_peer_writes_its_record_when_it_changes_and_lives_by_its_lease(cluster, store):
    ready_hosts(cluster, store, ["host1"])
    booted = cluster.cli_json("boot", "quiet1", "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done", booted
    # the VM is in the record from the next tick on (what the host holds changed)
    record = wait_until(lambda: store.get(keys.host("host1")), lambda kv: kv.value["vms"] == 1,
                        timeout=3 * STATS_INTERVAL, what="the boot in host1's record")
    # a tick that finds nothing new writes nothing, and host1 stays alive
    watch = PrefixWatch(store, keys.host("host1"), record.mod_revision, exact=True).start()
    try:
        assert watch.get(timeout=STATS_INTERVAL + 1) is None
    finally:
        watch.stop()
    assert hosts.live_host_names(store) == {"host1"}
    assert cluster.cli_json("hostlist")[0]["alive"] is True
    # killed: down once its lease runs out (TTL 2 s), whatever the record said
    cluster.kill("host1")
    wait_for(lambda: not hosts.live_host_names(store), timeout=10, what="host1 down")
