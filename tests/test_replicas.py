"""Replicas on the test driver, through the real command line and peers:
the record, what vmlist shows, the refusals (one line, nothing written),
stopping, and an HA restart that uses the replica or, without one, waits
for the operator's fallback.  The QEMU tier (test_replicas_qemu) proves the
data."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid as uuidlib
from types import SimpleNamespace

import pytest

from engine.backups import replicas
from engine.core import api, failpoints, keys, locks
from engine.core.handlers import load_request_handlers
from engine.core.values import readable
from tests.support import PEERCTL, ROOT, wait_for, wait_until
from tests.support.cluster import finished, refused
from tests.support.ha_hosts import boot, start_hosts, vmlist


def _records(store):
    return [readable(kv) for kv in store.range(keys.replica())[0]]


def _replica(store, uuid):
    return (replicas.read(store, uuid) or {}).get("replica")


def _replicated(store, uuid, host):
    return wait_until(lambda: _replica(store, uuid), lambda r: r and r["host"] == host
                      and not r.get("pending"), timeout=60, what=f"a replica on {host}")


def test_a_replicated_vm_has_a_whole_replica_on_another_host_that_vmlist_shows(
        cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2"])
    uuid = boot(cluster, ["db1"], "h1")["db1"]
    doc = cluster.cli_json("replicate", "db1", "--every", "10s")
    (row,) = doc["vms"]
    assert (row["name"], row["uuid"], row["every"], row["state"]) == \
        ("db1", uuid, 10.0, "started"), row
    replica = _replicated(store, uuid, "h2")
    assert replica["seq"] >= 1 and replica["disks"][0]["dev"] == "vda", replica
    listed = vmlist(cluster)["db1"]["replica"]
    assert (listed["host"], listed["alive"], listed["every"]) == ("h2", True, 10.0), listed
    assert listed["time"] is not None and listed["error"] is None, listed
    text = cluster.cli("vmlist", "-o", "name,replica").stdout
    assert "h2 " in text and "ago" in text, text

    again = cluster.cli_json("replicate", "db1", "--every", "1m")
    assert again["vms"][0]["state"] == "changed"
    (record,) = _records(store)
    assert record["every"] == 60.0 and record["automation"] == \
        replicas.read(store, uuid)["automation"]


def test_bad_replication_requests_are_one_line_and_write_nothing(cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2"])
    boot(cluster, ["db1"], "h1")
    refused(cluster, ["replicate", "db1", "--every", "5s"], 2, "at most every 10s")
    refused(cluster, ["replicate", "db1"], 2, "needs --every")
    refused(cluster, ["replicate", "db1", "--every", "10s", "--to", "h1"], 1,
            "offers only h1, where it runs")
    refused(cluster, ["replicate", "db1", "--every", "10s", "--to", "h9*"], 1,
            "matches no host")
    refused(cluster, ["replicate", "nosuch", "--every", "10s"], 1, "nosuch")
    refused(cluster, ["replicate", "db1", "--stop"], 1, "is replicated")
    refused(cluster, ["replicate", "db1", "--stop", "--every", "10s"], 2, "--stop takes no")
    assert _records(store) == []


def test_no_other_host_means_no_replica(cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1"])
    boot(cluster, ["db1"], "h1")
    refused(cluster, ["replicate", "db1", "--every", "10s"], 1,
            "offers only h1, where it runs")
    assert _records(store) == []


def test_stopping_deletes_the_replica_then_its_record(cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2"])
    uuid = boot(cluster, ["db1"], "h1")["db1"]
    cluster.cli_json("replicate", "db1", "--every", "10s")
    _replicated(store, uuid, "h2")
    automation = replicas.read(store, uuid)["automation"]
    doc = cluster.cli_json("replicate", "db1", "--stop")
    assert doc["vms"][0]["state"] == "stopping"
    task = finished(store, automation)
    assert task["state"] == "done" and task["result"]["state"] == "stopped", task
    assert _records(store) == []
    assert vmlist(cluster)["db1"]["replica"] is None


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_an_ha_restart_starts_a_replicated_vm_from_its_replica_on_the_replicas_host(
        cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2", "h3"])
    uuid = boot(cluster, ["db1"], "h1", "--ha", "restart")["db1"]
    cluster.cli_json("replicate", "db1", "--every", "10s", "--to", "h[23]")
    replica = _replicated(store, uuid, "h2")
    cluster.kill("h1")
    vm = wait_until(lambda: vmlist(cluster)["db1"], lambda v: v["host"] != "h1"
                    and v["state"] == "running", timeout=60, what="db1 restarted")
    assert vm["host"] == "h2", vm           # where its replica was, not anywhere
    assert vm["recovered"]["from"] == "h1", vm
    assert abs(vm["recovered"]["data_as_of"] - replica["time"]) < 0.01, (vm, replica)
    consumed = replicas.read(store, uuid)
    assert consumed["consumed"]["host"] == "h2", consumed
    # replication goes on, to a host that is not the VM's own
    wait_until(lambda: _replica(store, uuid), lambda r: r and r["host"] == "h3"
               and r["seq"] > replica["seq"], timeout=60, what="a new replica on h3")


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_with_its_replica_host_dead_too_a_vm_waits_unless_the_fallback_is_allowed(
        cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2", "h3"])
    uuids = boot(cluster, ["db1", "db2"], "h1", "--ha", "restart")
    cluster.cli_json("replicate", "db1", "--every", "10s", "--to", "h2")
    cluster.cli_json("replicate", "db2", "--every", "10s", "--to", "h2",
                     "--from-image-if-no-replica")
    for uuid in uuids.values():
        _replicated(store, uuid, "h2")
    cluster.kill("h2")
    wait_for(lambda: vmlist(cluster)["db1"]["replica"]["alive"] is False, timeout=30,
             what="the replica's host seen down")
    cluster.kill("h1")
    db2 = wait_until(lambda: vmlist(cluster)["db2"], lambda v: v["host"] != "h1"
                     and v["state"] == "running", timeout=60, what="db2 restarted from its image")
    assert db2["host"] == "h3" and db2["recovered"]["data_as_of"] is None, db2

    def recovery():
        for kv in store.range(keys.task())[0]:
            if (readable(kv) or {}).get("kind") == "recover":
                return keys.suffix(kv.key, keys.task())
        return None
    task = finished(store, wait_for(recovery, timeout=30, what="h1's recovery"))
    assert task["state"] == "failed", task
    assert "db1: not restarted from its image: its replica's host h2 is down too" \
        in task["error"], task["error"]
    db1 = vmlist(cluster)["db1"]
    assert (db1["host"], db1["state"]) == ("h1", "unknown"), db1


@pytest.mark.slow       # a long scenario: two hosts die, each a TTL and a margin
def test_when_the_replicas_host_dies_a_new_replica_elsewhere_serves_the_next_restart(
        cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2", "h3"])
    uuid = boot(cluster, ["db1"], "h1", "--ha", "restart")["db1"]
    cluster.cli_json("replicate", "db1", "--every", "10s")
    old = _replicated(store, uuid, "h2")
    cluster.kill("h2")
    new = _replicated(store, uuid, "h3")
    assert new["seq"] > old["seq"] and new["kind"] == "full", new
    cluster.kill("h1")
    vm = wait_until(lambda: vmlist(cluster)["db1"], lambda v: v["host"] not in ("h1", "h2")
                    and v["state"] == "running", timeout=60, what="db1 restarted")
    assert vm["host"] == "h3" and vm["recovered"]["data_as_of"] == new["time"], vm


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_drained_replica_host_hands_the_replica_to_another_host(cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2", "h3"])
    uuid = boot(cluster, ["db1"], "h1")["db1"]
    cluster.cli_json("replicate", "db1", "--every", "10s")
    _replicated(store, uuid, "h2")
    cluster.cli_json("drain", "h2", "--yes")
    moved = _replicated(store, uuid, "h3")
    assert replicas.read(store, uuid)["last"]["error"] is None, moved


def test_a_destroyed_vm_stops_being_replicated_at_once(cluster, store, tmp_path):
    """Not at the next update an hour later: the destroy wakes the
    automation, which deletes the replica and its record."""
    start_hosts(cluster, store, tmp_path, ["h1", "h2"])
    uuid = boot(cluster, ["db1"], "h1")["db1"]
    cluster.cli_json("replicate", "db1", "--every", "1h")
    _replicated(store, uuid, "h2")
    automation = replicas.read(store, uuid)["automation"]
    cluster.cli_json("destroy", "db1", "--yes")
    task = finished(store, automation, timeout=60)
    assert task["state"] == "done" and task["result"]["state"] == "stopped", task
    assert task["result"]["why"] == "the VM is gone", task
    assert _records(store) == []


def test_an_initiator_killed_mid_update_is_replaced_and_the_replica_recorded_once(
        cluster, store, tmp_path):
    armed = tmp_path / "failpoints"
    armed.write_text("")
    # Three preferred members, as many as an automation has: h1 and h2 never
    # lead it, so the armed point kills one of the m's, not the replica's host.
    start_hosts(cluster, store, tmp_path, ["h1", "h2", "m1", "m2", "m3"],
                env={failpoints.ENV: str(armed)})
    cluster.cli_json("drain", "m*", "--yes")        # they lead automations, keep no replica
    uuid = boot(cluster, ["db1"], "h1")["db1"]
    failpoints.arm(str(armed), ["append replica_apply"])
    record = replicas.put(store, {"name": "db1", "uuid": uuid}, 10, None, None,
                          prefer=["m1", "m2", "m3"])
    wait_for(lambda: failpoints.fired(str(armed)), timeout=60, what="the initiator killed")
    replica = _replicated(store, uuid, "h2")
    assert replica["seq"] == 1, replica         # the update the dead initiator began
    running = [kv for kv in store.range(keys.task())[0]
               if (readable(kv) or {}).get("kind") == "replicate"
               and (readable(kv) or {}).get("state") == "running"]
    assert [keys.suffix(kv.key, keys.task()) for kv in running] == [record["automation"]]


def test_a_destroy_waits_for_a_replica_update_instead_of_failing(cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2"])
    uuid = boot(cluster, ["db1"], "h1")["db1"]
    cluster.cli_json("replicate", "db1", "--every", "1h")
    _replicated(store, uuid, "h2")
    updating = replicas.read(store, uuid)["automation"]
    # the first update lets go of the VM's lock just after recording its
    # replica: taken before that, the test's lock would be the update's
    wait_for(lambda: store.get(keys.lock(f"vm/{uuid}")) is None, timeout=30,
             what="the first update's lock released")
    # the lock as an update of that automation holds it
    locks.take(store, f"vm/{uuid}", updating, "its replica is being updated",
               kind="replica", host="h1")
    destroying = subprocess.Popen([sys.executable, PEERCTL, "--format", "json", "destroy",
                                   "db1", "--yes"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=cluster.env, cwd=ROOT)
    try:
        started = wait_for(lambda: [kv for kv in store.range(keys.task())[0]
                                    if (readable(kv) or {}).get("kind") == "destroy"],
                           timeout=30, what="the destroy started")
        destroy_id = keys.suffix(started[0].key, keys.task())
        wait_for(lambda: any(e["request"] == "lock_vm"
                             for e in api.get_task(store, destroy_id)["log"]),
                 timeout=30, what="the destroy asking for the lock")
        assert destroying.poll() is None, destroying.communicate()
        assert locks.release(store, f"vm/{uuid}", updating)     # the update ends
        out, err = destroying.communicate(timeout=60)
    finally:
        if destroying.poll() is None:
            destroying.kill()
    assert destroying.returncode == 0, err
    assert json.loads(out)["vms"][0]["state"] == "destroyed", out


def test_a_vm_a_move_holds_while_listed_nowhere_is_not_taken_for_gone(store):
    """Between a move's cleanup of its source and its unlock, no listing
    shows the VM: its replication waits and looks again, instead of taking
    the VM for destroyed and deleting its replica.  Once nobody holds it,
    a VM with no record is gone."""
    plan = load_request_handlers()["replica_plan"]
    uuid, replicator, mover = str(uuidlib.uuid4()), "20260101-000000-aaaaaa", \
        "20260101-000000-bbbbbb"
    store.put(keys.replica(uuid), {"uuid": uuid, "vm": "db1", "every": 3600.0,
                                   "automation": replicator})
    store.put(keys.status(mover), {"state": "running"})
    locks.take(store, f"vm/{uuid}", mover, "moving it", kind="migrate", host="h1")
    on_h2 = SimpleNamespace(store=store, host="h2")
    waiting = plan(on_h2, {"uuid": uuid, "owner": replicator})
    assert waiting["state"] == "wait" and waiting["next"] - time.time() < 60, waiting
    store.put(keys.status(mover), {"state": "done"})
    assert plan(on_h2, {"uuid": uuid, "owner": replicator})["state"] == "stop"


def test_the_update_after_a_failover_or_a_move_starts_from_the_copy_a_host_keeps(
        cluster, store, tmp_path):
    """With no replica left (it became the VM's disks), the plan offers the
    copy another host keeps as the base of a delta, and puts that host
    first: the disks its stale copy left aside, or the disk a move froze
    there; while a host's stale copy is still being put aside, it waits."""
    start_hosts(cluster, store, tmp_path, ["h1", "h2", "h3"])
    uuid = boot(cluster, ["db1"], "h1")["db1"]
    plan = load_request_handlers()["replica_plan"]
    owner = "20260101-000000-cccccc"
    store.put(keys.replica(uuid), {"uuid": uuid, "vm": "db1", "every": 3600.0,
                                   "automation": owner, "seq": 4, "replica": None,
                                   "consumed": {"host": "h1", "seq": 4, "time": 1.0}})
    on_h1 = SimpleNamespace(store=store, host="h1")

    def planned():
        return plan(on_h1, {"uuid": uuid, "owner": owner})
    first = planned()
    assert (first["state"], first["candidates"], first["base"]) == \
        ("update", ["h2", "h3"], None), first

    store.put(keys.aside("h3", f"{uuid}-7"), {
        "uuid": uuid, "host": "h3", "name": "db1", "id": f"{uuid}-7", "time": 7.0,
        "volumes": [{"name": f"aside-{uuid}-7.qcow2", "path": "/x", "bytes": 1}]})
    aside = planned()
    assert aside["candidates"] == ["h3", "h2"] and aside["base"]["kind"] == "aside", aside
    assert aside["base"]["id"] == f"{uuid}-7" and aside["parent"] is None

    store.put(keys.disowned("h2", uuid), {"uuid": uuid, "host": "h2", "time": time.time()})
    assert planned()["state"] == "wait", "h2's stale copy is about to go aside"
    store.delete(keys.disowned("h2", uuid))

    store.delete(keys.aside("h3", f"{uuid}-7"))
    record = replicas.read(store, uuid)
    store.put(keys.replica(uuid), {**record, "kept": {
        "host": "h3", "seq": 4, "disks": [{"dev": "vda", "volume": "bk-x-vda.kept.qcow2"}]}})
    kept = planned()
    assert kept["candidates"] == ["h3", "h2"] and kept["base"]["kind"] == "kept", kept
    assert kept["frozen_on"] is None
