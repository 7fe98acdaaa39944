"""The placement contract: every test runs against the etcd backend and a
real OpenStack Placement, and both must answer alike."""
from __future__ import annotations

import pytest

from engine.placement import Conflict, NotFound, PlacementError
from tests.support.placement import (full_state, make_provider, new_uuid, placement,  # noqa: F401
                                     placement_server)

COMPUTE = {"VCPU": 8, "MEMORY_MB": 8192, "DISK_GB": 100}
P = {"project": "proj", "user": "alice"}


def usage(placement, rp):
    return placement.provider(rp["uuid"])["usages"]


# -- providers ------------------------------------------------------------------

def test_providers_are_unique_by_name_and_nest(placement):
    root = placement.ensure_provider("node1")
    assert placement.ensure_provider("node1")["uuid"] == root["uuid"]
    numa = placement.ensure_provider("node1_numa0", parent=root["uuid"])
    assert numa["parent"] == root["uuid"] and numa["root"] == root["uuid"]
    names = [p["name"] for p in placement.providers("node1*")]
    assert names == ["node1", "node1_numa0"]
    assert placement.provider("node1_numa0")["uuid"] == numa["uuid"]
    with pytest.raises(NotFound):
        placement.provider(new_uuid())
    with pytest.raises(NotFound):
        placement.ensure_provider("orphan", parent=new_uuid())
    assert [p["name"] for p in placement.providers("orphan")] == []


def test_inventory_traits_aggregates_bump_generation(placement):
    rp = placement.ensure_provider("node1")
    g0 = rp["generation"]
    rp = placement.set_inventory(rp["uuid"], {"VCPU": {"total": 8, "allocation_ratio": 2.0},
                                              "MEMORY_MB": 4096})
    assert rp["generation"] == g0 + 1
    inv = rp["inventories"]
    assert inv["VCPU"] == {"total": 8, "reserved": 0, "min_unit": 1, "max_unit": 2147483647,
                           "step_size": 1, "allocation_ratio": 2.0}
    assert inv["MEMORY_MB"]["total"] == 4096
    agg = new_uuid()
    rp = placement.set_traits(rp["uuid"], ["HW_CPU_X86_AVX2", "CUSTOM_FAST"])
    rp = placement.set_aggregates(rp["uuid"], [agg])
    assert rp["generation"] == g0 + 3
    again = placement.provider(rp["uuid"])
    assert sorted(again["traits"]) == ["CUSTOM_FAST", "HW_CPU_X86_AVX2"]
    assert again["aggregates"] == [agg]
    assert again["generation"] == g0 + 3
    with pytest.raises(Conflict) as err:
        placement.set_traits(rp["uuid"], [], generation=g0)
    assert err.value.reason == "concurrent_update"


def test_custom_resource_classes(placement):
    rp = make_provider(placement, "gpu1", {"CUSTOM_MAGIC": 4})
    assert rp["inventories"]["CUSTOM_MAGIC"]["total"] == 4
    [cand] = placement.candidates("CUSTOM_MAGIC:2")
    assert cand["allocations"] == {rp["uuid"]: {"CUSTOM_MAGIC": 2}}


# -- candidates -------------------------------------------------------------------

def test_candidates_least_loaded_first_with_alternates(placement):
    rps = [make_provider(placement, f"node{i}", COMPUTE) for i in range(3)]
    placement.claim(new_uuid(), {rps[0]["uuid"]: {"VCPU": 6}}, **P)
    placement.claim(new_uuid(), {rps[1]["uuid"]: {"VCPU": 2}}, **P)
    cands = placement.candidates("VCPU:2,MEMORY_MB:256,DISK_GB:1")
    assert [c["host"] for c in cands] == ["node2", "node1", "node0"]
    assert cands[0]["allocations"] == {rps[2]["uuid"]: {"VCPU": 2, "MEMORY_MB": 256, "DISK_GB": 1}}
    assert [c["host"] for c in placement.candidates("VCPU:3")] == ["node2", "node1"]
    assert len(placement.candidates("VCPU:1", limit=2)) == 2
    assert placement.candidates("VCPU:9") == []


