"""Moving VMs on libvirt's test driver: the ``redefine`` path, which has no
disk copy but every other step of a move (lock, placement's migration
allocations, prepare, outcome decided from both hosts, confirm or revert).

Members (m*) lead the automations; targets (t*) host the VMs.  After every
scenario the VM runs on exactly one host and placement agrees.
"""
import collections

import pytest

from engine.core import api, keys
from engine.placement.drains import set_drained
from engine.placement import open_placement
from tests.support import wait_for, wait_until
from tests.support.cluster import finished
from tests.support.hooks import write_hook
from tests.support.vms import (allocations, big_test_host, booted, inventory, published, run,
                               start)


def boot(store, names, on="t1"):
    task = finished(store, run(store, "boot", booted(names, on=on), prefer=["m1"]))
    assert task["state"] == "done", task["error"]
    return task["result"]["vms"]


def listed(vms):
    return [{"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"], "state": vm["state"]}
            for vm in vms]


def migrate(store, vms, timeout=90, **args):
    task = finished(store, run(store, "migrate", {"vms": listed(vms), **args}, prefer=["m1"]),
                    timeout=timeout)
    return task


def assert_each_runs_once(store, expected: dict, hosts):
    """``expected``: uuid -> host.  Each VM runs there and nowhere else, its
    volumes are there only, placement holds it there only (no migration
    consumer left), ``vms/`` lists it there only and no lock is left."""
    held = inventory(store, hosts)
    where = collections.defaultdict(list)
    for host in hosts:
        for domain in held[host]["domains"]:
            if domain["name"] != "test":
                where[domain["uuid"]].append((host, domain["state"]))
    assert dict(where) == {u: [(h, "running")] for u, h in expected.items()}, dict(where)
    for uuid, host in expected.items():
        volumes = [h for h in hosts for v in held[h]["volumes"] if v.startswith(uuid)]
        assert volumes == [host], (uuid, volumes)
    placement = open_placement("etcd", store)
    names = {p["uuid"]: p["name"] for p in placement.providers()}
    consumers = allocations(store)
    assert set(consumers) == set(expected), "orphan or missing allocations"
    for uuid, host in expected.items():
        assert [names[rp] for rp in consumers[uuid]["allocations"]] == [host]
    wait_for(lambda: sorted((v["uuid"], v["host"]) for v in published(store)
                            if v["name"] != "test") == sorted(expected.items()),
             what="vms/ to list each VM once, where it runs")
    assert store.range(keys.lock("vm/"))[0] == []


def test_a_running_vm_moves_to_another_host_and_placement_follows(cluster, store):
    start(cluster, store, ["t1", "t2", "m1"])
    (vm,) = boot(store, ["web1"])
    task = migrate(store, [vm], to="t*")
    assert task["state"] == "done", task["error"]
    (moved,) = task["result"]["vms"]
    assert moved == {"name": "web1", "uuid": vm["uuid"], "from": "t1", "host": "t2",
                     "state": "running", "mode": "redefine", "downtime_ms": None,
                     "bytes": None, "disk_bytes": None, "via_replica": None, "error": None}
    assert_each_runs_once(store, {vm["uuid"]: "t2"}, ["t1", "t2"])
    steps = [e["request"] for e in task["log"]]
    assert steps.index("claim_move") < steps.index("move_prepare") < steps.index("move_adopt")


def test_no_destination_leaves_the_vm_where_it_was(cluster, store):
    start(cluster, store, ["t1", "t2", "m1"])
    (vm,) = boot(store, ["db1"])
    task = migrate(store, [vm], to="t1")          # only its own host matches
    assert task["state"] == "failed"
    (result,) = task["result"]["vms"]
    assert result["host"] == "t1" and "no destination" in result["error"]
    set_drained(store, ["t2"], True)
    task = migrate(store, [vm], to="t*")          # t2 drained: nowhere to go
    assert task["state"] == "failed"
    assert "no destination" in task["result"]["vms"][0]["error"]
    assert_each_runs_once(store, {vm["uuid"]: "t1"}, ["t1", "t2"])


