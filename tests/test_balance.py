"""``balance`` end to end on libvirt's test driver: real etcd, real peers,
the real command line.  Hosts are test-driver hosts of 16 CPUs and 4 GiB
(``big_test_host``): ``busy*`` hosts get the VMs, ``new*`` hosts come later,
empty.  A move there is a ``redefine`` (the test driver cannot migrate),
with every other step of a live migration.

Also the ``--auto`` balancer's decision (:func:`engine.planning.auto.decide`),
which is pure: an hour of a busy cluster's life is simulated in memory.
"""
from __future__ import annotations

import collections
import random

import pytest

from engine.planning.auto import Watch, decide
from engine.planning.holds import DEFAULT_THRESHOLD, BalanceSettings
from engine.core import api, failpoints, keys
from engine.core.replay import Response
from engine.core.watch import PrefixWatch, Reset
from engine.placement import open_placement
from engine.placement.model import capacity
from engine.planning.model import Cluster, Host, Vm
from engine.planning.score import score
from tests.support import wait_until
from tests.support.cluster import finished, refused
from tests.support.history import History
from tests.support.vms import big_test_host, published, run, start

# 200 VMs of four sizes: about 80 % of the busy hosts' memory, 55 % of their vCPUs
SIZES = {"VCPU:1,MEMORY_MB:64,DISK_GB:1": 80, "VCPU:2,MEMORY_MB:128,DISK_GB:2": 60,
         "VCPU:2,MEMORY_MB:256,DISK_GB:4": 40, "VCPU:4,MEMORY_MB:512,DISK_GB:8": 20}
# The score reached may differ from the plan's only by moves skipped when
# checked (none on a quiet cluster): less than one late move's gain.
SCORE_TOLERANCE = 0.01


def hosts(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(1, count + 1)]


def start_hosts(cluster, store, tmp_path, names, env=None):
    start(cluster, store, names, env=env,
          libvirt=big_test_host(tmp_path / "host.xml", cpus=16, memory_gib=4))


def boot_sizes(cluster, sizes: dict, on: str = "busy*") -> dict:
    """Boot ``{spec: count}`` VMs on hosts matching ``on``; name -> host."""
    where, n = {}, 0
    for spec, count in sizes.items():
        names = [f"vm{n + i:03d}" for i in range(count)]
        n += count
        doc = cluster.cli_json("boot", *names, "--resources", spec, "--on", on,
                               "--network", "none", timeout=300)
        assert doc["state"] == "done", doc
        where.update({vm["name"]: vm["host"] for vm in doc["vms"]})
    return where


def vm_hosts(cluster) -> dict:
    return {vm["name"]: vm["host"] for vm in cluster.cli_json("vmlist")}


def balance_tasks(cluster) -> list[dict]:
    return [t for t in cluster.cli_json("tasks", "--all") if t["kind"] == "balance"]


def moves_of(doc) -> list[tuple]:
    return [(m["vm"], m["from"], m["to"]) for m in doc["moves"]]


def over_capacity(provider: dict) -> list[str]:
    """The resource classes a provider document holds more of than it has."""
    return [f"{provider['name']} {rc}: {used} > {capacity(provider['inventories'][rc])}"
            for rc, used in provider["usages"].items()
            if rc in provider["inventories"]
            and used > capacity(provider["inventories"][rc])]


def no_migration_left(store) -> bool:
    placement = open_placement("etcd", store)
    return not [a for a in placement.all_allocations()
                if a["allocations"] and a.get("consumer_type") == "MIGRATION"]