def test_candidates_query_form_and_traits(placement):
    make_provider(placement, "fast", COMPUTE, traits=["HW_CPU_X86_AVX2"])
    make_provider(placement, "slow", COMPUTE, traits=["HW_CPU_X86_AVX2", "CUSTOM_SLOW"])
    make_provider(placement, "plain", COMPUTE)
    hosts = lambda q, **kw: sorted(c["host"] for c in placement.candidates(q, **kw))  # noqa: E731
    assert hosts("VCPU:1", required="HW_CPU_X86_AVX2") == ["fast", "slow"]
    assert hosts("VCPU:1", required="HW_CPU_X86_AVX2,!CUSTOM_SLOW") == ["fast"]
    assert hosts("resources=VCPU:1,MEMORY_MB:256&required=HW_CPU_X86_AVX2,!CUSTOM_SLOW") == ["fast"]
    assert hosts("resources=VCPU:1&required=!CUSTOM_SLOW") == ["fast", "plain"]
    assert hosts("resources=VCPU:1&required=in:CUSTOM_SLOW,HW_CPU_X86_AVX2") == ["fast", "slow"]


def test_member_of_and_in_tree(placement):
    agg1, agg2 = new_uuid(), new_uuid()
    a = make_provider(placement, "a", COMPUTE, aggregates=[agg1])
    make_provider(placement, "b", COMPUTE, aggregates=[agg2])
    make_provider(placement, "c", COMPUTE)
    hosts = lambda q: sorted(c["host"] for c in placement.candidates(q))  # noqa: E731
    assert hosts(f"resources=VCPU:1&member_of={agg1}") == ["a"]
    assert hosts(f"resources=VCPU:1&member_of=in:{agg1},{agg2}") == ["a", "b"]
    assert hosts(f"resources=VCPU:1&member_of=!{agg1}") == ["b", "c"]
    assert hosts(f"resources=VCPU:1&in_tree={a['uuid']}") == ["a"]


def test_nested_providers_and_granular_groups(placement):
    root = make_provider(placement, "numa-host", {"DISK_GB": 100})
    cells = [make_provider(placement, f"numa-host_cell{i}", {"VCPU": 4, "MEMORY_MB": 4096},
                           parent=root["uuid"]) for i in range(2)]
    # unnumbered: spread over the tree, the root gives disk, a cell the rest
    cands = placement.candidates("VCPU:2,MEMORY_MB:1024,DISK_GB:10")
    assert {c["host"] for c in cands} == {"numa-host"}
    assert len(cands) == 4          # VCPU and MEMORY_MB each from either cell
    for c in cands:
        assert c["allocations"][root["uuid"]] == {"DISK_GB": 10}
    # granular, isolated: two cells, one group each
    q = "resources1=VCPU:3&resources2=VCPU:3&group_policy=isolate&resources=DISK_GB:1"
    cands = placement.candidates(q)
    assert cands
    for c in cands:
        assert c["allocations"][cells[0]["uuid"]] == {"VCPU": 3}
        assert c["allocations"][cells[1]["uuid"]] == {"VCPU": 3}
    # 3 VCPU twice cannot share one 4-VCPU cell, even with group_policy=none
    cands = placement.candidates("resources1=VCPU:3&resources2=VCPU:3&group_policy=none")
    assert cands and all(len(c["allocations"]) == 2 for c in cands)
    # isolate forbids two small groups on one cell, none allows it
    q = "resources1=VCPU:1&resources2=VCPU:1&group_policy={}&in_tree1={}&in_tree2={}"
    one_cell = [c for c in placement.candidates(q.format("none", root["uuid"], root["uuid"]))
                if len(c["allocations"]) == 1]
    assert one_cell
    assert all(len(c["allocations"]) == 2 for c in
               placement.candidates(q.format("isolate", root["uuid"], root["uuid"])))
    # claims on nested providers count on the child
    best = placement.candidates("resources1=VCPU:4&resources=DISK_GB:1&group_policy=none")[0]
    placement.claim(new_uuid(), best["allocations"], **P)
    assert len(placement.candidates("resources1=VCPU:4&group_policy=none")) == 1


def test_sharing_provider_via_aggregate(placement):
    agg = new_uuid()
    compute = make_provider(placement, "cn1", {"VCPU": 8, "MEMORY_MB": 8192}, aggregates=[agg])
    make_provider(placement, "cn2", {"VCPU": 8, "MEMORY_MB": 8192})   # not in the aggregate
    shared = make_provider(placement, "nfs", {"DISK_GB": 1000},
                           traits=["MISC_SHARES_VIA_AGGREGATE"], aggregates=[agg])
    cands = placement.candidates("VCPU:1,MEMORY_MB:512,DISK_GB:50")
    assert [c["allocations"] for c in cands] == [
        {compute["uuid"]: {"VCPU": 1, "MEMORY_MB": 512}, shared["uuid"]: {"DISK_GB": 50}}]
    assert cands[0]["host"] == "cn1"
    placement.claim(new_uuid(), cands[0]["allocations"], **P)
    assert usage(placement, shared) == {"DISK_GB": 50}
    assert placement.candidates("VCPU:1,DISK_GB:951") == []


