"""The provider view candidates are computed from: one per store, brought up
to date by reading only what changed, and never staler than a full read.

Each scenario has a reader and a writer on two stores (two gRPC clients, two
views, as two peers have): whatever the writer did before the reader asks,
the reader's candidates show.  Every scenario runs twice: with the view of
a small cluster (one scan of every provider per query) and with that of a
large one (the buckets stamped since the last query, then what changed in
them)."""
from __future__ import annotations

import fnmatch

import msgpack
import pytest

from engine.core import values
from engine.core.store import Delete, Put, Store
from engine.placement import Conflict, open_placement, together
from engine.placement import etcd as placement_etcd
from engine.placement import view as view_module
from engine.placement.together import NewClaim, owner_of
from engine.placement.view import BUCKET, RP, stamped, view_of
from tests.support.placement import make_provider, new_uuid
from tests.support.raw import put_raw

COMPUTE = {"VCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 100}
P = {"project": "proj", "user": "alice"}


@pytest.fixture(params=["scan", "buckets"])
def two(request, etcd, cluster_name, monkeypatch):
    """(reader, writer) placements of one cluster on two stores; the view of
    a small cluster, or of a large one (from one provider on)."""
    if request.param == "buckets":
        monkeypatch.setattr(view_module, "BUCKETS_FROM", 1)
    stores = [Store(etcd.url, cluster_name) for _ in range(2)]
    yield tuple(open_placement("etcd", s) for s in stores)
    for s in stores:
        s.close()


def hosts(placement, query="VCPU:1", **kw):
    return sorted(c["host"] for c in placement.candidates(query, **kw))


def test_the_reader_sees_every_change_the_writer_made(two):
    reader, writer = two
    a = make_provider(writer, "a", COMPUTE)
    assert hosts(reader) == ["a"]                   # first read: everything
    b = make_provider(writer, "b", COMPUTE)
    assert hosts(reader) == ["a", "b"]              # created
    writer.set_traits(b["uuid"], ["CUSTOM_FAST"])
    assert hosts(reader, required="CUSTOM_FAST") == ["b"]       # traits changed
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 4}}, **P)
    assert hosts(reader) == ["b"]                   # usage changed: a is full
    writer.set_inventory(a["uuid"], {**COMPUTE, "VCPU": 8})
    assert hosts(reader, "VCPU:4") == ["a", "b"]    # inventory grew
    writer.delete_provider(b["uuid"])
    assert hosts(reader) == ["a"]                   # deleted: seen by the count
    c = make_provider(writer, "c", COMPUTE)
    assert hosts(reader) == ["a", "c"]
    writer.drain(c["uuid"])
    assert hosts(reader) == ["a"]                   # drained: reserved = total


def test_a_sharing_provider_joined_later_is_reached_by_the_next_query(two):
    """Who is in which tree is kept between queries (the layout): a change
    of aggregates or traits makes the next query compute it again."""
    reader, writer = two
    a = make_provider(writer, "a", {"VCPU": 4, "MEMORY_MB": 4096})
    assert hosts(reader, "VCPU:1,DISK_GB:10") == []          # a has no disk
    disk = make_provider(writer, "nas", {"DISK_GB": 1000})
    aggregate = new_uuid()
    writer.set_aggregates(a["uuid"], [aggregate])
    writer.set_aggregates(disk["uuid"], [aggregate])
    assert hosts(reader, "VCPU:1,DISK_GB:10") == []          # not shared yet
    writer.set_traits(disk["uuid"], ["MISC_SHARES_VIA_AGGREGATE"])
    [found] = reader.candidates("VCPU:1,DISK_GB:10")
    assert found["host"] == "a"
    assert found["allocations"] == {a["uuid"]: {"VCPU": 1}, disk["uuid"]: {"DISK_GB": 10}}


def test_what_is_derived_from_the_documents_is_made_once_per_version(two):
    reader, writer = two
    a = make_provider(writer, "a", COMPUTE)
    made = []

    def names(docs):
        made.append(len(docs))
        return sorted(doc["name"] for doc in docs.values())
    view = view_of(reader.store)
    assert view.derived(names)[1] == ["a"]
    assert view.derived(names)[1] == ["a"] and made == [1]      # nothing changed: kept
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 1}}, **P)
    docs, value = view.derived(names)
    assert made == [1, 1] and docs[a["uuid"]]["usages"]["VCPU"] == 1


