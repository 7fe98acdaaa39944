"""The operations layer (engine/operations/) called directly, with no
subprocess: each function against a real etcd, with real peers on libvirt's
test driver where it needs hosts and VMs.  Three hosts and three VMs (web2
and web10 on host1, db1 on host2) are started once for the module; a test
that changes them (drains, a lease) puts them back."""
from __future__ import annotations

import uuid

import pytest

from engine.core.store import Store
from engine.errors import Failed, UsageError
from engine.operations import Context, Plan
from engine.operations import admin, aside, hosts, leases, moves, placement, tasks, vms
from engine.operations.select import NoMatch
from tests.support import wait_until
from tests.support.cluster import Cluster
from tests.support.raw import put_raw
from tests.support.vms import start as start_hosts

SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
HOSTS = ["host1", "host2", "host3"]
PROVIDER_KEYS = {"uuid", "name", "parent", "generation", "inventories", "usages", "traits",
                 "aggregates"}
INVENTORY_KEYS = {"total", "reserved", "min_unit", "max_unit", "step_size",
                  "allocation_ratio"}
# Nothing listens there: an operation that reads anything fails unreachable.
NOWHERE = Context("http://127.0.0.1:9", "nowhere", timeout=1.0)


def run(ctx, plan: Plan, timeout: float = 60) -> dict:
    """Start ``plan`` and follow its automation to the end; its last view."""
    automation = tasks.start(ctx, plan)
    last = None
    for last in tasks.follow(ctx, automation, timeout=timeout):
        pass
    assert last["state"] == "done", last
    return last


@pytest.fixture(scope="module")
def world(etcd, tmp_path_factory):
    """host1 to host3 alive with providers; web2 and web10 booted on host1,
    db1 on host2; the Context of that cluster (etcd placement)."""
    name = "t" + uuid.uuid4().hex[:10]
    store = Store(etcd.url, name)
    cluster = Cluster(etcd.url, name, tmp_path_factory.mktemp("operations"))
    ctx = Context(etcd.url, name, placement="etcd")
    try:
        start_hosts(cluster, store, HOSTS)
        run(ctx, vms.plan_boot(ctx, ["web2", "web10"], SPEC, on="host1"))
        run(ctx, vms.plan_boot(ctx, ["db1"], SPEC, on="host2"))
        yield ctx
    finally:
        cluster.close()
        ctx.store().close()
        store.close()


@pytest.fixture
def only_host1_takes_vms(world):
    """host2 and host3 drained for one test, undrained after it."""
    moves.set_drained(world, ["host2", "host3"], True)
    yield world
    moves.set_drained(world, ["host2", "host3"], False)


def names(rows):
    return [row["name"] for row in rows]


# -- VMs ------------------------------------------------------------------------------

def test_list_vms_with_patterns_returns_the_matches_and_names_a_pattern_matching_nothing(world):
    """Patterns pick VMs; one matching nothing is a NoMatch naming it, carrying the others' VMs."""
    assert sorted(names(vms.list_vms(world))) == ["db1", "web10", "web2"]
    assert names(vms.list_vms(world, ["web*"])) == ["web2", "web10"]
    assert names(vms.list_vms(world, ["host2/*", "web1*"])) == ["web10", "db1"]
    with pytest.raises(NoMatch, match="no VM matches 'nothing\\*'") as caught:
        vms.list_vms(world, ["web*", "nothing*"])
    assert names(caught.value.matched) == ["web2", "web10"]
    assert "'web*'" not in str(caught.value)


def test_plan_action_asks_only_before_acting_destructively_on_several_vms(world):
    """destroy on two VMs asks, sorted naturally; on one it does not; start never asks."""
    plan = vms.plan_action(world, "destroy", ["web*"])
    assert plan.kind == "destroy" and plan.ask is True
    assert [(t["host"], t["name"]) for t in plan.targets] == [("host1", "web2"),
                                                               ("host1", "web10")]
    listed = {vm["name"]: vm for vm in vms.list_vms(world)}
    assert plan.args == {"vms": [{"host": "host1", "name": n, "uuid": listed[n]["uuid"]}
                                 for n in ("web2", "web10")]}
    assert vms.plan_action(world, "destroy", ["web2"]).ask is False
    assert vms.plan_action(world, "start", ["*"]).ask is False
    assert len(vms.plan_action(world, "start", ["*"]).targets) == 3