def test_root_required_and_numbered_group_filters(placement):
    """root_required (and !), required1=!X, member_of1, in_tree= a child."""
    agg = new_uuid()
    nested = make_provider(placement, "nested", {"DISK_GB": 100}, traits=["CUSTOM_ROOT"])
    cell = make_provider(placement, "nested_numa0", {"VCPU": 4}, traits=["CUSTOM_SLOW"],
                         parent=nested["uuid"])
    make_provider(placement, "fast", COMPUTE, aggregates=[agg])
    make_provider(placement, "slow", COMPUTE, traits=["CUSTOM_SLOW"], aggregates=[agg])
    hosts = lambda q: sorted(c["host"] for c in placement.candidates(q))  # noqa: E731
    # root_required looks at the root only: the VCPU comes from the cell
    assert hosts("resources=VCPU:1&root_required=CUSTOM_ROOT") == ["nested"]
    assert hosts("resources=VCPU:1&root_required=!CUSTOM_ROOT") == ["fast", "slow"]
    # a numbered group's forbidden trait applies to its one provider
    q = "resources1=VCPU:1&required1=!CUSTOM_SLOW"
    assert hosts(q) == ["fast"]
    assert hosts("resources1=VCPU:1&required1=CUSTOM_SLOW") == ["nested", "slow"]
    assert hosts(f"resources1=VCPU:1&member_of1={agg}") == ["fast", "slow"]
    assert hosts(f"resources1=VCPU:1&member_of1={agg}&required1=!CUSTOM_SLOW") == ["fast"]
    # in_tree names any provider of the tree, here the child
    [cand] = placement.candidates(f"resources=VCPU:1,DISK_GB:1&in_tree={cell['uuid']}")
    assert cand["allocations"] == {cell["uuid"]: {"VCPU": 1}, nested["uuid"]: {"DISK_GB": 1}}
    assert hosts(f"resources=VCPU:1&in_tree={cell['uuid']}") == ["nested"]


def test_sharing_provider_numbered_group_and_forbidden_trait(placement):
    agg = new_uuid()
    compute = make_provider(placement, "cn1", {"VCPU": 8, "MEMORY_MB": 8192}, aggregates=[agg])
    slow = make_provider(placement, "nfs", {"DISK_GB": 1000},
                         traits=["MISC_SHARES_VIA_AGGREGATE", "CUSTOM_SLOWDISK"],
                         aggregates=[agg])
    # a numbered group may be satisfied by a sharing provider alone
    cands = placement.candidates("resources=VCPU:1&resources1=DISK_GB:10&group_policy=none")
    assert [c["allocations"] for c in cands] == [
        {compute["uuid"]: {"VCPU": 1}, slow["uuid"]: {"DISK_GB": 10}}]
    assert cands[0]["host"] == "cn1"
    # a forbidden trait rules out the sharing provider that has it
    assert placement.candidates("resources=VCPU:1,DISK_GB:10&required=!CUSTOM_SLOWDISK") == []
    assert placement.candidates("resources=VCPU:1&resources1=DISK_GB:10&group_policy=none"
                                "&required1=!CUSTOM_SLOWDISK") == []
    fast = make_provider(placement, "ssd", {"DISK_GB": 100},
                         traits=["MISC_SHARES_VIA_AGGREGATE"], aggregates=[agg])
    cands = placement.candidates("resources=VCPU:1,DISK_GB:10&required=!CUSTOM_SLOWDISK")
    assert [c["allocations"] for c in cands] == [
        {compute["uuid"]: {"VCPU": 1}, fast["uuid"]: {"DISK_GB": 10}}]


# -- claims -----------------------------------------------------------------------