@pytest.mark.slow       # a long scenario: 20 hosts, 200 VMs, balanced then kept so
def test_twenty_hosts_two_hundred_vms_get_even_and_stay_so(cluster, store, tmp_path):
    """200 VMs of mixed sizes on 10 hosts, then 10 empty hosts: the dry run
    lists a plan and moves nothing; the real run makes that plan, never
    leaving a host over capacity (every version of every provider checked,
    as etcd wrote it); the score reached is the one planned; a second
    balance plans nothing."""
    start_hosts(cluster, store, tmp_path, hosts("busy", 10))
    booted = boot_sizes(cluster, SIZES)
    assert set(booted.values()) == set(hosts("busy", 10))
    start_hosts(cluster, store, tmp_path, hosts("new", 10))
    before = task_ids = {t["id"] for t in cluster.cli_json("tasks", "--all")}

    planned = cluster.cli_json("balance", "--dry-run")
    assert planned["state"] == "dry-run" and planned["automation"] is None
    assert len(planned["moves"]) > 20
    assert planned["score_after"] < planned["score_before"] / 5
    for index, touched in enumerate(planned["sets"]):
        in_set = [m for m in planned["moves"] if m["set"] == index]
        ends = [host for m in in_set for host in (m["from"], m["to"])]
        assert len(ends) == len(set(ends)) and set(ends) == set(touched), "sets share hosts"
    assert vm_hosts(cluster) == booted, "a dry run moved something"
    assert {t["id"] for t in cluster.cli_json("tasks", "--all")} == task_ids
    text = cluster.cli("balance", "--dry-run").stdout.splitlines()
    assert text[0].split() == ["VM", "From", "To", "Gain", "Set"]
    assert text[len(planned["moves"]) + 1].startswith(
        f"balance would make {len(planned['moves'])} moves: score ")
    refused(cluster, ["balance"], 2, "add --yes")       # no terminal to ask on

    _, revision = store.range(keys.placement("rp/"), keys_only=True)
    watch = PrefixWatch(store, keys.placement("rp/"), revision).start()
    try:
        done = cluster.cli_json("balance", "--yes", "--parallel", "4", timeout=600)
        batches = watch.drain(timeout=5)
        while (more := watch.drain(timeout=0.5)):
            batches += more
    finally:
        watch.stop()
    assert done["state"] == "done", done
    assert moves_of(done) == moves_of(planned), "the run made another plan than the dry run"
    states = collections.Counter(m["state"] for m in done["moves"])
    assert set(states) <= {"moved", "skipped"}, done["moves"]
    assert abs(done["score_after"] - done["score_planned"]) <= SCORE_TOLERANCE, done
    assert done["score_planned"] == planned["score_after"]

    versions = [e.kv.value for batch in batches if not isinstance(batch, Reset)
                for e in batch if e.kind == "put"]
    assert len(versions) >= 2 * states["moved"], "the watch missed the moves"
    assert [bad for provider in versions for bad in over_capacity(provider)] == []

    now = vm_hosts(cluster)
    for move in done["moves"]:
        assert now[move["vm"]] == (move["to"] if move["state"] == "moved" else move["from"])
    held = {kv.value["uuid"] for kv in store.range(keys.balanced())[0]}
    assert held == {m["uuid"] for m in done["moves"] if m["state"] == "moved"}
    assert no_migration_left(store)

    again = cluster.cli_json("balance", "--dry-run")
    assert again["moves"] == [] and again["score_before"] == pytest.approx(
        done["score_after"], abs=1e-6)
    idle = cluster.cli_json("balance", "--yes")
    assert idle == {**again, "state": "done"}, "a plan of no moves started something"
    assert len({t["id"] for t in cluster.cli_json("tasks", "--all")} - before) == 1


@pytest.mark.slow     # a crash scenario: two initiators SIGKILLed mid-plan
def test_initiator_killed_mid_plan_resumes_and_moves_no_vm_twice(cluster, store, tmp_path):
    """Members m1-m3 lead the balance; a failpoint kills the leader as it
    is about to send the first move's copy, another the next leader as it
    is about to note the first move done.  The third finishes the plan:
    every VM moved at most once, to its planned host, and no migration
    allocation or lock is left behind."""
    from engine.operations import Context
    from engine.operations.balance import plan_balance
    armed = tmp_path / "failpoints"
    armed.write_text("")
    members = ["m1", "m2", "m3"]
    start_hosts(cluster, store, tmp_path, ["busy1", "busy2"])
    boot_sizes(cluster, {"VCPU:2,MEMORY_MB:256,DISK_GB:2": 10,
                         "VCPU:1,MEMORY_MB:128,DISK_GB:1": 6})
    start_hosts(cluster, store, tmp_path, ["new1", "new2"])
    start(cluster, store, members, env={failpoints.ENV: str(armed)})
    plan = plan_balance(Context(cluster.etcd_url, cluster.name), "[bn]*")
    assert len(plan.targets) >= 4
    failpoints.arm(str(armed), ["append move_adopt", "append balance_note"])

    balancing = run(store, "balance", {**plan.args, "parallel": 2}, prefer=members)
    task = finished(store, balancing, timeout=180)
    assert task["state"] == "done", task["error"]
    assert [point for point, _, _ in failpoints.fired(str(armed))] == [
        "append move_adopt", "append balance_note"]
    assert sum(cluster.peers[m].poll() is not None for m in members) == 2

    moves = {m["vm"]: m for m in task["result"]["moves"]}
    assert {m["state"] for m in moves.values()} <= {"moved", "skipped"}
    assert any(m["state"] == "moved" for m in moves.values())
    copies = collections.Counter(e["label"] for e in task["log"]
                                 if e["request"] == "move_adopt")
    assert copies == {name: 1 for name, m in moves.items() if m["state"] == "moved"}
    listed = collections.Counter(vm["uuid"] for vm in published(store))
    assert set(listed.values()) == {1}, "a VM is listed on two hosts"
    where = {vm["name"]: vm["host"] for vm in published(store)}
    for name, move in moves.items():
        assert where[name] == (move["to"] if move["state"] == "moved" else move["from"])
    assert no_migration_left(store)
    assert store.range(keys.lock("vm/"))[0] == []