@pytest.mark.parametrize("pattern", ["web[1", "a/b/c", "host1/", "web 1"])
def test_plan_action_refuses_a_bad_pattern_before_reading_anything(pattern):
    """A bad pattern is a UsageError even with etcd unreachable: nothing was read."""
    with pytest.raises(UsageError, match="VM pattern"):
        vms.plan_action(NOWHERE, "destroy", ["web*", pattern])
    with pytest.raises(UsageError, match="unknown VM action 'explode'"):
        vms.plan_action(NOWHERE, "explode", ["web*"])


def test_plan_boot_refuses_a_name_clash_and_an_on_matching_no_host_before_any_automation(
        world):
    """A name in use names its host; --on matching no host is refused; no automation starts."""
    before = [t["id"] for t in tasks.list_tasks(world, include_finished=True)]
    with pytest.raises(Failed, match=r"VM name already in use: web2 \(on host1\)") as caught:
        vms.plan_boot(world, ["new1", "web2"], SPEC)
    assert caught.value.result == {"automation": None, "state": "failed", "vms": []}
    with pytest.raises(Failed, match="no host matches --on 'nohost\\*'"):
        vms.plan_boot(world, ["new1"], SPEC, on="nohost*")
    with pytest.raises(UsageError, match="VM name given more than once: new1"):
        vms.plan_boot(world, ["new1", "new1"], SPEC)
    assert [t["id"] for t in tasks.list_tasks(world, include_finished=True)] == before


def test_plan_boot_refuses_on_hosts_that_are_all_drained(only_host1_takes_vms):
    """--on naming only drained hosts is refused, saying they are drained."""
    ctx = only_host1_takes_vms
    with pytest.raises(Failed, match="no host among --on 'host\\[23\\]' takes new VMs: "
                                     "host2 drained, host3 drained"):
        vms.plan_boot(ctx, ["new1"], SPEC, on="host[23]")
    plan = vms.plan_boot(ctx, ["new1"], SPEC, on="host*")
    # the plan lands it on host1, the one host that takes VMs, with no alternate
    assert plan.kind == "boot" and plan.targets == [
        {"name": "new1", "host": "host1", "alternates": [], "error": None}]
    assert plan.args["vms"][0]["resources"] == {"VCPU": 1, "MEMORY_MB": 64, "DISK_GB": 1}
    assert plan.args["vms"][0]["prefer"] == "host1"


# -- hosts and moves -------------------------------------------------------------------

def test_list_hosts_derives_usage_and_names_a_pattern_matching_none(world):
    """Hosts carry used memory and disk and their ratios; a pattern matching none is NoMatch."""
    listed = hosts.list_hosts(world)
    assert [h["host"] for h in listed] == HOSTS
    for host in listed:
        assert host["used_memory_mb"] == host["memory_mb"] - host["free_memory_mb"]
        assert host["used_disk_gb"] is None or host["used_disk_gb"] >= 0
        assert 0 <= host["memory_usage"] <= 100 and isinstance(host["networks"], list)
    assert [h["host"] for h in hosts.list_hosts(world, "host[13]")] == ["host1", "host3"]
    with pytest.raises(NoMatch, match="no host matches 'zz\\*'"):
        hosts.list_hosts(world, "zz*")


@pytest.mark.parametrize("operation", [hosts.list_hosts, hosts.plan_ping, moves.plan_drain,
                                       moves.plan_evacuate, aside.list_aside])