def test_claim_usage_generation_idempotent_release(placement):
    rp = make_provider(placement, "node1", COMPUTE)
    vm = new_uuid()
    allocs = {rp["uuid"]: {"VCPU": 2, "MEMORY_MB": 512}}
    g = placement.provider(rp["uuid"])["generation"]
    doc = placement.claim(vm, allocs, **P)
    assert doc["allocations"] == allocs and doc["project"] == "proj"
    assert (doc["user"], doc["consumer_type"]) == ("alice", "INSTANCE")
    read = placement.allocations(vm)
    assert {k: read[k] for k in ("project", "user", "consumer_type")} == \
        {"project": "proj", "user": "alice", "consumer_type": "INSTANCE"}
    assert usage(placement, rp) == {"VCPU": 2, "MEMORY_MB": 512}
    assert placement.provider(rp["uuid"])["generation"] == g + 1
    again = placement.claim(vm, allocs, **P)          # a repeated claim: no change
    assert again["generation"] == doc["generation"]
    assert usage(placement, rp) == {"VCPU": 2, "MEMORY_MB": 512}
    assert placement.provider(rp["uuid"])["generation"] == g + 1
    assert placement.allocations(vm)["allocations"] == allocs
    [listed] = placement.all_allocations()
    assert (listed["consumer"], listed["user"], listed["consumer_type"]) == (vm, "alice", "INSTANCE")
    # project, user and consumer_type are part of what a claim sets
    other = placement.claim(vm, allocs, project="proj", user="bob", consumer_type="CUSTOM_JOB")
    assert (other["user"], other["consumer_type"]) == ("bob", "CUSTOM_JOB")
    assert placement.allocations(vm)["consumer_type"] == "CUSTOM_JOB"
    assert usage(placement, rp) == {"VCPU": 2, "MEMORY_MB": 512}
    placement.claim(vm, {rp["uuid"]: {"VCPU": 1}}, **P)     # replaces
    assert usage(placement, rp) == {"VCPU": 1}
    placement.release(vm)
    placement.release(vm)
    assert usage(placement, rp) == {}
    assert placement.allocations(vm)["allocations"] == {}
    assert placement.all_allocations() == []


def test_claim_conflicts_say_why(placement):
    rp = make_provider(placement, "node1", {"VCPU": {"total": 4, "reserved": 1}})
    placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 2}}, **P)
    with pytest.raises(Conflict) as err:
        placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 2}}, **P)
    assert err.value.reason == "capacity_exceeded"
    with pytest.raises(Conflict) as err:
        placement.claim(new_uuid(), {rp["uuid"]: {"MEMORY_MB": 2}}, **P)
    assert err.value.reason == "capacity_exceeded"
    vm = new_uuid()
    doc = placement.claim(vm, {rp["uuid"]: {"VCPU": 1}}, **P)
    with pytest.raises(Conflict) as err:      # stale consumer generation
        placement.claim(vm, {rp["uuid"]: {"VCPU": 1}}, project="other", user="bob",
                        consumer_generation=doc["generation"] + 5)
    assert err.value.reason == "concurrent_update"
    with pytest.raises(Conflict) as err:      # "new consumer", but it exists
        placement.claim(vm, {rp["uuid"]: {"VCPU": 1}}, project="other", user="bob",
                        consumer_generation=None)
    assert err.value.reason == "concurrent_update"
    # a repeated claim of a new consumer is idempotent, generation or not
    assert placement.claim(vm, {rp["uuid"]: {"VCPU": 1}}, **P,
                           consumer_generation=None)["allocations"] == {rp["uuid"]: {"VCPU": 1}}
    assert usage(placement, rp) == {"VCPU": 3}


def test_claim_with_consumer_generation(placement):
    rp = make_provider(placement, "node1", COMPUTE)
    vm = new_uuid()
    first = placement.claim(vm, {rp["uuid"]: {"VCPU": 1}}, **P, consumer_generation=None)
    second = placement.claim(vm, {rp["uuid"]: {"VCPU": 2}}, **P,
                             consumer_generation=first["generation"])
    assert second["generation"] != first["generation"]
    assert usage(placement, rp) == {"VCPU": 2}
    before = full_state(placement)
    with pytest.raises(Conflict) as err:        # the generation it had before
        placement.claim(vm, {rp["uuid"]: {"VCPU": 3}}, **P,
                        consumer_generation=first["generation"])
    assert err.value.reason == "concurrent_update"
    assert full_state(placement) == before
    assert placement.allocations(vm)["allocations"] == {rp["uuid"]: {"VCPU": 2}}


def test_claim_above_max_unit_is_refused(placement):
    rp = make_provider(placement, "node1", {"VCPU": {"total": 8, "max_unit": 4}})
    assert placement.candidates("VCPU:5") == []
    before = full_state(placement)
    with pytest.raises(PlacementError):
        placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 5}}, **P)
    assert full_state(placement) == before
    placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 4}}, **P)
    assert usage(placement, rp) == {"VCPU": 4}


def test_allocation_ratio_and_step_size(placement):
    rp = make_provider(placement, "node1", {"VCPU": {"total": 2, "allocation_ratio": 4.0},
                                            "MEMORY_MB": {"total": 1024, "step_size": 256,
                                                          "max_unit": 512}})
    for _ in range(8):
        placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 1}}, **P)
    with pytest.raises(Conflict):
        placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 1}}, **P)
    with pytest.raises(PlacementError):
        placement.claim(new_uuid(), {rp["uuid"]: {"MEMORY_MB": 100}}, **P)
    assert placement.candidates("MEMORY_MB:100") == []
    assert placement.candidates("MEMORY_MB:768") == []
    assert len(placement.candidates("MEMORY_MB:512")) == 1


