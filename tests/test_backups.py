"""Backups and restores on the test driver, driven through the engine: the
records, the chain's plan, the refusals of the hosts, and that nothing is
left when an attempt ends (the QEMU tier proves the data: test_backups_qemu)."""
from __future__ import annotations

from engine.core import api, keys
from engine.core.values import readable
from tests.support.cluster import finished


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
