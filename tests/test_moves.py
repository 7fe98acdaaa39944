"""Moving VMs on libvirt's test driver: the ``redefine`` path, which has no
disk copy but every other step of a move (lock, placement's migration
allocations, prepare, outcome decided from both hosts, confirm or revert).

Members (m*) lead the automations; targets (t*) host the VMs.  After every
scenario the VM runs on exactly one host and placement agrees.
"""
import collections

import pytest

from engine.core import api, keys
from engine.drains import set_drained
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
    write_hook(hooks, "move_adopt", "pre", "time.sleep(0.1)\n")
    start(cluster, store, ["t1"], libvirt=big_test_host(tmp_path / "t1.xml"))
    start(cluster, store, ["m1", "m2", "m3"])
    start(cluster, store, ["t2", "t3"], hooks=str(hooks), libvirt=big_test_host(tmp_path / "t.xml"))
    vms = boot(store, [f"e{i:03d}" for i in range(100)])
    set_drained(store, ["t1"], True)
    evacuation = run(store, "evacuate", {"hosts": ["t1"], "vms": listed(vms), "to": "t*",
                                         "parallel": 8}, prefer=["m1", "m2", "m3"])

    def adopted(task):
        return sum(e["request"] == "move_adopt" and e["status"] == "ok" for e in task["log"])
    task = wait_until(lambda: api.get_task(store, evacuation), lambda t: adopted(t) >= 4,
                      what="4 VMs moved", timeout=60)
    cluster.kill(task["initiator"])
    assert adopted(api.get_task(store, evacuation)) < 100, "the kill did not land midway"
    during = boot(store, ["late1", "late2"], on="t*")
    task = finished(store, evacuation, timeout=300)
    assert task["state"] == "done", task["error"]
    assert {r["host"] for r in task["result"]["vms"]} <= {"t2", "t3"}
    assert {vm["host"] for vm in during} <= {"t2", "t3"}
    expected = {r["uuid"]: r["host"] for r in task["result"]["vms"] + during}
    assert_each_runs_once(store, expected, ["t1", "t2", "t3"])


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

    def restart_the_dead():
        for host in members:
            if cluster.peers[host].poll() is not None:
                cluster.start_peer(host, env={**ENV, **env})
        task = api.get_task(store, moving)
        return task if task["state"] in keys.TERMINAL_STATES else None
    task = wait_for(restart_the_dead, timeout=240, interval=0.05,
                    what="the migration to finish through the crashes")
    fired = [point for point, _, _ in failpoints.fired(armed)]
    assert fired == [f"append {request}" for request in steps] + ["finish"]
    assert task["state"] == "done", task["error"]
    (moved,) = task["result"]["vms"]
    assert moved["host"] == "t2" and moved["state"] == "running"
    assert_each_runs_once(store, {vms[0]["uuid"]: "t2", vms[1]["uuid"]: "t2"}, ["t1", "t2"])
