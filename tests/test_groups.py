"""VM groups (issue 32): ``boot --group NAME --spread|--together`` and every
placement keeping the rule, on real peers (libvirt's test driver) and a
real etcd: boots (one at a time, all at once, racing), migrate, evacuate,
``group list``/``group show``, the reconciler forgetting a destroyed VM's
membership; and ``boot --dry-run``/``evacuate --dry-run`` agreeing with
what the real commands then do."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.core import keys
from tests.support import wait_for
from tests.support.cluster import refused, start_peers, task_ids

SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
FIVE = ["host1", "host2", "host3", "host4", "host5"]


@pytest.fixture
def five_hosts(cluster, store):
    """host1..host5 ready for boots; a reconciler pass every second."""
    start_peers(cluster, store, FIVE, env={"PEERCTL_RECONCILE_INTERVAL": "1"})
    wait_for(lambda: set(FIVE) <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what="five providers")
    return FIVE


def boot(cluster, *args) -> dict:
    doc = cluster.cli_json("boot", *args, "--resources", SPEC)
    assert doc["state"] == "done", doc
    return {vm["name"]: vm["host"] for vm in doc["vms"]}


def members(cluster, group) -> dict:
    return {vm["name"]: vm["host"] for vm in cluster.cli_json("group", "show", group)["vms"]}


def test_spread_group_takes_one_vm_per_host_and_refuses_the_sixth(cluster, store, five_hosts):
    placed = boot(cluster, "web-1", "web-2", "web-3", "--group", "web", "--spread")
    placed.update(boot(cluster, "web-4", "web-5", "--group", "web"))   # joins: its own rule
    assert sorted(placed.values()) == FIVE
    assert members(cluster, "web") == placed

    before = task_ids(cluster)
    refused(cluster, ["boot", "web-6", "--resources", SPEC, "--group", "web"], 1,
            "web-6: group 'web' (spread) rules out host1, host2, host3, host4, host5")
    assert task_ids(cluster) == before                 # nothing started
    assert "web-6" not in members(cluster, "web")
    # the other rule for an existing group, and a new group without a rule: usage errors
    refused(cluster, ["boot", "x", "--resources", SPEC, "--group", "web", "--together"], 2,
            "group 'web' is spread: its VMs cannot be booted --together")
    refused(cluster, ["boot", "x", "--resources", SPEC, "--group", "new"], 2,
            "group 'new' is new: say --spread or --together")
    refused(cluster, ["boot", "x", "--resources", SPEC, "--spread"], 2,
            "--spread needs --group NAME")
    assert task_ids(cluster) == before

    listed = cluster.cli_json("group", "list")
    assert [(g["group"], g["rule"], len(g["vms"]), g["violated"]) for g in listed] == [
        ("web", "spread", 5, [])]


def test_concurrent_boots_into_a_spread_group_never_share_a_host(cluster, store, five_hosts):
    boot(cluster, "seed-1", "--group", "race", "--spread")

    def one(i):
        return cluster.cli("boot", f"race-{i}", "--resources", SPEC, "--group", "race")
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(one, range(4)))
    assert all(d.returncode == 0 for d in done), [d.stderr for d in done]
    hosts = members(cluster, "race")
    assert len(hosts) == 5 and sorted(hosts.values()) == FIVE, hosts


def test_moves_keep_the_rule(cluster, store, five_hosts):
    placed = boot(cluster, "a-1", "a-2", "a-3", "--group", "apart", "--spread", "--on",
                  "host[1-3]")
    assert sorted(placed.values()) == ["host1", "host2", "host3"]
    # onto a host that holds another member: refused, naming the group
    done = cluster.cli_json("migrate", "a-1", "--to", placed["a-2"], expect_rc=1)
    assert "group 'apart' (spread)" in done["vms"][0]["error"], done
    assert members(cluster, "apart")["a-1"] == placed["a-1"]
    # anywhere: a host without a member
    moved = cluster.cli_json("migrate", "a-1")
    assert moved["vms"][0]["host"] in {"host4", "host5"}, moved
    assert members(cluster, "apart")["a-1"] == moved["vms"][0]["host"]

    # evacuate: the plan says where each goes, the moves go there, the rule holds
    boot(cluster, "b-1", "b-2", "--on", placed["a-2"])
    plan = cluster.cli_json("evacuate", placed["a-2"], "--dry-run")
    where = {row["name"]: row["host"] for row in plan["vms"]}
    assert where["a-2"] not in set(members(cluster, "apart").values())
    done = cluster.cli_json("evacuate", placed["a-2"], "--yes")
    assert {vm["name"]: vm["host"] for vm in done["vms"]} == where
    spread = members(cluster, "apart")
    assert len(set(spread.values())) == 3, spread


def test_together_group_shares_a_host_and_moves_only_as_one(cluster, store, five_hosts):
    placed = boot(cluster, "db-1", "db-2", "db-3", "--group", "db", "--together")
    assert len(set(placed.values())) == 1
    home = placed["db-1"]
    done = cluster.cli_json("migrate", "db-1", expect_rc=1)
    assert "group 'db' (together: its VMs are on " + home in done["vms"][0]["error"], done
    # the group's host evacuated: the first to leave picks a host, the others follow it
    done = cluster.cli_json("evacuate", home, "--yes")
    assert done["state"] == "done", done
    assert len({vm["host"] for vm in done["vms"]}) == 1
    assert len(set(members(cluster, "db").values())) == 1


def test_boot_dry_run_shows_where_each_lands_and_boot_lands_there(cluster, store, five_hosts):
    names = [f"p-{i}" for i in range(8)]
    for resources in ("VCPU:2,MEMORY_MB:200,DISK_GB:1", ):
        boot_args = [*names[:2], "--resources", resources]
        cluster.cli_json("boot", *boot_args)         # some load, unevenly
    before = task_ids(cluster)
    plan = cluster.cli_json("boot", *names[2:], "--resources", SPEC, "--dry-run")
    assert task_ids(cluster) == before               # nothing claimed, nothing started
    assert plan["state"] == "dry-run"
    for row in plan["vms"]:
        assert row["host"] in FIVE and row["error"] is None
        assert row["host"] not in row["alternates"] and len(row["alternates"]) == 2
    done = cluster.cli_json("boot", *names[2:], "--resources", SPEC)
    assert {vm["name"]: vm["host"] for vm in done["vms"]} == \
        {row["name"]: row["host"] for row in plan["vms"]}


def test_a_destroyed_vm_leaves_its_group(cluster, store, five_hosts):
    boot(cluster, "g-1", "g-2", "--group", "gone", "--spread")
    uuid = cluster.cli_json("vmlist", "g-1")[0]["uuid"]
    assert cluster.cli_json("destroy", "g-1")["state"] == "done"
    # the reconciler forgets the member on its second pass without the VM
    wait_for(lambda: store.get(keys.group("gone", uuid)) is None, timeout=60,
             what="the destroyed VM's membership forgotten")
    assert store.get(keys.group_of(uuid)) is None
    assert list(members(cluster, "gone")) == ["g-2"]


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_ha_restart_keeps_the_rule_when_it_can_and_says_so_when_it_cannot(
        cluster, store, tmp_path):
    """web-1..3 spread over h1..h3, h4 empty.  h1 dies: web-1 comes back on
    h4, the one host without a member.  h2 dies: web-2 has no such host
    left; it comes back anyway, marked violated, until a balance moves it to
    h5, a host added since."""
    from engine.core import api
    from tests.support.ha_hosts import boot as ha_boot, start_hosts
    start_hosts(cluster, store, tmp_path, ["h1", "h2", "h3", "h4"])
    ha_boot(cluster, ["web-1", "web-2", "web-3"], "h[1-3]", "--ha", "restart",
            "--group", "web", "--spread")
    placed = members(cluster, "web")
    assert sorted(placed.values()) == ["h1", "h2", "h3"]
    first = next(name for name, host in placed.items() if host == "h1")
    second = next(name for name, host in placed.items() if host == "h2")

    def back(name, away_from):
        shown = cluster.cli_json("group", "show", "web")
        vm = next(vm for vm in shown["vms"] if vm["name"] == name)
        listed = {v["name"]: v for v in cluster.cli_json("vmlist")}[name]
        return (vm if vm["host"] != away_from and listed["state"] == "running"
                and listed["host"] == vm["host"] else None)

    cluster.kill("h1")
    wait_for(lambda: "h1" not in api.live_hosts(store), timeout=20, what="h1 dead")
    moved = wait_for(lambda: back(first, "h1"), timeout=60, what=f"{first} restarted")
    assert moved["host"] == "h4" and moved["violated"] is False

    cluster.kill("h2")
    wait_for(lambda: "h2" not in api.live_hosts(store), timeout=20, what="h2 dead")
    broken = wait_for(lambda: back(second, "h2"), timeout=60, what=f"{second} restarted")
    assert broken["host"] in ("h3", "h4") and broken["violated"] is True
    shown = cluster.cli_json("group", "show", "web")
    assert shown["violated"] == [second]
    text = cluster.cli("group", "show", "web").stdout
    assert f"rule broken by {second}" in text

    # a new host: balance mends the rule first (a broken rule outweighs any evening out)
    start_hosts(cluster, store, tmp_path, ["h5"])
    planned = cluster.cli_json("balance", "--dry-run")
    together_now = {name for name, host in members(cluster, "web").items()
                    if host == broken["host"]}
    assert planned["moves"][0]["vm"] in together_now and planned["moves"][0]["to"] == "h5"
    done = cluster.cli_json("balance", "--yes")
    assert done["state"] == "done", done
    shown = cluster.cli_json("group", "show", "web")
    assert shown["violated"] == [] and sorted(vm["host"] for vm in shown["vms"]) == \
        sorted({"h3", "h4", "h5"})