def test_auto_balances_a_skewed_cluster_once(cluster, store, tmp_path):
    """With ``--auto on``, a cluster whose two new hosts are empty gets one
    balance, started by the balancer, and no second one in the rounds
    after it: the score is below the threshold."""
    env = {"PEERCTL_BALANCE_ROUND": "0.2"}
    start_hosts(cluster, store, tmp_path, ["busy1", "busy2"], env=env)
    boot_sizes(cluster, {"VCPU:2,MEMORY_MB:512,DISK_GB:1": 12})
    start_hosts(cluster, store, tmp_path, ["new1", "new2"], env=env)
    assert balance_tasks(cluster) == []
    settings = cluster.cli_json("balance", "--auto", "on", "--rounds", "3")
    assert settings["auto"] is True and settings["threshold"] == DEFAULT_THRESHOLD

    (task,) = wait_until(lambda: balance_tasks(cluster),
                         lambda tasks: tasks and tasks[0]["state"] in keys.TERMINAL_STATES,
                         timeout=60, what="a balance started by the balancer to end")
    assert task["state"] == "done"
    result = api.get_task(store, task["id"])["result"]
    assert result["score_after"] <= DEFAULT_THRESHOLD < result["score_before"]
    assert {vm["host"] for vm in published(store)} == {"busy1", "busy2", "new1", "new2"}

    def status():
        return cluster.cli_json("balance", "--auto", "show")["status"]
    seen = wait_until(status, lambda s: s and not s["busy"], what="a round after it")
    wait_until(status, lambda s: s["round"] >= seen["round"] + 3 * 3,
               what="three times the rounds it takes to decide")
    assert balance_tasks(cluster) == [task]
    assert status()["started"] == task["id"]


def test_bad_input_is_one_line_and_writes_nothing(cluster, store):
    for args, rc, said in [
            (["balance", "ho[st"], 2, "unclosed '['"),
            (["balance", "a/b"], 2, "has no '/'"),
            (["balance", "--max-moves", "0"], 2, "--max-moves"),
            (["balance", "--parallel", "many"], 2, "--parallel"),
            (["balance", "--auto", "maybe"], 2, "--auto"),
            (["balance", "--auto", "on", "--threshold", "-1"], 2, "--threshold"),
            (["balance", "--auto", "on", "--hold", "soon"], 2, "bad --hold"),
            (["balance", "--rounds", "3"], 2, "go with --auto on or --auto off"),
            (["balance", "--auto", "on", "--dry-run"], 2, "--auto takes no"),
            (["balance", "nomatch*"], 1, "no host matches 'nomatch*'")]:
        refused(cluster, args, rc, said)
    assert store.range("")[0] == [], "a refused balance wrote something"


# -- the automation, replayed: history in, requests out (no etcd) ----------------

def planned_move(name, source, dest, index):
    return {"vm": name, "uuid": f"uuid-{name}", "from": source, "to": dest, "gain": 0.05,
            "set": index}