def test_min_unit_in_claims_and_candidates(placement):
    rp = make_provider(placement, "node1", {"VCPU": {"total": 8, "min_unit": 2},
                                            "MEMORY_MB": {"total": 4096, "min_unit": 512}})
    assert rp["inventories"]["VCPU"]["min_unit"] == 2
    assert placement.candidates("VCPU:1") == []
    assert placement.candidates("VCPU:2,MEMORY_MB:256") == []
    [cand] = placement.candidates("VCPU:2,MEMORY_MB:512")
    assert cand["allocations"] == {rp["uuid"]: {"VCPU": 2, "MEMORY_MB": 512}}
    before = full_state(placement)
    for small in ({"VCPU": 1}, {"VCPU": 2, "MEMORY_MB": 511}):
        with pytest.raises(PlacementError):
            placement.claim(new_uuid(), {rp["uuid"]: small}, **P)
        assert full_state(placement) == before
    placement.claim(new_uuid(), cand["allocations"], **P)
    assert usage(placement, rp) == {"VCPU": 2, "MEMORY_MB": 512}


def test_take_passes_a_share_of_a_reservation_to_an_instance_and_back(placement):
    a = make_provider(placement, "a", COMPUTE)
    b = make_provider(placement, "b", COMPUTE)
    held = {a["uuid"]: {"VCPU": 2, "MEMORY_MB": 1024}, b["uuid"]: {"VCPU": 1, "MEMORY_MB": 512}}
    lease, vm = new_uuid(), new_uuid()
    placement.claim(lease, held, project="p", user="lease", consumer_type="RESERVATION")
    before = (usage(placement, a), usage(placement, b))
    doc = placement.take(lease, vm, a["uuid"], {"VCPU": 1, "MEMORY_MB": 512}, **P)
    assert doc["allocations"] == {a["uuid"]: {"VCPU": 1, "MEMORY_MB": 512}}
    assert placement.allocations(lease)["allocations"] == {
        a["uuid"]: {"VCPU": 1, "MEMORY_MB": 512}, b["uuid"]: {"VCPU": 1, "MEMORY_MB": 512}}
    assert (usage(placement, a), usage(placement, b)) == before     # moved, not added
    assert placement.take(lease, vm, a["uuid"], {"VCPU": 1, "MEMORY_MB": 512},
                          **P)["allocations"] == doc["allocations"]   # repeat: no-op
    with pytest.raises(Conflict) as err:
        placement.take(lease, new_uuid(), b["uuid"], {"VCPU": 2}, **P)
    assert err.value.reason == "capacity_exceeded"
    placement.give_back(vm, lease)
    assert placement.allocations(vm)["allocations"] == {}
    assert placement.allocations(lease)["allocations"] == held
    assert (usage(placement, a), usage(placement, b)) == before


def test_move_to_migration_and_revert(placement):
    src = make_provider(placement, "src", COMPUTE)
    dst = make_provider(placement, "dst", COMPUTE)
    vm, mig = new_uuid(), new_uuid()
    placement.claim(vm, {src["uuid"]: {"VCPU": 2, "MEMORY_MB": 1024}}, **P)
    dest = {dst["uuid"]: {"VCPU": 2, "MEMORY_MB": 1024}}
    doc = placement.move_to_migration(vm, mig, dest)
    assert doc["allocations"] == dest
    assert placement.allocations(mig)["allocations"] == {src["uuid"]: {"VCPU": 2, "MEMORY_MB": 1024}}
    moved = placement.allocations(mig)
    assert (moved["project"], moved["user"], moved["consumer_type"]) == ("proj", "alice", "MIGRATION")
    assert (doc["user"], doc["consumer_type"]) == ("alice", "INSTANCE")
    assert usage(placement, src) == usage(placement, dst) == {"VCPU": 2, "MEMORY_MB": 1024}
    assert placement.move_to_migration(vm, mig, dest)["allocations"] == dest   # repeat: no-op
    back = placement.revert_migration(vm, mig)
    assert back["allocations"] == {src["uuid"]: {"VCPU": 2, "MEMORY_MB": 1024}}
    assert (back["project"], back["user"], back["consumer_type"]) == ("proj", "alice", "INSTANCE")
    assert placement.allocations(mig)["allocations"] == {}
    assert usage(placement, dst) == {}
    assert usage(placement, src) == {"VCPU": 2, "MEMORY_MB": 1024}
    # a destination that cannot fit moves nothing
    with pytest.raises(Conflict) as err:
        placement.move_to_migration(vm, mig, {dst["uuid"]: {"VCPU": 9}})
    assert err.value.reason == "capacity_exceeded"
    assert placement.allocations(vm)["allocations"] == {src["uuid"]: {"VCPU": 2, "MEMORY_MB": 1024}}
    assert placement.allocations(mig)["allocations"] == {}
    # confirming the migration is releasing the migration consumer
    placement.move_to_migration(vm, mig, dest)
    placement.release(mig)
    assert usage(placement, src) == {}
    assert usage(placement, dst) == {"VCPU": 2, "MEMORY_MB": 1024}