def test_what_is_derived_from_the_structure_is_kept_until_a_provider_moves(two):
    reader, writer = two
    a = make_provider(writer, "a", COMPUTE)
    made = []

    def roots(docs):
        made.append(len(docs))
        return sorted((doc["name"], tuple(doc["traits"])) for doc in docs.values())
    view = view_of(reader.store)
    assert view.derived(roots, of_structure=True)[1] == [("a", ())]
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 1}}, **P)
    writer.set_inventory(a["uuid"], {**COMPUTE, "VCPU": 8})
    docs, _ = view.derived(roots, of_structure=True)
    assert made == [1] and docs[a["uuid"]]["usages"]["VCPU"] == 1      # usages: kept
    writer.set_traits(a["uuid"], ["CUSTOM_FAST"])
    assert view.derived(roots, of_structure=True)[1] == [("a", ("CUSTOM_FAST",))]
    b = make_provider(writer, "b", COMPUTE)
    assert len(view.derived(roots, of_structure=True)[1]) == 2
    writer.delete_provider(b["uuid"])
    assert view.derived(roots, of_structure=True)[1] == [("a", ("CUSTOM_FAST",))]
    assert made == [1, 1, 2, 1]


def test_a_query_asked_again_sees_each_changed_provider_weighed_again(two):
    """The weights of one query are kept per provider document: what
    changed is weighed again, by usage or by trait, and nothing else."""
    reader, writer = two
    a, b = (make_provider(writer, name, COMPUTE) for name in ("a", "b"))

    def weights(query="VCPU:1", **kw):
        return {c["host"]: c["weight"] for c in reader.candidates(query, **kw)}
    assert weights() == {"a": 0.75, "b": 0.75}
    assert weights(required="!CUSTOM_SLOW") == {"a": 0.75, "b": 0.75}
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 2}}, **P)
    assert weights() == {"a": 0.25, "b": 0.75}
    writer.set_traits(b["uuid"], ["CUSTOM_SLOW"])
    assert weights(required="!CUSTOM_SLOW") == {"a": 0.25}
    assert weights() == {"a": 0.25, "b": 0.75}


def test_a_deletion_and_a_creation_between_two_queries(two):
    reader, writer = two
    make_provider(writer, "a", COMPUTE)
    b = make_provider(writer, "b", COMPUTE)
    assert hosts(reader) == ["a", "b"]
    writer.delete_provider(b["uuid"])
    make_provider(writer, "c", COMPUTE)             # same count as before
    assert hosts(reader) == ["a", "c"]


def test_a_garbled_provider_is_left_out_until_repaired(two, etcd, cluster_name):
    reader, writer = two
    make_provider(writer, "a", COMPUTE)
    b = make_provider(writer, "b", COMPUTE)
    assert hosts(reader) == ["a", "b"]
    key = f"/peerctl/{cluster_name}/placement/rp/{b['uuid']}"
    stamp = f"/peerctl/{cluster_name}/{BUCKET}{b['uuid'][:2]}"
    put_raw(etcd.url, key, b"\xc1")
    put_raw(etcd.url, stamp, msgpack.packb(0))                      # as every writer does
    assert hosts(reader) == ["a"]
    put_raw(etcd.url, key, msgpack.packb({"uuid": b["uuid"]}))     # still the wrong shape
    put_raw(etcd.url, stamp, msgpack.packb(0))
    assert hosts(reader) == ["a"]
    writer.store.txn([], stamped([Put(f"placement/rp/{b['uuid']}", b)]))    # repaired
    assert hosts(reader) == ["a", "b"]


def test_a_claim_from_a_stale_view_is_judged_on_a_fresh_read(two):
    reader, writer = two
    a = make_provider(writer, "a", COMPUTE)
    [candidate] = reader.candidates("VCPU:2")       # reader's view: a is empty
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 3}}, **P)
    with pytest.raises(Conflict) as refused:        # its compare fails, the fresh read says full
        reader.claim(new_uuid(), candidate["allocations"], consumer_generation=None, **P)
    assert refused.value.reason == "capacity_exceeded"
    assert writer.provider(a["uuid"])["usages"]["VCPU"] == 3
    assert reader.races_lost == 1
    reader.claim(new_uuid(), {a["uuid"]: {"VCPU": 1}}, consumer_generation=None, **P)  # fits
    assert writer.provider(a["uuid"])["usages"]["VCPU"] == 4


