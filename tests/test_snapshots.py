"""Snapshots through the real command line on libvirt's test driver
(issue 29): ``snapshot create``, ``list``, ``revert``, ``delete``.

Listing reads etcd only (no peer runs in those tests); bad input is one
line, a non-zero exit and nothing written; end to end on two test-driver
peers, snapshots are created (with and without memory, under a default
name), listed with their host, reverted to and deleted, their records
following libvirt; and the refusal other features call names the snapshot.
"""
from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from engine.backups import snapshots
from engine.core import keys
from engine.errors import RequestError
from engine.operations.snapshots import default_name
from tests.support.cluster import boot_vms, refused, task_ids
from tests.support.raw import put_raw
from tests.support.records import listed_hosts, put_vm

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
ENTRY_KEYS = {"vm", "uuid", "host", "snapshots"}
SNAP_KEYS = {"name", "time", "age_s", "memory", "state"}
RESULT_KEYS = {"name", "uuid", "host", "state", "snapshots", "dropped", "error"}


def put_snapshot(store, vm, vm_uuid, name, host="host1", age_s=60.0, memory=False):
    store.put(keys.snapshot(vm_uuid, name), snapshots.record(
        vm, vm_uuid, host, name, time.time() - age_s, memory, "running"))


def snapshot_keys(store) -> list[str]:
    return sorted(kv.key for kv in store.range(keys.snapshot())[0])


@pytest.fixture
def recorded(store, etcd):
    """host1 and host2 listed (no peer runs), web1 with two snapshots, db1
    (on host2) with one, lone with none, and an unreadable record."""
    listed_hosts(store, ["host1", "host2"])
    web1, db1 = put_vm(store, "host1", "web1"), put_vm(store, "host2", "db1")
    put_vm(store, "host1", "lone")
    put_snapshot(store, "web1", web1, "before", age_s=7200)
    put_snapshot(store, "web1", web1, "after", age_s=600, memory=True)
    put_snapshot(store, "db1", db1, "s1", host="host2", age_s=60)
    put_raw(etcd.url, f"/peerctl/{store.cluster}/{keys.snapshot(web1, 'bad')}",
            b"\xc1 not msgpack")
    return {"web1": web1, "db1": db1}


def test_snapshot_list_reads_etcd_only_groups_json_by_vm_and_skips_garbage(cluster,
                                                                           recorded):
    done = cluster.cli("--format", "json", "snapshot", "list")
    assert done.returncode == 0, done.stderr
    assert "skipped unreadable key snapshots/" in done.stderr
    entries = {e["vm"]: e for e in json.loads(done.stdout)}
    assert set(entries) == {"web1", "db1"}
    assert all(set(e) == ENTRY_KEYS for e in entries.values())
    web1 = entries["web1"]
    assert (web1["uuid"], web1["host"]) == (recorded["web1"], "host1")
    assert [(s["name"], s["memory"]) for s in web1["snapshots"]] == [("before", False),
                                                                      ("after", True)]
    assert all(set(s) == SNAP_KEYS and ISO.match(s["time"]) for s in web1["snapshots"])
    assert entries["db1"]["host"] == "host2"

    done = cluster.cli("snapshot", "list", "--no-headers", "--separator", ",")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["db1,host2,s1,1m ago,no", "web1,host1,before,2h ago,no",
                                        "web1,host1,after,10m ago,yes"]
    header = cluster.cli("snapshot", "list").stdout.splitlines()[0].split()
    assert header == ["VM", "Host", "Name", "Age", "Memory"]

    assert [e["vm"] for e in cluster.cli_json("snapshot", "list", "host2/*")] == ["db1"]
    assert [s["name"] for e in cluster.cli_json("snapshot", "list", recorded["web1"])
            for s in e["snapshots"]] == ["before", "after"]
    done = cluster.cli("snapshot", "list", "lone")
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == \
        "peerctl: no snapshot matches 'lone'", done.stderr
    assert cluster.cli_json("snapshot", "list", "lone", expect_rc=1) == []
    refused(cluster, ["snapshot", "list", "a/b/c"], 2, "bad VM pattern")
    refused(cluster, ["snapshot", "list", "-o", "nosuch"], 2, "unknown field 'nosuch'")


def test_bad_snapshot_requests_are_one_line_and_write_nothing(cluster, recorded, store):
    store.delete(keys.snapshot(recorded["web1"], "bad"))     # its warning is tested above
    put_vm(store, "host1", "off", state="shutoff")
    put_vm(store, "host9", "far")           # its host is no live host: state unknown
    before, stored = task_ids(cluster), snapshot_keys(store)
    for bad in ("a/b", "two words", "x" * 65, "é", ".."):
        refused(cluster, ["snapshot", "create", "web1", "--name", bad], 2,
                "bad snapshot name")
    refused(cluster, ["snapshot", "revert", "web1", "a/b", "--yes"], 2, "bad snapshot name")
    refused(cluster, ["snapshot", "delete", "web1", "ok", "no way"], 2, "bad snapshot name")
    refused(cluster, ["snapshot", "create", "nosuch"], 1, "no VM matches 'nosuch'")
    refused(cluster, ["snapshot", "create", "web1", "--name", "before"], 1,
            "VM 'web1' already has a snapshot 'before'")
    refused(cluster, ["snapshot", "create", "off", "--memory"], 1,
            "VM 'off' is shutoff: --memory needs a running or paused VM")
    refused(cluster, ["snapshot", "create", "far"], 1, "which is down")
    refused(cluster, ["snapshot", "revert", "web1", "nosuch", "--yes"], 1,
            "VM 'web1' has no snapshot 'nosuch' (it has 'before', 'after')")
    refused(cluster, ["snapshot", "revert", "lone", "before", "--yes"], 1,
            "VM 'lone' has no snapshot 'before' (it has none)")
    refused(cluster, ["snapshot", "revert", "*", "before", "--yes"], 1,
            "VM pattern '*' matches 5 VMs (host1/lone, ")
    refused(cluster, ["snapshot", "revert", "web1", "before"], 2,
            "snapshot revert matches 1 VM: add --yes")
    refused(cluster, ["snapshot", "delete", "web1", "before", "nosuch"], 1,
            "VM 'web1' has no snapshot 'nosuch'")
    refused(cluster, ["snapshot", "delete", "web1", "before", "after"], 2,
            "snapshot delete matches 2 snapshots: add --yes")
    assert cluster.cli_json("snapshot", "revert", "web1", "nosuch", "--yes",
                            expect_rc=1) == {"automation": None, "state": "failed", "vms": []}
    dry = cluster.cli_json("snapshot", "revert", "web1", "before", "--dry-run")
    assert dry["state"] == "dry-run" and dry["vms"][0]["snapshot"] == "before"
    assert task_ids(cluster) == before and snapshot_keys(store) == stored