def test_drain_sets_reserved_to_total(placement):
    rp = make_provider(placement, "node1", COMPUTE)
    placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 1}}, **P)
    drained = placement.drain("node1")
    assert all(inv["reserved"] == inv["total"] for inv in drained["inventories"].values())
    assert "COMPUTE_STATUS_DISABLED" in drained["traits"]
    assert placement.candidates("VCPU:1") == []
    with pytest.raises(Conflict):
        placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 1}}, **P)
    back = placement.drain("node1", drained=False)
    assert back["inventories"]["VCPU"]["reserved"] == 0
    assert "COMPUTE_STATUS_DISABLED" not in back["traits"]
    assert len(placement.candidates("VCPU:1")) == 1


def test_drain_covers_the_whole_tree(placement):
    """A host's children (a NUMA cell, a device below it) are drained and
    undrained with it: no candidate from the tree, no claim on a child."""
    host = make_provider(placement, "nhost", {"DISK_GB": 100})
    cell = make_provider(placement, "nhost_numa0", {"VCPU": 4, "MEMORY_MB": 4096},
                         parent=host["uuid"])
    gpu = make_provider(placement, "nhost_numa0_gpu", {"VGPU": 2}, parent=cell["uuid"])
    make_provider(placement, "other", {"DISK_GB": 100})     # not in the tree
    queries = ["VCPU:1", "VGPU:1", "VCPU:1,DISK_GB:1", "resources=VCPU:1&resources1=VGPU:1"]
    for q in queries:
        assert {c["host"] for c in placement.candidates(q)} == {"nhost"}, q
    drained = placement.drain("nhost")
    assert drained["uuid"] == host["uuid"]
    for rp in (host, cell, gpu):
        doc = placement.provider(rp["uuid"])
        assert all(inv["reserved"] == inv["total"] for inv in doc["inventories"].values())
        assert "COMPUTE_STATUS_DISABLED" in doc["traits"], doc["name"]
    for q in queries:
        assert placement.candidates(q) == [], q
    assert [c["host"] for c in placement.candidates("DISK_GB:1")] == ["other"]
    for rp, rc in ((cell, "VCPU"), (gpu, "VGPU")):
        with pytest.raises(Conflict) as err:
            placement.claim(new_uuid(), {rp["uuid"]: {rc: 1}}, **P)
        assert err.value.reason == "capacity_exceeded"
    placement.drain("nhost", drained=False)
    for rp in (host, cell, gpu):
        doc = placement.provider(rp["uuid"])
        assert all(inv["reserved"] == 0 for inv in doc["inventories"].values())
        assert "COMPUTE_STATUS_DISABLED" not in doc["traits"]
    for q in queries:
        assert {c["host"] for c in placement.candidates(q)} == {"nhost"}, q
    placement.claim(new_uuid(), {cell["uuid"]: {"VCPU": 1}, gpu["uuid"]: {"VGPU": 1}}, **P)
    assert usage(placement, gpu) == {"VGPU": 1}
    # draining a child drains what is below it, not its parent
    placement.drain("nhost_numa0")
    assert "COMPUTE_STATUS_DISABLED" in placement.provider(gpu["uuid"])["traits"]
    assert "COMPUTE_STATUS_DISABLED" not in placement.provider(host["uuid"])["traits"]
    assert [c["host"] for c in placement.candidates("DISK_GB:1")] != []
    assert placement.candidates("VGPU:1") == []