def test_documents_handed_out_never_change_under_the_caller(two):
    """Callers read the documents without the view's lock: a later query
    changes a copy, not what an earlier one returned."""
    reader, writer = two
    a = make_provider(writer, "a", COMPUTE)
    b = make_provider(writer, "b", COMPUTE)
    view = view_of(reader.store)
    before = view.providers()
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 1}}, **P)
    writer.delete_provider(b["uuid"])
    after = view.providers()
    assert set(before) == {a["uuid"], b["uuid"]} and before[a["uuid"]]["usages"] == {}
    assert set(after) == {a["uuid"]} and after[a["uuid"]]["usages"] == {"VCPU": 1}


@pytest.fixture
def large(etcd, cluster_name, monkeypatch):
    """(reader, writer, the reader's changed_since prefixes): a large view."""
    monkeypatch.setattr(view_module, "BUCKETS_FROM", 1)
    stores = [Store(etcd.url, cluster_name) for _ in range(2)]
    prefixes = []
    real = stores[0].changed_since

    def changed_since(prefix, revision):
        prefixes.append(prefix)
        return real(prefix, revision)
    stores[0].changed_since = changed_since
    yield (*(open_placement("etcd", s) for s in stores), prefixes)
    for s in stores:
        s.close()


def test_a_large_view_reads_the_stamps_then_only_the_buckets_they_name(large):
    reader, writer, prefixes = large
    a, b = (make_provider(writer, name, COMPUTE) for name in ("a", "b"))
    assert hosts(reader) == ["a", "b"]
    prefixes.clear()
    assert hosts(reader) == ["a", "b"]
    assert prefixes == [BUCKET]                     # nothing changed: one small read
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 4}}, **P)
    prefixes.clear()
    assert hosts(reader) == ["b"]
    assert prefixes == [BUCKET, RP + a["uuid"][:2]]
    writer.delete_provider(b["uuid"])
    assert hosts(reader) == []                      # deleted: that bucket's count


def test_a_writer_that_does_not_stamp_is_seen_by_the_next_scan_of_everything(
        large, monkeypatch):
    """An older peerctl during an upgrade, or etcdctl: a large view misses
    its write until it scans everything, every SCAN_EVERY seconds."""
    reader, writer, _ = large
    a = make_provider(writer, "a", COMPUTE)
    assert hosts(reader) == ["a"]
    full = writer.provider(a["uuid"])
    writer.store.put(RP + a["uuid"], {**full, "usages": {"VCPU": 4}})    # no stamp
    assert hosts(reader) == ["a"]
    monkeypatch.setattr(view_module, "SCAN_EVERY", 0.0)
    assert hosts(reader) == []


def test_every_provider_written_stamps_its_bucket():
    ops = [Put(RP + "ab12", {}), Delete(RP + "ab34"), Put(RP + "cd56", {}),
           Put("placement/consumer/ef78", {}), Delete("placement/name/x")]
    assert stamped(ops) == [*ops, Put(BUCKET + "ab", 0), Put(BUCKET + "cd", 0)]


def test_placements_on_one_store_share_its_view(etcd, cluster_name):
    store = Store(etcd.url, cluster_name)
    try:
        assert open_placement("etcd", store)._view is view_of(store)
        assert open_placement("etcd", store)._view is open_placement("etcd", store)._view
    finally:
        store.close()


def test_changed_since_reads_only_what_changed(store):
    store.put("p/a", 1)
    store.put("p/b", 2)
    before = store.revision()
    store.put("p/b", 3)
    store.put("p/c", 4)
    changed, count, revision = store.changed_since("p/", before + 1)
    assert sorted((kv.key, kv.value) for kv in changed) == [("p/b", 3), ("p/c", 4)]
    assert count == 3 and revision == store.revision()
    store.delete("p/a")
    changed, count, _ = store.changed_since("p/", revision + 1)
    assert changed == [] and count == 2