def test_refuse_if_snapshots_names_the_snapshot_and_the_way_out(store):
    vm_uuid = str(uuid.uuid4())
    snapshots.refuse_if_snapshots(store, vm_uuid, "web1", "migrating it")    # none: fine
    put_snapshot(store, "web1", vm_uuid, "old", age_s=100)
    put_snapshot(store, "web1", vm_uuid, "new", age_s=10)
    with pytest.raises(RequestError) as raised:
        snapshots.refuse_if_snapshots(store, vm_uuid, "web1", "migrating it")
    assert str(raised.value) == ("VM 'web1' has snapshot 'old' (and 1 more): migrating it "
                                 "would not carry it; delete it first (snapshot delete web1 "
                                 "old)")
    assert [s["name"] for s in snapshots.snapshots_of(store, vm_uuid)] == ["old", "new"]


def test_names_and_the_default_name():
    assert default_name(0) == "snap-19700101-000000"
    assert re.fullmatch(r"snap-\d{8}-\d{6}", default_name())
    assert snapshots.valid_name("a.b_c-D9") and snapshots.valid_name("x" * 64)
    assert not any(snapshots.valid_name(n) for n in ("", "x" * 65, "a/b", "a b", ".", "..",
                                                     None, 7))


def test_create_list_revert_delete_on_two_test_driver_peers(cluster, two_hosts, store):
    vms = boot_vms(cluster, "web1", "web2")
    web1 = vms["web1"]["uuid"]
    made = cluster.cli_json("snapshot", "create", "web*", "--name", "s1")
    assert made["state"] == "done", made
    assert all(set(row) == RESULT_KEYS for row in made["vms"])
    assert {(r["name"], r["state"], r["snapshots"][0]["name"], r["snapshots"][0]["memory"])
            for r in made["vms"]} == {("web1", "running", "s1", False),
                                      ("web2", "running", "s1", False)}
    record = store.get(keys.snapshot(web1, "s1")).value
    assert (record["vm"], record["host"], record["memory"], record["state"]) == \
        ("web1", "host1", False, "running")

    memory = cluster.cli_json("snapshot", "create", "web1", "--memory")
    assert memory["state"] == "done", memory
    default = memory["vms"][0]["snapshots"][0]
    assert re.fullmatch(r"snap-\d{8}-\d{6}", default["name"]) and default["memory"] is True
    listed = {e["vm"]: e for e in cluster.cli_json("snapshot", "list")}
    assert [s["name"] for s in listed["web1"]["snapshots"]] == ["s1", default["name"]]
    assert listed["web1"]["host"] == "host1"

    again = refused(cluster, ["snapshot", "create", "web1", "--name", "s1"], 1,
                    "already has a snapshot 's1'")
    assert again.stdout == ""

    reverted = cluster.cli_json("snapshot", "revert", "web1", "s1", "--yes")
    assert reverted["state"] == "done", reverted
    (row,) = reverted["vms"]
    assert (row["name"], row["state"], row["snapshots"][0]["name"]) == \
        ("web1", "running", "s1")

    deleted = cluster.cli_json("snapshot", "delete", "web1", "s1", default["name"], "--yes")
    assert deleted["state"] == "done", deleted
    assert [s["name"] for s in deleted["vms"][0]["snapshots"]] == ["s1", default["name"]]
    assert [kv.key for kv in store.range(keys.snapshot(web1, ""))[0]] == []
    assert [e["vm"] for e in cluster.cli_json("snapshot", "list")] == ["web2"]
    refused(cluster, ["snapshot", "revert", "web1", "s1", "--yes"], 1,
            "VM 'web1' has no snapshot 's1' (it has none)")


def test_moving_a_vm_with_a_snapshot_is_refused_naming_it(cluster, recorded, store):
    """A migration copies the disks as they are now, not their snapshots:
    migrate and evacuate refuse with one line, nothing started."""
    store.delete(keys.snapshot(recorded["web1"], "bad"))
    refused(cluster, ["migrate", "web1", "--to", "host2"], 1,
            "VM 'web1' has snapshot 'before' (and 1 more): moving it would not carry it; "
            "delete it first (snapshot delete web1 before)")
    refused(cluster, ["evacuate", "host2", "--yes"], 1,
            "VM 'db1' has snapshot 's1': evacuating its host would not carry it")
    assert store.range(keys.drained())[0] == []
    assert task_ids(cluster) == set()