def test_a_drained_host_takes_no_boot_and_undrain_moves_nothing_back(cluster, store):
    start(cluster, store, ["t1", "t2", "m1"])
    set_drained(store, ["t2"], True)
    vms = boot(store, [f"a{i}" for i in range(4)], on="t*")
    assert {vm["host"] for vm in vms} == {"t1"}
    set_drained(store, ["t2"], False)
    # a boot that starts once the undrain returned sees t2 open (claims place
    # on views up to CLAIM_VIEW_AGE old: the undrain waits that out)
    more = boot(store, [f"b{i}" for i in range(4)], on="t*")
    assert "t2" in {vm["host"] for vm in more}
    assert {vm["host"] for vm in vms} == {"t1"}


def test_a_move_refuses_a_second_operation_on_the_same_vm(cluster, store, tmp_path):
    hooks = tmp_path / "hooks"
    gate = tmp_path / "gate"
    gate.write_text("")
    write_hook(hooks, "move_prepare", "pre", f"""
while os.path.exists({str(gate)!r}):
    time.sleep(0.05)
""")
    start(cluster, store, ["t1", "m1"])
    start(cluster, store, ["t2"], hooks=str(hooks))
    (vm,) = boot(store, ["busy1"])
    moving = run(store, "migrate", {"vms": listed([vm]), "to": "t*"}, prefer=["m1"])
    wait_for(lambda: any(e["request"] == "move_prepare" and e["status"] == "running"
                         for e in api.get_task(store, moving)["log"]), what="move under way")
    rows = [v for v in _vmlist(store) if v["uuid"] == vm["uuid"]]
    assert [(r["host"], r["state"]) for r in rows] == [("t1", "migrating")]
    destroy = finished(store, run(store, "destroy", {"vms": listed([vm])}, prefer=["m1"]))
    second = finished(store, run(store, "migrate", {"vms": listed([vm])}, prefer=["m1"]))
    for refused in (destroy, second):
        assert refused["state"] == "failed"
        (result,) = refused["result"]["vms"]
        assert "busy: being moved" in result["error"] and moving in result["error"], result
    gate.unlink()
    task = finished(store, moving)
    assert task["state"] == "done", task["error"]
    assert_each_runs_once(store, {vm["uuid"]: "t2"}, ["t1", "t2"])
    # listed on t1 before the move: a destroy from that listing is refused,
    # never sent to a host the VM has left
    stale = finished(store, run(store, "destroy", {"vms": listed([vm])}, prefer=["m1"]))
    assert "no longer on t1" in stale["result"]["vms"][0]["error"]
    assert_each_runs_once(store, {vm["uuid"]: "t2"}, ["t1", "t2"])


def _vmlist(store):
    from engine.cluster import read_vms
    return read_vms(store)


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_destination_killed_during_the_move_reverts_to_the_source(cluster, store, tmp_path):
    hooks = tmp_path / "hooks"
    write_hook(hooks, "move_adopt", "pre", "time.sleep(60)\n")
    start(cluster, store, ["t1", "m1"])
    start(cluster, store, ["t2"], hooks=str(hooks))
    (vm,) = boot(store, ["app1"])
    moving = run(store, "migrate", {"vms": listed([vm]), "to": "t*"}, prefer=["m1"])
    wait_for(lambda: any(e["request"] == "move_adopt" and e["status"] == "running"
                         for e in api.get_task(store, moving)["log"]), what="adopt under way")
    cluster.kill("t2")
    task = finished(store, moving, timeout=120)
    assert task["state"] == "failed"
    (result,) = task["result"]["vms"]
    assert result["host"] == "t1" and result["state"] == "running", result
    assert "not moved" in result["error"]
    assert store.get(keys.disowned("t2", vm["uuid"])) is not None, \
        "the dead destination must drop any copy when it comes back"
    assert_each_runs_once(store, {vm["uuid"]: "t1"}, ["t1"])