def test_shape_lookup_is_the_first_declared_glob_that_matches():
    import engine.hypervisor.domain.records  # noqa: F401  (declares the VM keys too)
    import engine.placement.etcd  # noqa: F401

    def first_match(key):
        for pattern, kind in values._SHAPES:
            if fnmatch.fnmatchcase(key, pattern):
                return kind
        return values.MAPPING
    samples = [p.replace("*", "x/y") for p, _ in values._SHAPES] + [
        p.replace("*", "") for p, _ in values._SHAPES] + [
        "auto/a/log/00000001", "auto/a/b/log/c", "tasks/x", "vms/h/u", "unknown/key", ""]
    for key in samples:
        assert values.shape_of(key) is first_match(key), key
    values.declare("zz-test/*", None)                   # a late declaration is found
    assert values.shape_of("zz-test/1") is None
    values._SHAPES.pop()
    values._matcher = None


def test_a_ranking_kept_over_changed_documents_finds_what_a_fresh_one_finds():
    """The memo of a query keeps its ranking of the hosts: round after round
    a few hosts change (usage up or down, a trait the query forbids, full),
    and the ranking, patched where they changed, gives the weights and the
    best hosts a query without memo computes."""
    import random
    import uuid as uuidlib

    from engine.placement.candidates import find_candidates, layout_of, order
    from engine.placement.model import normalize_inventories
    from engine.placement.query import parse_query
    rng = random.Random(7)
    inventories = normalize_inventories({"VCPU": 16})
    docs = {}
    for i in range(30):
        uuid = str(uuidlib.uuid4())
        docs[uuid] = {"uuid": uuid, "name": f"h{i:02d}", "root": uuid, "parent": None,
                      "traits": [], "aggregates": [], "inventories": inventories,
                      "usages": {"VCPU": rng.randint(0, 15)}}
    layout, memo = layout_of(docs), {}
    query = parse_query("VCPU:2", "!CUSTOM_SLOW")
    for _ in range(60):
        docs = dict(docs)
        for uuid in rng.sample(sorted(docs), 3):
            docs[uuid] = dict(docs[uuid], usages={"VCPU": rng.randint(0, 16)},
                              traits=["CUSTOM_SLOW"] if rng.random() < 0.2 else [])
        kept = {c["host"]: c["weight"] for c in find_candidates(docs, query, None, layout, memo)}
        fresh = {c["host"]: c["weight"] for c in find_candidates(docs, query)}
        assert kept == fresh
        best = order(find_candidates(docs, query, 5, layout, memo), limit=5)
        assert [c["weight"] for c in best] == sorted(fresh.values(), reverse=True)[:5]


# -- a writer's transaction carries the read: no read of its own before the next claim

@pytest.fixture
def small(etcd, cluster_name):
    """(reader, writer, the reads of providers the reader's store makes)."""
    stores = [Store(etcd.url, cluster_name) for _ in range(2)]
    reads = []
    changed_since, range_ = stores[0].changed_since, stores[0].range

    def counted_changed_since(prefix, revision):
        reads.append("what changed")
        return changed_since(prefix, revision)

    def counted_range(prefix, *args, **kwargs):
        if prefix == RP:
            reads.append("everything")
        return range_(prefix, *args, **kwargs)
    stores[0].changed_since, stores[0].range = counted_changed_since, counted_range
    yield (*(open_placement("etcd", s) for s in stores), reads)
    for s in stores:
        s.close()


def test_a_write_brings_the_writers_view_up_to_date_with_what_others_wrote(small):
    reader, writer, reads = small
    a, b = (make_provider(writer, name, COMPUTE) for name in ("a", "b"))
    view = view_of(reader.store)
    assert hosts(reader) == ["a", "b"]
    writer.claim(new_uuid(), {b["uuid"]: {"VCPU": 4}}, **P)    # unknown to the reader
    reader.claim(new_uuid(), {a["uuid"]: {"VCPU": 1}}, consumer_generation=None, **P)
    reads.clear()
    docs = view.providers(max_age=60)
    assert reads == []                              # the claim's transaction read it
    assert docs[a["uuid"]]["usages"] == {"VCPU": 1} and docs[b["uuid"]]["usages"] == {"VCPU": 4}
    view.providers(max_age=1e-9)                    # older than that: read again
    view.providers()                                # no age given: read at the call
    assert reads == ["what changed", "what changed"]