def test_undrain_reserved_per_backend(placement):
    """The one documented difference in draining (docs/placement.md): etcd
    puts back the reserved amounts from before the drain, on every provider
    of the tree; OpenStack Placement has nowhere to keep them and undraining
    sets reserved to 0.  On both, undraining a provider that is not drained
    leaves its reserved alone."""
    host = make_provider(placement, "rhost", {"VCPU": {"total": 8, "reserved": 2},
                                              "MEMORY_MB": 4096})
    cell = make_provider(placement, "rhost_numa0", {"PCPU": {"total": 4, "reserved": 1}},
                         parent=host["uuid"])
    idle = placement.drain("rhost", drained=False)          # not drained: nothing changes
    assert idle["inventories"]["VCPU"]["reserved"] == 2
    assert placement.provider(cell["uuid"])["inventories"]["PCPU"]["reserved"] == 1
    placement.drain("rhost")
    back = placement.drain("rhost", drained=False)
    child = placement.provider(cell["uuid"])
    reserved = ({"VCPU": 2, "MEMORY_MB": 0, "PCPU": 1} if placement.backend == "etcd"
                else {"VCPU": 0, "MEMORY_MB": 0, "PCPU": 0})
    assert {**{rc: inv["reserved"] for rc, inv in back["inventories"].items()},
            "PCPU": child["inventories"]["PCPU"]["reserved"]} == reserved
    assert "COMPUTE_STATUS_DISABLED" not in back["traits"] + child["traits"]


# -- bad input: a clear error, nothing written --------------------------------------

@pytest.mark.parametrize("query, words", [
    ("VCPU:0", "VCPU"),
    ("VCPU:-1", "VCPU"),
    ("VCPU:one", "VCPU"),
    ("VCPUS:1", "VCPUS"),
    ("CUSTOM_NOPE:1", "CUSTOM_NOPE"),
    ("resources=VCPU:1&bogus=2", "bogus"),
    ("resources=VCPU", "VCPU"),
    ("resources1=VCPU:1&resources2=VCPU:1", "group_policy"),
    ("resources=VCPU:1&member_of=not-a-uuid", "member_of"),
    ("resources=VCPU:1&limit=0", "limit"),
    ("", "query"),
])
def test_malformed_queries(placement, query, words):
    make_provider(placement, "node1", COMPUTE)
    with pytest.raises(PlacementError) as err:
        placement.candidates(query)
    assert words in str(err.value)