def test_evacuate_survives_sigkill_of_its_initiator(cluster, store, tmp_path):
    """A hundred VMs leave t1 while the initiator dies midway; a boot during
    the evacuation never lands on the drained host."""
    hooks = tmp_path / "hooks"
    write_hook(hooks, "move_redefine_vms", "pre", "time.sleep(0.3)\n")
    start(cluster, store, ["t1"], libvirt=big_test_host(tmp_path / "t1.xml"))
    start(cluster, store, ["m1", "m2", "m3"])
    start(cluster, store, ["t2", "t3"], hooks=str(hooks), libvirt=big_test_host(tmp_path / "t.xml"))
    vms = boot(store, [f"e{i:03d}" for i in range(100)])
    set_drained(store, ["t1"], True)
    # 4 lanes of batches of 16: each lane has a second batch to start after the kill
    evacuation = run(store, "evacuate", {"hosts": ["t1"], "vms": listed(vms), "to": "t*",
                                         "parallel": 4}, prefer=["m1", "m2", "m3"])
    task = wait_until(lambda: api.get_task(store, evacuation), lambda t: redefined(t) >= 1,
                      what="a batch redefined", timeout=60)
    cluster.kill(task["initiator"])
    at_kill = redefined(api.get_task(store, evacuation))
    during = boot(store, ["late1", "late2"], on="t*")
    task = finished(store, evacuation, timeout=300)
    assert task["state"] == "done", task["error"]
    assert redefined(task) > at_kill, "the kill did not land midway"
    assert {r["host"] for r in task["result"]["vms"]} <= {"t2", "t3"}
    assert {vm["host"] for vm in during} <= {"t2", "t3"}
    expected = {r["uuid"]: r["host"] for r in task["result"]["vms"] + during}
    assert_each_runs_once(store, expected, ["t1", "t2", "t3"])


def redefined(task) -> int:
    """Batches of VMs defined on a destination so far (``evacuate`` v4)."""
    return sum(e["request"] == "move_redefine_vms" and e["status"] == "ok" for e in task["log"])


def evacuate(store, vms, members=("m1",), timeout=120, **args):
    evacuation = run(store, "evacuate", {"hosts": sorted({vm["host"] for vm in vms}),
                                         "vms": listed(vms), "to": "t*", **args},
                     prefer=list(members))
    return evacuation, finished(store, evacuation, timeout=timeout)


def assert_counted_once(store, vms: int, hosts):
    """Each host's providers use exactly what its instances hold: no VM
    counted twice, none on neither host."""
    placement = open_placement("etcd", store)
    used = {p["name"]: p["usages"].get("VCPU", 0) for p in placement.providers()
            if p["name"] in hosts}
    held = collections.Counter()
    names = {p["uuid"]: p["name"] for p in placement.providers()}
    for doc in allocations(store).values():
        for rp, amounts in doc["allocations"].items():
            held[names[rp]] += amounts.get("VCPU", 0)
    assert used == {h: held[h] for h in hosts} and sum(used.values()) == vms, (used, held)


def test_an_evacuation_moves_its_vms_in_batches(cluster, store, tmp_path):
    """Version 4: one step per batch of a host's VMs where version 3 had one
    per VM; every VM lands once, spread over the takers."""
    start(cluster, store, ["t1"], libvirt=big_test_host(tmp_path / "t1.xml"))
    start(cluster, store, ["t2", "t3", "m1"], libvirt=big_test_host(tmp_path / "t.xml"))
    vms = boot(store, [f"b{i:02d}" for i in range(20)])
    set_drained(store, ["t1"], True)
    _, task = evacuate(store, vms, parallel=2)
    assert task["state"] == "done", task["error"]
    steps = collections.Counter(e["request"] for e in task["log"])
    assert steps["lock_vms"] == steps["move_describe_vms"] == steps["claim_moves"] \
        == steps["destroy_vms"] == steps["confirm_moves"] == steps["unlock_vms"] == 2, steps
    assert 2 <= steps["move_redefine_vms"] <= 4, steps      # per batch and destination
    assert steps["lock_vm"] == steps["claim_move"] == steps["move_adopt"] == 0, steps
    results = task["result"]["vms"]
    assert [r["name"] for r in results] == [vm["name"] for vm in vms]
    assert all(r["from"] == "t1" and r["state"] == "running" and r["error"] is None
               and r["mode"] == "redefine" for r in results)
    assert {r["host"] for r in results} == {"t2", "t3"}
    assert_each_runs_once(store, {r["uuid"]: r["host"] for r in results}, ["t1", "t2", "t3"])
    assert_counted_once(store, 20, ["t1", "t2", "t3"])