def test_a_bad_host_pattern_is_refused_before_reading_anything(operation):
    """Every operation taking a host pattern refuses a bad one with etcd unreachable."""
    with pytest.raises(UsageError, match="bad host pattern 'a/b': a host pattern has no '/'"):
        operation(NOWHERE, "a/b")


def test_plan_migrate_and_evacuate_refuse_when_the_other_hosts_are_drained(
        only_host1_takes_vms):
    """With every other host drained there is nowhere to move, said before anything starts."""
    ctx = only_host1_takes_vms
    with pytest.raises(Failed, match="nowhere to move 'web2': the cluster offers only host1, "
                                     "where it is"):
        moves.plan_migrate(ctx, ["web2"])
    with pytest.raises(Failed, match="nowhere to move 'web2': --to 'host2' has no live, "
                                     "undrained host \\(host2 drained\\)"):
        moves.plan_migrate(ctx, ["web2"], to="host2")
    with pytest.raises(Failed, match="nowhere to move the VMs of host1: the cluster offers "
                                     "only host1, which is being evacuated"):
        moves.plan_evacuate(ctx, "host1")


def test_plan_evacuate_over_two_hosts_asks_and_lists_their_vms(world):
    """Evacuating two hosts asks; the plan lists every VM on them, naturally sorted."""
    plan = moves.plan_evacuate(world, "host[12]")
    assert plan.ask is True and plan.args["hosts"] == ["host1", "host2"]
    assert [(row["from"], row["name"]) for row in plan.targets] == [
        ("host1", "web2"), ("host1", "web10"), ("host2", "db1")]
    assert moves.plan_evacuate(world, "host3").ask is False
    migrate = moves.plan_migrate(world, ["web*"], to="host3")
    assert migrate.ask is True and migrate.args["to"] == "host3"


# -- tasks -------------------------------------------------------------------------------

def test_tasks_give_created_as_iso_utc_and_an_unknown_id_fails(world):
    """list_tasks and get_task say when an automation was created in ISO 8601 UTC."""
    listed = tasks.list_tasks(world, include_finished=True)
    boots = [t for t in listed if t["kind"] == "boot"]
    assert len(boots) >= 2
    for task in listed:
        assert isinstance(task["created"], str) and task["created"].endswith("Z"), task
    shown = tasks.get_task(world, boots[0]["id"])
    assert shown["created"] == boots[0]["created"] and shown["state"] == "done"
    assert all(entry["time"].endswith("Z") for entry in shown.get("log") or [])
    with pytest.raises(Failed, match="no automation 'nope'"):
        tasks.get_task(world, "nope")


# -- leases --------------------------------------------------------------------------------

def test_a_capacity_lease_is_created_listed_shown_and_deleted_with_its_vm(world):
    """A lease's round trip; deleting it with a VM inside and on_end destroy destroys it."""
    granted = leases.create(world, "ci", "now", "+3m", resources=SPEC, amount=2)
    assert set(granted) == {"lease", "state", "start", "end", "kind", "hosts", "resources",
                            "amount", "used", "vms"}
    assert granted["kind"] == "capacity" and granted["amount"] == 2
    assert granted["start"].endswith("Z") and granted["end"].endswith("Z")
    try:
        wait_until(lambda: leases.show(world, "ci"), lambda doc: doc["state"] == "active",
                   timeout=30, what="lease ci active")
        assert leases.plan_delete(world, "ci")["destroys"] is False   # nothing inside yet
        run(world, vms.plan_boot(world, ["ci1"], SPEC, reservation="ci"))
        plan = wait_until(lambda: leases.plan_delete(world, "ci"), lambda doc: doc["vms"],
                          what="the lease's VM")
        host = {vm["name"]: vm["host"] for vm in vms.list_vms(world)}["ci1"]
        assert plan == {"lease": "ci", "state": "dry-run", "lease_state": "active",
                        "on_end": "destroy", "vms": [{"name": "ci1", "host": host}],
                        "destroys": True}
        assert [(doc["lease"], doc["vms"]) for doc in leases.list_leases(world, "c*")] == [
            ("ci", ["ci1"])]
        assert leases.show(world, "ci")["vm_hosts"] == {"ci1": host}
        with pytest.raises(NoMatch, match="no lease matches 'zz\\*'"):
            leases.list_leases(world, "zz*")
    finally:
        assert leases.delete(world, "ci", timeout=60)["state"] == "deleted"
    assert leases.list_leases(world) == []
    with pytest.raises(Failed, match="no lease 'ci'"):
        leases.show(world, "ci")
    wait_until(lambda: names(vms.list_vms(world)), lambda found: "ci1" not in found,
               what="the lease's VM destroyed")