def test_bad_input_writes_nothing(placement):
    """Every refused call leaves the whole store as it was: providers, usages,
    generations, allocations, and the resource class and trait lists."""
    rp = make_provider(placement, "node1", COMPUTE)
    other = make_provider(placement, "node2", COMPUTE)
    make_provider(placement, "node2_numa0", {"VCPU": 2}, parent=other["uuid"])
    held, mig = new_uuid(), new_uuid()
    placement.claim(held, {rp["uuid"]: {"VCPU": 1}}, **P)
    before = full_state(placement)
    vm, ghost = new_uuid(), new_uuid()
    bad = [
        ({rp["uuid"]: {"VCPU": 0}}, "VCPU"),
        ({rp["uuid"]: {"VCPU": -2}}, "VCPU"),
        ({rp["uuid"]: {"VCPUS": 1}}, "VCPUS"),
        ({rp["uuid"]: {"CUSTOM_NOPE": 1}}, "CUSTOM_NOPE"),
        ({rp["uuid"]: {"VCPU": 1}, new_uuid(): {"VCPU": 1}}, "provider"),
        ({"not-a-uuid": {"VCPU": 1}}, "not-a-uuid"),
        ({rp["uuid"]: {}}, rp["uuid"]),
    ]
    for allocations, words in bad:
        with pytest.raises(PlacementError) as err:
            placement.claim(vm, allocations, **P)
        assert words in str(err.value), (allocations, str(err.value))
    g = placement.provider(rp["uuid"])["generation"]
    refused = [
        (NotFound, lambda: placement.claim(vm, {ghost: {"VCPU": 1}}, **P)),
        (PlacementError, lambda: placement.set_inventory(rp["uuid"], {"VCPU": {"total": 4, "reserved": 5}})),
        (PlacementError, lambda: placement.set_inventory(rp["uuid"], {"VCPU": 0})),
        (PlacementError, lambda: placement.set_traits(rp["uuid"], ["lower_case"])),
        # what Placement refuses with 400: an unknown standard (non-CUSTOM_)
        # trait, in a write or a query, and a consumer_type not ^[A-Z0-9_]+$
        (PlacementError, lambda: placement.set_traits(rp["uuid"], ["HW_TYPO_TRAIT"])),
        (PlacementError, lambda: placement.set_traits(rp["uuid"], ["CUSTOM_NEW_TRAIT",
                                                                   "HW_TYPO_TRAIT"])),
        (PlacementError, lambda: placement.candidates("VCPU:1", required="HW_TYPO_TRAIT")),
        (PlacementError, lambda: placement.candidates("resources=VCPU:1&required=!HW_TYPO_TRAIT")),
        (PlacementError, lambda: placement.candidates("resources=VCPU:1&root_required=HW_TYPO_TRAIT")),
        (PlacementError, lambda: placement.claim(vm, {rp["uuid"]: {"VCPU": 1}}, **P,
                                                 consumer_type="bad type")),
        (PlacementError, lambda: placement.claim(vm, {rp["uuid"]: {"VCPU": 1}}, **P,
                                                 consumer_type="lower")),
        # unknown providers, with new CUSTOM_ names that must not be created
        (NotFound, lambda: placement.set_inventory(ghost, {"CUSTOM_NEW_RC": 1})),
        (NotFound, lambda: placement.set_inventory("no-such-node", {"CUSTOM_NEW_RC": 1})),
        (NotFound, lambda: placement.set_traits(ghost, ["CUSTOM_NEW_TRAIT"])),
        (NotFound, lambda: placement.set_traits("no-such-node", ["CUSTOM_NEW_TRAIT"])),
        (NotFound, lambda: placement.set_aggregates(ghost, [new_uuid()])),
        (NotFound, lambda: placement.drain(ghost)),
        (NotFound, lambda: placement.drain("no-such-node")),
        (NotFound, lambda: placement.delete_provider(ghost)),
        (NotFound, lambda: placement.delete_provider("no-such-node")),
        (NotFound, lambda: placement.candidates(f"resources=VCPU:1&in_tree={ghost}")),
        # an inventory or trait write that fails after its new names were needed
        (Conflict, lambda: placement.set_inventory(rp["uuid"], {**COMPUTE, "CUSTOM_NEW_RC": 1},
                                                   generation=g - 1)),
        (PlacementError, lambda: placement.set_inventory(rp["uuid"], {"CUSTOM_NEW_RC": 1})),
        (Conflict, lambda: placement.set_traits(rp["uuid"], ["CUSTOM_NEW_TRAIT"],
                                                generation=g + 1)),
        # migrations: unknown destination, instance without allocations,
        # unknown migration consumer
        (NotFound, lambda: placement.move_to_migration(held, mig, {ghost: {"VCPU": 1}})),
        (NotFound, lambda: placement.move_to_migration(vm, mig, {other["uuid"]: {"VCPU": 1}})),
        (NotFound, lambda: placement.revert_migration(held, new_uuid())),
        (PlacementError, lambda: placement.delete_provider(rp["uuid"])),    # has allocations
        (PlacementError, lambda: placement.delete_provider(other["uuid"])),  # has a child
    ]
    for i, (error, call) in enumerate(refused):
        try:
            call()
        except Conflict as exc:
            if error is not Conflict:
                pytest.fail(f"refused case {i}: Conflict({exc.reason!r}), not {error.__name__}")
        except error:
            pass
        else:
            pytest.fail(f"refused case {i} was accepted")
        assert full_state(placement) == before, f"refused case {i} wrote something"
    assert placement.allocations(vm)["allocations"] == {}


def test_delete_provider_children_first(placement):
    parent = make_provider(placement, "p1", COMPUTE)
    child = make_provider(placement, "p1_numa0", {"VCPU": 2}, parent=parent["uuid"])
    with pytest.raises(PlacementError) as err:
        placement.delete_provider("p1")
    assert not isinstance(err.value, NotFound)
    placement.delete_provider(child["uuid"])
    placement.delete_provider("p1")
    assert placement.providers() == []


def test_unreachable_placement_is_unavailable():
    """No server, or a proxy answering 503: ``PlacementUnavailable``, an
    ``Unavailable`` (exit 3) and not a ``PlacementError`` (bad input), naming
    the URL."""
    import http.server
    import threading

    from engine.core.etcd_server import free_port
    from engine.placement import PlacementUnavailable, open_placement

    url = f"http://127.0.0.1:{free_port()}"
    nobody = open_placement(url)
    for call in (lambda: nobody.providers(), lambda: nobody.candidates("VCPU:1"),
                 lambda: nobody.claim(new_uuid(), {new_uuid(): {"VCPU": 1}}, **P)):
        with pytest.raises(PlacementUnavailable) as err:
            call()
        assert not isinstance(err.value, PlacementError) and err.value.url == url
        assert url in str(err.value)

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(PlacementUnavailable):
            open_placement(f"http://127.0.0.1:{server.server_port}").providers()
    finally:
        server.shutdown()
        server.server_close()