def test_a_vm_refused_inside_a_batch_fails_alone(cluster, store):
    """A VM destroyed since it was listed is refused at the batch's lock;
    the others of its batch move."""
    start(cluster, store, ["t1", "t2", "m1"])
    vms = boot(store, [f"r{i}" for i in range(4)])
    gone = finished(store, run(store, "destroy", {"vms": listed(vms[1:2])}, prefer=["m1"]))
    assert gone["state"] == "done", gone["error"]
    set_drained(store, ["t1"], True)
    _, task = evacuate(store, vms, parallel=1)
    assert task["state"] == "failed"
    results = {r["name"]: r for r in task["result"]["vms"]}
    assert "no longer on t1" in results["r1"]["error"] and results["r1"]["host"] == "t1"
    moved = {r["uuid"]: r["host"] for n, r in results.items() if n != "r1"}
    assert set(moved.values()) == {"t2"}
    assert_each_runs_once(store, moved, ["t1", "t2"])


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_destination_killed_during_a_batch_reverts_each_of_its_vms(cluster, store,
                                                                      tmp_path):
    """The batch's redefinition never answers: each VM is decided from both
    hosts, alone, and stays on its source; the dead host is told to drop
    whatever copy it comes back with."""
    hooks = tmp_path / "hooks"
    write_hook(hooks, "move_redefine_vms", "pre", "time.sleep(60)\n")
    start(cluster, store, ["t1", "m1"])
    start(cluster, store, ["t2"], hooks=str(hooks))
    vms = boot(store, [f"d{i}" for i in range(3)])
    set_drained(store, ["t1"], True)
    evacuation = run(store, "evacuate", {"hosts": ["t1"], "vms": listed(vms), "to": "t*",
                                         "parallel": 1}, prefer=["m1"])
    wait_for(lambda: any(e["request"] == "move_redefine_vms" and e["status"] == "running"
                         for e in api.get_task(store, evacuation)["log"]),
             what="the batch's redefinition under way")
    cluster.kill("t2")
    task = finished(store, evacuation, timeout=120)
    assert task["state"] == "failed"
    for result in task["result"]["vms"]:
        assert result["host"] == "t1" and result["state"] == "running", result
        assert "not moved" in result["error"]
        assert store.get(keys.disowned("t2", result["uuid"])) is not None
    assert_each_runs_once(store, {vm["uuid"]: "t1" for vm in vms}, ["t1"])


def test_abort_of_an_evacuation_starts_no_more_batches(cluster, store, tmp_path):
    hooks = tmp_path / "hooks"
    write_hook(hooks, "move_redefine_vms", "pre", "time.sleep(1.0)\n")
    start(cluster, store, ["t1", "m1"], libvirt=big_test_host(tmp_path / "t1.xml"))
    start(cluster, store, ["t2"], hooks=str(hooks), libvirt=big_test_host(tmp_path / "t.xml"))
    vms = boot(store, [f"a{i:02d}" for i in range(20)])     # one lane: batches of 16 and 4
    set_drained(store, ["t1"], True)
    evacuation = run(store, "evacuate", {"hosts": ["t1"], "vms": listed(vms), "to": "t*",
                                         "parallel": 1}, prefer=["m1"])
    wait_for(lambda: any(e["request"] == "move_redefine_vms"
                         for e in api.get_task(store, evacuation)["log"]), what="first batch")
    assert api.abort(store, evacuation, wait=60)["state"] == "aborted"
    results = api.get_task(store, evacuation)["result"]["vms"]
    assert [r["host"] for r in results[:16]] == ["t2"] * 16
    assert all(r["error"] == "not moved: aborted" and r["host"] == "t1" for r in results[16:])
    assert_each_runs_once(store, {r["uuid"]: r["host"] for r in results}, ["t1", "t2"])


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_batched_evacuation_survives_its_initiator_killed_inside_its_batches(
        cluster, store, tmp_path):
    """Crash points kill whichever member leads: once right after it made a
    batch's claims, before their answer was written (the claims are asked
    again and found made); once just before it sends a batch's destroy on
    the source (its VMs defined on both hosts); once right after it
    released a batch's locks, before that answer was written.  Each killed
    member comes back under its name.  Every VM ends on exactly one host,
    counted once, unlocked, listed once, and no domain is left on t1."""
    from engine.core import failpoints
    from tests.support.vms import ENV
    armed = str(tmp_path / "failpoints")
    env = {failpoints.ENV: armed}
    members = ["m1", "m2", "m3"]
    start(cluster, store, ["t1"], libvirt=big_test_host(tmp_path / "t1.xml"))
    start(cluster, store, ["t2", "t3"], libvirt=big_test_host(tmp_path / "t.xml"))
    start(cluster, store, members, env=env)
    vms = boot(store, [f"k{i:02d}" for i in range(40)])
    set_drained(store, ["t1"], True)
    points = ["respond claim_moves", "append destroy_vms", "respond unlock_vms"]
    failpoints.arm(armed, points)
    evacuation = run(store, "evacuate", {"hosts": ["t1"], "vms": listed(vms), "to": "t*",
                                         "parallel": 2}, prefer=members)

    task = finished_through_crashes(cluster, store, evacuation, members, {**ENV, **env},
                                    "the evacuation")
    assert sorted(point for point, _, _ in failpoints.fired(armed)) == sorted(points)
    assert task["state"] == "done", task["error"]
    results = task["result"]["vms"]
    assert sorted(r["name"] for r in results) == sorted(vm["name"] for vm in vms)
    assert {r["host"] for r in results} <= {"t2", "t3"}
    assert_each_runs_once(store, {r["uuid"]: r["host"] for r in results}, ["t1", "t2", "t3"])
    assert_counted_once(store, 40, ["t1", "t2", "t3"])
    assert inventory(store, ["t1"])["t1"]["domains"] == [] or \
        {d["name"] for d in inventory(store, ["t1"])["t1"]["domains"]} == {"test"}