# -- placement -------------------------------------------------------------------------------

def test_placement_providers_allocations_and_candidates_have_their_documented_shapes(world):
    """Providers, allocations by consumer and candidates, as the docstrings say."""
    listed = placement.providers(world)
    assert [p["name"] for p in listed] == HOSTS
    for provider in listed:
        assert set(provider) == PROVIDER_KEYS
        assert set(provider["inventories"]) >= {"VCPU", "MEMORY_MB", "DISK_GB"}
        assert all(set(inv) == INVENTORY_KEYS for inv in provider["inventories"].values())
        assert set(provider["usages"]) == set(provider["inventories"])
    [host1] = placement.providers(world, "host1")
    assert host1["usages"]["VCPU"] >= 2 and host1["usages"]["MEMORY_MB"] >= 128
    with pytest.raises(NoMatch, match="no provider matches 'nope\\*'"):
        placement.providers(world, "nope*")

    web2 = vms.list_vms(world, ["web2"])[0]
    assert placement.allocations(world, web2["uuid"]) == [{
        "consumer": web2["uuid"],
        "allocations": {host1["uuid"]: {"VCPU": 1, "MEMORY_MB": 64, "DISK_GB": 1}}}]
    everyone = {row["consumer"] for row in placement.allocations(world)}
    assert {vm["uuid"] for vm in vms.list_vms(world)} <= everyone
    assert placement.allocations(world, str(uuid.uuid4())) == []
    with pytest.raises(UsageError, match="bad consumer 'not-a-uuid': not a UUID"):
        placement.allocations(NOWHERE, "not-a-uuid")

    found = placement.candidates(world, "VCPU:1,MEMORY_MB:64", limit=2)
    assert len(found) == 2 and all(set(c) == {"allocations", "host"} for c in found)
    assert all(c["host"] in HOSTS for c in found)
    assert placement.candidates(world, "VCPU:1", required="CUSTOM_NOWHERE") == []
    with pytest.raises(UsageError, match="bad resource spec 'VCPUS:1'"):
        placement.candidates(world, "VCPUS:1")


# -- admin -------------------------------------------------------------------------------------

def test_identities_take_name_role_pairs_and_refuse_an_unknown_role():
    """--user NAME:ROLE adds a user; an unknown role or a bad name is a UsageError."""
    found = admin.identities(peers=["host1"], users=["ann:viewer"])
    assert found == {"root": "root", "operator": "operator", "viewer": "viewer",
                     "peer-host1": "peer", "ann": "viewer"}
    for bad in ("x:nope", "x", "a b:viewer"):
        with pytest.raises(UsageError, match="bad --user"):
            admin.identities(users=[bad])


def test_unreadable_keys_finds_a_garbage_value_and_deletes_only_it(etcd, store, cluster_name):
    """A value put raw past peerctl's encoding is found, and deleting removes just it."""
    ctx = Context(etcd.url, cluster_name)
    assert admin.unreadable_keys(ctx) == []
    put_raw(etcd.url, f"/peerctl/{cluster_name}/hostcfg/host9", b"\xc1")
    [bad] = admin.unreadable_keys(ctx)
    assert bad.key == "hostcfg/host9"
    assert admin.delete_keys(ctx, [bad]) == ["hostcfg/host9"]
    assert admin.unreadable_keys(ctx) == [] and store.get("hostcfg/host9") is None
