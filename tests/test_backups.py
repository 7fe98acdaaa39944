"""Backups and restores on the test driver, driven through the engine: the
records, the chain's plan, the refusals of the hosts, and that nothing is
left when an attempt ends (the QEMU tier proves the data: test_backups_qemu)."""
from __future__ import annotations

import time

import libvirt
import pytest

from engine.backups import schedules
from engine.core import api, keys
from engine.core.values import readable
from tests.support import wait_for, wait_until
from tests.support.cluster import finished, refused, start_peers
from tests.support.hooks import write_hook


def _boot(cluster, name, on="host1"):
    booted = cluster.cli_json("boot", name, "--on", on, "--network", "none",
                              "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    (vm,) = booted["vms"]
    return vm


def _backups(store):
    return [readable(kv) for kv in store.range(keys.backup())[0]]


def _back_up(store, vm, **args):
    return finished(store, api.start_automation(store, "backup", {
        "vms": [{"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"],
                 "state": "running"}], **args}))


def test_a_backup_is_recorded_on_the_other_host_and_restores_the_vm(cluster, store, two_hosts):
    vm = _boot(cluster, "db1")
    task = _back_up(store, vm)
    assert task["state"] == "done", task
    (row,) = task["result"]["vms"]
    assert (row["target"], row["kind"], row["error"]) == ("host2", "full", None), row
    (record,) = _backups(store)
    assert (record["id"], record["uuid"], record["host"], record["target"]) == \
        (row["backup"], vm["uuid"], "host1", "host2")
    assert record["build"]["vcpus"] == 1 and record["disks"][0]["dev"] == "vda"

    cluster.cli_json("destroy", "db1", "--yes")
    restored = finished(store, api.start_automation(store, "restore", {
        "backup": record["id"], "name": "db1", "uuid": vm["uuid"]}))
    assert restored["state"] == "done", restored
    (back,) = restored["result"]["vms"]
    assert (back["uuid"], back["state"], back["restored_from"]) == \
        (vm["uuid"], "running", record["id"]), back
    listed = {v["name"]: v for v in cluster.cli_json("vmlist")}
    assert listed["db1"]["uuid"] == vm["uuid"]


def _mine(store, uuid):
    return sorted((b for b in _backups(store) if b and b["uuid"] == uuid),
                  key=lambda b: b["time"])


def test_a_schedule_keeps_exactly_what_its_retention_says(cluster, store, two_hosts):
    vm = _boot(cluster, "web1")
    record = schedules.put(store, "web*", every=1, keep={"last": 2})
    ran = wait_until(lambda: schedules.read(store, record["id"]),
                     lambda r: r.get("runs", 0) >= 4, timeout=60, what="four runs")
    assert ran["last_run"]["deleted"] and not ran["last_run"]["errors"], ran
    schedules.delete(store, record["id"])          # it ends at its next look, after any run
    assert finished(store, ran["automation"])["state"] == "done"
    kept = _mine(store, vm["uuid"])
    assert len(kept) == 2, kept
    assert kept[-1]["kind"] == "full"               # the test driver's are all full


@pytest.mark.slow       # a long scenario: every member dead through a scheduled run
def test_a_run_missed_while_no_initiator_lived_happens_once(cluster, store, two_hosts):
    members = ["m1", "m2", "m3"]
    start_peers(cluster, store, members)
    vm = _boot(cluster, "db1")
    every = 2.0
    record = schedules.put(store, "db1", every=every, keep={}, prefer=members)
    first = wait_until(lambda: schedules.read(store, record["id"]), lambda r: r.get("last"),
                       timeout=30, what="the first run")
    for member in members:
        cluster.kill(member)
    wait_for(lambda: not set(members) & set(api.live_hosts(store)), what="members gone")
    down = wait_until(lambda: schedules.read(store, record["id"]),
                      lambda r: time.time() > r["next"] + 3 * every, timeout=30,
                      what="three intervals missed")
    assert down["last"] == first["last"] or down["last"] < first["last"] + every * 1.5
    before = len(_mine(store, vm["uuid"]))
    back = time.time()
    for member in members:
        cluster.start_peer(member)
    caught_up = wait_until(lambda: schedules.read(store, record["id"]),
                           lambda r: r["last"] >= back - 0.5, timeout=60,
                           what="the missed run, once a member is back")
    assert len(_mine(store, vm["uuid"])) == before + 1, "one run for the missed ones"
    assert caught_up["next"] >= caught_up["last"] + every - 0.01
    schedules.delete(store, record["id"])


def test_a_vm_being_backed_up_is_neither_destroyed_nor_moved_meanwhile(cluster, store,
                                                                       tmp_path):
    hooks, release = str(tmp_path / "hooks"), tmp_path / "release"
    write_hook(hooks, "backup_take", "pre", f"""
while not os.path.exists({str(release)!r}):
    time.sleep(0.05)
""")
    start_peers(cluster, store, ["host1", "host2", "host3"], hooks=hooks)
    wait_for(lambda: {"host1", "host2", "host3"} <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what="providers")
    vm = _boot(cluster, "db1")
    automation = api.start_automation(store, "backup", {
        "vms": [{"name": "db1", "uuid": vm["uuid"], "host": "host1", "state": "running"}]})
    wait_for(lambda: any(e["request"] == "backup_take"
                         for e in api.get_task(store, automation)["log"]),
             what="the backup to be taking its point in time")
    refused(cluster, ["destroy", "db1", "--yes"], 1, "being backed up")
    refused(cluster, ["migrate", "db1", "--to", "host3", "--yes"], 1, "being backed up")
    release.touch()
    assert finished(store, automation)["state"] == "done"
    assert [v["host"] for v in cluster.cli_json("vmlist") if v["name"] == "db1"] == ["host1"]


def test_a_drained_host_keeps_no_backup(cluster, store, two_hosts):
    _boot(cluster, "db1")
    cluster.cli_json("drain", "host2")
    refused(cluster, ["backup", "db1"], 1, "no host")
    assert _backups(store) == []