def finished_through_crashes(cluster, store, automation, members, env, what):
    """``automation``'s task once it has ended, each member a failpoint
    killed restarted under its name meanwhile."""
    def restart_the_dead():
        for host in members:
            if cluster.peers[host].poll() is not None:
                cluster.start_peer(host, env=env)
        task = api.get_task(store, automation)
        return task if task["state"] in keys.TERMINAL_STATES else None
    return wait_for(restart_the_dead, timeout=240, interval=0.05,
                    what=f"{what} to finish through the crashes")


def test_abort_stops_starting_moves_and_finishes_the_one_under_way(cluster, store, tmp_path):
    hooks = tmp_path / "hooks"
    write_hook(hooks, "move_prepare", "pre", "time.sleep(1.0)\n")
    start(cluster, store, ["t1", "m1"])
    start(cluster, store, ["t2"], hooks=str(hooks))
    vms = boot(store, [f"x{i}" for i in range(4)])
    moving = run(store, "migrate", {"vms": listed(vms), "to": "t*", "parallel": 1},
                 prefer=["m1"])
    wait_for(lambda: any(e["request"] == "move_prepare"
                         for e in api.get_task(store, moving)["log"]), what="first move")
    assert api.abort(store, moving, wait=60)["state"] == "aborted"
    task = api.get_task(store, moving)
    results = {r["name"]: r for r in task["result"]["vms"]}
    assert results["x0"]["host"] == "t2" and results["x0"]["error"] is None
    assert all(results[f"x{i}"]["error"] == "not moved: aborted" for i in (2, 3))
    expected = {r["uuid"]: r["host"] for r in results.values()}
    assert_each_runs_once(store, expected, ["t1", "t2"])


@pytest.mark.slow
def test_initiator_killed_at_every_step_boundary_still_moves_the_vm(cluster, store, tmp_path):
    """A failpoint kills whichever member leads just before it appends the
    next step; once the new leader has appended that step, the one after is
    armed, and so on to the end: a crash at every step boundary of the
    migration.  Each killed member is restarted under its
    name.  The VM ends on the destination, exactly once, and placement
    holds it there only."""
    from engine.core import failpoints
    from tests.support.vms import ENV
    armed = str(tmp_path / "failpoints")
    env = {failpoints.ENV: armed}
    members = ["m1", "m2", "m3"]
    start(cluster, store, ["t1", "t2"])
    start(cluster, store, members, env=env)
    vms = boot(store, ["warmup", "steady"])
    clean = migrate(store, vms[:1], to="t*")
    assert clean["state"] == "done", clean["error"]
    steps = list(dict.fromkeys(e["request"] for e in clean["log"]))
    failpoints.arm(armed, [f"append {request}" for request in steps] + ["finish"])
    moving = run(store, "migrate", {"vms": listed(vms[1:]), "to": "t*"}, prefer=members)

    task = finished_through_crashes(cluster, store, moving, members, {**ENV, **env},
                                    "the migration")
    fired = [point for point, _, _ in failpoints.fired(armed)]
    assert fired == [f"append {request}" for request in steps] + ["finish"]
    assert task["state"] == "done", task["error"]
    (moved,) = task["result"]["vms"]
    assert moved["host"] == "t2" and moved["state"] == "running"
    assert_each_runs_once(store, {vms[0]["uuid"]: "t2", vms[1]["uuid"]: "t2"}, ["t1", "t2"])