def test_a_move_no_longer_good_is_skipped_with_its_reason_and_the_sets_run_in_order():
    """web1's check says it moved meanwhile: nothing else is asked for it.
    web2 moves; web3, in the next set, is checked only once web2's move is
    over (its hold noted); the score is measured last."""
    from automations.balance import balance
    answers = {"move_describe": {"state": "running", "driver": "TEST"},
               "move_prepare": {"xml": "<domain/>", "disks": [], "incremental": False,
                                "libvirt_uri": "test:///default"},
               "balance_score": {"score": 0.1}}

    def answer(request):
        if request.name == "balance_check":
            moved = request.args["name"] == "web1"
            return Response("ok", {"gain": 0.0 if moved else 0.05,
                                   "reason": "it is no longer on h1" if moved else None})
        if request.name == "claim_move":
            return Response("ok", {"host": request.args["hosts"]})
        return Response("ok", answers.get(request.name, {}))
    moves = [planned_move("web1", "h1", "h3", 0), planned_move("web2", "h2", "h4", 0),
             planned_move("web3", "h1", "h2", 1)]
    history = History(balance, {"moves": moves, "hold": 600.0, "score_before": 0.5,
                                "score_after": 0.1}, answer=answer,
                      order=lambda pending: pending[-1])
    live = history.run()
    asked = [(r.name, r.args.get("name")) for r in history.requests]
    assert [name for name, vm in asked if vm == "web1"] == ["balance_check"]
    assert asked.index(("balance_note", "web2")) < asked.index(("balance_check", "web3"))
    assert asked[-1] == ("balance_score", None)
    assert [(m["vm"], m["state"], m["error"]) for m in live.result["moves"]] == [
        ("web1", "skipped", "it is no longer on h1"), ("web2", "moved", None),
        ("web3", "moved", None)]
    assert live.result["score_planned"] == 0.1 and live.result["score_after"] == 0.1
    assert history.replay().result == live.result, "a replay decides otherwise"


# -- the --auto decision, pure ---------------------------------------------------

ROUND = 10.0                # seconds: the balancer's round
CAPACITY = {"VCPU": 64, "MEMORY_MB": 4096, "DISK_GB": 250}
KINDS = [{"VCPU": 1, "MEMORY_MB": 64, "DISK_GB": 1}, {"VCPU": 2, "MEMORY_MB": 128, "DISK_GB": 2},
         {"VCPU": 2, "MEMORY_MB": 256, "DISK_GB": 4}, {"VCPU": 4, "MEMORY_MB": 512, "DISK_GB": 8}]


def _least_loaded(cluster, vm) -> str:
    """Where placement would boot ``vm``: the least loaded host it fits."""
    fits = [name for name in cluster.host_names() if cluster.hosts[name].fits(vm.resources)]
    return min(fits, key=lambda name: sum(cluster.hosts[name].used[rc] / CAPACITY[rc]
                                          for rc in CAPACITY))


def _cluster(count: int) -> Cluster:
    return Cluster({f"h{i}": Host(f"h{i}", dict(CAPACITY), dict.fromkeys(CAPACITY, 0))
                    for i in range(1, count + 1)}, {})


def _churn(cluster, chance: random.Random, serial: int) -> None:
    """One VM destroyed, one booted where placement would put it."""
    gone = cluster.vms.pop(chance.choice(sorted(cluster.vms)))
    for rc, n in gone.resources.items():
        cluster.hosts[gone.host].used[rc] -= n
    vm = Vm(f"u{serial}", f"vm{serial}", None, dict(chance.choice(KINDS)))
    cluster.add(vm, _least_loaded(cluster, vm))


def _rounds_that_start(cluster, rounds: int, churn_per_round: int, settings, seed=7):
    chance, watch, started = random.Random(seed), Watch(), []
    for n in range(rounds):
        for k in range(churn_per_round):
            _churn(cluster, chance, n * churn_per_round + k)
        watch, go = decide(watch, score(cluster), settings, busy=False)
        if go:
            started.append(n)
    return started


@pytest.mark.parametrize("host_count, vm_count", [(4, 40), (20, 200), (50, 500)])
def test_an_even_cluster_with_vms_coming_and_going_is_left_alone_for_an_hour(
        host_count, vm_count):
    """Placement boots each VM on the least loaded host; three VMs come and
    go every round of an hour: the score never stays above the default
    threshold for the default number of rounds."""
    cluster, chance = _cluster(host_count), random.Random(1)
    for n in range(vm_count):
        vm = Vm(f"v{n}", f"v{n}", None, dict(chance.choice(KINDS)))
        cluster.add(vm, _least_loaded(cluster, vm))
    settings = BalanceSettings(auto=True)
    assert _rounds_that_start(cluster, int(3600 / ROUND), 3, settings) == []


def test_a_skewed_cluster_is_balanced_after_the_rounds_it_must_wait():
    cluster = _cluster(20)
    for n in range(200):
        cluster.add(Vm(f"v{n}", f"v{n}", None, dict(KINDS[n % 4])), f"h{n % 10 + 1}")
    assert _rounds_that_start(cluster, 3, 0, BalanceSettings(auto=True)) == [2]
    assert _rounds_that_start(cluster, 10, 0, BalanceSettings(auto=False)) == []
    watch, go = decide(Watch(above=2), score(cluster), BalanceSettings(auto=True), busy=True)
    assert (watch, go) == (Watch(), False), "a running balance must start the count again"