def test_a_provider_another_writer_deleted_makes_the_next_read_a_whole_one(small):
    reader, writer, reads = small
    a, b = (make_provider(writer, name, COMPUTE) for name in ("a", "b"))
    view = view_of(reader.store)
    assert hosts(reader) == ["a", "b"]
    writer.delete_provider(b["uuid"])
    reader.claim(new_uuid(), {a["uuid"]: {"VCPU": 1}}, consumer_generation=None, **P)
    reads.clear()
    assert set(view.providers(max_age=60)) == {a["uuid"]}     # the count told: behind
    assert reads == ["what changed", "everything"]


@pytest.fixture
def patient(monkeypatch):
    """Claims placed on a view up to a minute old (however slow the machine)."""
    monkeypatch.setattr(placement_etcd, "CLAIM_VIEW_AGE", 60.0)


def test_a_claim_placed_on_a_recent_view_never_takes_what_another_writer_took(small, patient):
    reader, writer, _ = small
    a, b = (make_provider(writer, name, COMPUTE) for name in ("a", "b"))
    assert hosts(reader) == ["a", "b"]
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 4}}, **P)    # a is full: the reader's view
    only_a = NewClaim(new_uuid(), "VCPU:1", None, lambda host: host == "a", owner_of(P))
    with pytest.raises(Conflict) as refused:        # placed on a, lost the race, judged again
        reader.claim_new_together([only_a])
    assert refused.value.reason == "capacity_exceeded" and reader.races_lost == 1
    assert writer.allocations(only_a.consumer)["allocations"] == {}
    assert writer.provider(a["uuid"])["usages"] == {"VCPU": 4}
    # a peer's claim request: the batch gives up, the claim is then made alone
    assert together.claim_new(reader.store, only_a) is None


def test_a_claim_placed_on_a_recent_view_is_made_where_there_is_still_room(small, patient):
    reader, writer, reads = small
    a = make_provider(writer, "a", COMPUTE)
    assert hosts(reader) == ["a"]
    reader.claim(new_uuid(), {a["uuid"]: {"VCPU": 1}}, consumer_generation=None, **P)
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 2}}, **P)    # unknown to the reader
    reads.clear()
    [done] = reader.claim_new_together([NewClaim(new_uuid(), "VCPU:1", None,
                                                 lambda host: True, owner_of(P))])
    assert done["host"] == "a" and reader.races_lost == 1 and reads == []
    assert writer.provider(a["uuid"])["usages"] == {"VCPU": 4}


def test_a_claim_made_after_an_undrain_returns_sees_the_host_open(small, monkeypatch):
    """Claims place on a view up to CLAIM_VIEW_AGE old, and nothing they
    compare changes with an undrain: the undrain itself waits that long, so
    a boot that starts after it returns never misses the host."""
    monkeypatch.setattr(placement_etcd, "CLAIM_VIEW_AGE", 1.0)
    reader, writer, _ = small
    a, b = (make_provider(writer, name, COMPUTE) for name in ("a", "b"))
    writer.claim(new_uuid(), {a["uuid"]: {"VCPU": 2}}, **P)    # a is the busier
    writer.drain(b["uuid"])
    assert hosts(reader) == ["a"]                   # the reader's view: b drained
    writer.drain(b["uuid"], False)
    [done] = reader.claim_new_together([NewClaim(new_uuid(), "VCPU:1", None,
                                                 lambda host: True, owner_of(P))])
    assert done["host"] == "b"


def test_a_provider_asked_by_name_is_one_read_and_never_a_stale_one(store):
    placement = open_placement("etcd", store)
    first = make_provider(placement, "h1", COMPUTE)
    assert placement.provider("h1")["uuid"] == first["uuid"]
    reads = []
    original = store.get
    store.get = lambda key: reads.append(key) or original(key)
    assert open_placement("etcd", store).provider("h1")["uuid"] == first["uuid"]
    assert len(reads) == 1, f"the name was looked up again: {reads}"

    placement.delete_provider(first["uuid"])            # the name now names another provider
    second = make_provider(placement, "h1", COMPUTE)
    assert second["uuid"] != first["uuid"]
    assert open_placement("etcd", store).provider("h1")["uuid"] == second["uuid"]
    placement.delete_provider(second["uuid"])
    with pytest.raises(placement_etcd.NotFound):
        open_placement("etcd", store).provider("h1")
