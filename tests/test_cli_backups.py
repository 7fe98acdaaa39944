"""Backups through the real command line (issue 28) on libvirt's test
driver: ``backup``, ``backup list``, ``backup delete``, ``backup schedule``
(set, list, delete), ``restore``, vmlist's ``backup`` column and what
``destroy`` says of the backups it keeps.  Bad input is one line, a
non-zero exit and nothing written; listings survive an unreadable backup or
schedule record; and, end to end on two real peers, a VM backed up to the
other host, destroyed, and restored under its old name and as a second VM,
and a schedule every second that keeps exactly its last backup."""
from __future__ import annotations

import io
import json
import re
import time
import uuid

import pytest

from engine.commandline.progress import ProgressView
from engine.core import keys
from engine.core.store import Put
from engine.leases.times import parse_time
from tests.support import wait_for, wait_until
from tests.support.cluster import (boot_vms, finished, listed_vms, ready_hosts, refused,
                                   start_peers, task_ids)
from tests.support.raw import put_raw
from tests.support.records import listed_hosts, put_vm

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
LIST_KEYS = {"id", "vm", "uuid", "host", "target", "time", "age_s", "kind", "parent",
             "bytes", "consistency", "reason", "newest", "schedule", "protected", "lost"}
BACKUP_KEYS = {"name", "uuid", "host", "state", "backup", "kind", "bytes", "consistency",
               "target", "reason", "error"}
RESTORE_KEYS = {"name", "uuid", "host", "state", "restored_from", "error"}
SCHEDULE_KEYS = {"schedule", "pattern", "every", "keep", "to", "next", "last", "runs",
                 "last_run", "automation"}
VM_KEYS = {"name", "uuid", "host", "state", "error"}


# -- helpers ------------------------------------------------------------------------

def backup_record(backup_id, vm, vm_uuid, *, age_s=60.0, kind="full", parent=None,
                  host="host1", target="host2") -> dict:
    """A well-formed record, as the engine writes one once a backup is verified."""
    return {"id": backup_id, "vm": vm, "uuid": vm_uuid, "host": host, "target": target,
            "time": time.time() - age_s, "kind": kind, "parent": parent, "bytes": 1 << 20,
            "consistency": "crash-consistent", "reason": None, "pool": "peerctl-backups",
            "disks": [{"dev": "vda", "volume": f"backup-{backup_id}-vda", "capacity": 1 << 30,
                       "bytes": 1 << 20, "checksum": "sha256:" + "0" * 64}],
            "build": {"name": vm, "vcpus": 1, "memory_mb": 64, "disk_gb": 1},
            "automation": "20260101-000000-abcdef"}


def put_backups(store, *records) -> None:
    store.txn([], [Put(keys.backup(r["id"]), r) for r in records])


def backup_keys(store) -> list[str]:
    return sorted(kv.key for kv in store.range(keys.backup())[0])


# -- listings, from records written straight into etcd ----------------------------------

@pytest.fixture
def backed_up(store, etcd):
    """host1 and host2 live; web1 with a full backup and an incremental on
    top, db1 with one, lone with none, a destroyed VM's backup, and two
    unreadable records under backups/."""
    listed_hosts(store, ["host1", "host2"])
    web1, db1 = put_vm(store, "host1", "web1"), put_vm(store, "host1", "db1")
    put_vm(store, "host2", "lone")
    put_backups(store, backup_record("aaaa", "web1", web1, age_s=7200),
                backup_record("bbbb", "web1", web1, age_s=600, kind="incremental",
                              parent="aaaa"),
                backup_record("cccc", "db1", db1, age_s=60),
                backup_record("dddd", "gone", str(uuid.uuid4()), host="host2",
                              target="host1", age_s=86400))
    put_raw(etcd.url, f"/peerctl/{store.cluster}/{keys.backup('eeee')}", b"\xc1 not msgpack")
    store.put(keys.backup("ffff"), {"vm": 7, "uuid": None})
    return {"web1": web1, "db1": db1}


def test_backup_list_marks_each_vms_newest_and_survives_unreadable_records(cluster,
                                                                           backed_up):
    done = cluster.cli("--format", "json", "backup", "list")
    assert done.returncode == 0, done.stderr
    warnings = done.stderr.splitlines()
    assert len(warnings) == 2 and all("skipped unreadable key backups/" in line
                                      for line in warnings), warnings
    rows = {row["id"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"aaaa", "bbbb", "cccc", "dddd"}
    assert all(set(row) == LIST_KEYS for row in rows.values())
    assert {i: row["newest"] for i, row in rows.items()} == {
        "aaaa": False, "bbbb": True, "cccc": True, "dddd": True}
    web1 = rows["bbbb"]
    assert (web1["vm"], web1["uuid"], web1["host"], web1["target"], web1["kind"],
            web1["parent"], web1["bytes"], web1["consistency"]) == (
        "web1", backed_up["web1"], "host1", "host2", "incremental", "aaaa", 1 << 20,
        "crash-consistent")
    assert ISO.match(web1["time"]) and 590 < web1["age_s"] < 900, web1
    # records written before issue 48 have neither field: taken by hand, unprotected
    assert (web1["schedule"], web1["protected"]) == (None, False)

    done = cluster.cli("backup", "list", "-o", "id,vm,age_s,newest", "--no-headers",
                       "--separator", ",")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["cccc,db1,1m ago,*", "dddd,gone,1d ago,*",
                                        "aaaa,web1,2h ago,", "bbbb,web1,10m ago,*"]
    header = cluster.cli("backup", "list").stdout.splitlines()[0].split()
    assert header == ["Id", "VM", "Host", "Target", "Age", "Kind", "Bytes", "Consistency",
                      "Schedule", "Protected", "Newest"]

    assert [r["id"] for r in cluster.cli_json("backup", "list", "web1")] == ["aaaa", "bbbb"]
    assert [r["id"] for r in cluster.cli_json("backup", "list", backed_up["db1"])] == ["cccc"]
    assert [r["id"] for r in cluster.cli_json("backup", "list", "host2/*")] == ["dddd"]
    done = cluster.cli("backup", "list", "lone")
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == \
        "peerctl: no backup matches 'lone'", done.stderr
    assert cluster.cli_json("backup", "list", "lone", expect_rc=1) == []
    refused(cluster, ["backup", "list", "a/b/c"], 2, "bad VM pattern")
    refused(cluster, ["backup", "list", "-o", "nosuch"], 2, "unknown field 'nosuch'")


def test_vmlist_shows_the_age_of_each_vms_newest_backup(cluster, backed_up):
    done = cluster.cli("--format", "json", "vmlist")
    assert done.returncode == 0, done.stderr
    assert all("skipped unreadable key backups/" in line for line in done.stderr.splitlines())
    listed = {vm["name"]: vm for vm in json.loads(done.stdout)}
    assert listed["lone"]["backup"] is None
    assert listed["web1"]["backup"]["id"] == "bbbb" and ISO.match(listed["web1"]["backup"]["time"])
    assert listed["db1"]["backup"]["id"] == "cccc"

    done = cluster.cli("vmlist", "-o", "name,backup", "--no-headers", "--separator", ",")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["db1,1m ago", "web1,10m ago", "lone,-"]
    done = cluster.cli("vmlist", "-o", "+backup")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == ["Host", "Name", "VCPUs", "Memory", "State",
                                                   "IP", "Backup"]
    assert cluster.cli_json("vmlist", "-o", "name,backup", "lone") == [
        {"name": "lone", "backup": None}]


# -- refusals: one line, nothing written ------------------------------------------------

@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_bad_backups_and_restores_are_refused_in_one_line_and_write_nothing(cluster,
                                                                           two_hosts, store):
    booted = boot_vms(cluster, "web1", "web2")
    web1 = booted["web1"]["uuid"]
    gone = str(uuid.uuid4())
    put_backups(store, backup_record("f1", "web1", web1, age_s=600),
                backup_record("i1", "web1", web1, kind="incremental", parent="f1"),
                backup_record("g1", "web2", gone, age_s=30),       # a destroyed VM's name, reused
                backup_record("h9", "old", str(uuid.uuid4()), target="host9"))
    before, stored = task_ids(cluster), backup_keys(store)

    refused(cluster, ["backup", "nosuch"], 1, "no VM matches 'nosuch'")
    refused(cluster, ["backup", "host1/web1/x"], 2, "bad VM pattern")
    refused(cluster, ["backup", "web1", "--to", "a/b"], 2, "bad host pattern 'a/b'")
    refused(cluster, ["backup", "web1", "--to", "nosuch*"], 1,
            "no host to back up VM 'web1' to: --to 'nosuch*' matches no host")
    refused(cluster, ["backup", "web1", "--to", "host1"], 1,
            "no host to back up VM 'web1' to: --to 'host1' offers only host1, where it is")
    refused(cluster, ["backup", "--to", "host1", "web*", "--yes"], 1,
            "no host to back up VMs 'web1', 'web2' to: --to 'host1' offers only host1, "
            "where they are")
    refused(cluster, ["backup", "web*"], 2, "backup matches 2 VMs: add --yes")
    assert cluster.cli_json("backup", "nosuch", expect_rc=1) == {
        "automation": None, "state": "failed", "vms": []}

    refused(cluster, ["backup", "delete", "nosuch", "f1"], 1, "no backup 'nosuch'")
    refused(cluster, ["backup", "delete", "a/b"], 2, "bad backup id 'a/b'")
    refused(cluster, ["backup", "delete", "f1"], 1,
            "backup f1 is the parent of i1 (incremental): delete i1 first, or both")
    refused(cluster, ["backup", "delete", "h9"], 1, "host host9 is down")
    refused(cluster, ["backup", "delete", "i1", "f1"], 2, "backup delete matches 2 backups: "
            "add --yes")
    assert cluster.cli_json("backup", "delete", "nosuch", expect_rc=1) == {
        "automation": None, "state": "failed", "backups": []}
    dry = cluster.cli_json("backup", "delete", "f1", "i1", "--dry-run")
    assert dry["state"] == "dry-run" and [b["id"] for b in dry["backups"]] == ["i1", "f1"]

    refused(cluster, ["restore", "nosuch"], 1, "no backup 'nosuch'")
    refused(cluster, ["restore", "i1"], 1,
            "VM 'web1' still exists (on host1): restore it as a new VM with --as NAME")
    refused(cluster, ["restore", "i1", "--as", "web2"], 1, "VM name already in use: web2")
    refused(cluster, ["restore", "g1"], 1, "VM name already in use: web2 (on host1)")
    refused(cluster, ["restore", "i1", "--as", "bad*name"], 2, "bad VM name 'bad*name'")
    refused(cluster, ["restore", "i1", "--as", "new1", "--on", "nosuch*"], 1,
            "no host matches --on 'nosuch*'")
    refused(cluster, ["restore", "h9", "--as", "new1"], 1, "host9, which keeps backup h9, is down")

    assert task_ids(cluster) == before and backup_keys(store) == stored
    assert set(listed_vms(cluster)) == {"web1", "web2"}


def test_a_single_host_has_no_other_host_to_back_up_to(cluster, store):
    ready_hosts(cluster, store, ["host1"])
    boot_vms(cluster, "solo")
    before = task_ids(cluster)
    refused(cluster, ["backup", "solo"], 1,
            "no host to back up VM 'solo' to: the cluster offers only host1, where it is")
    refused(cluster, ["backup", "solo", "--dry-run"], 1, "no host to back up VM 'solo'")
    assert task_ids(cluster) == before and backup_keys(store) == []


@pytest.mark.parametrize("command", [
    ["backup"], ["backup", "a/b/c"], ["backup", "web1", "--to", "a/b"],
    ["backup", "delete"], ["backup", "delete", "a b"], ["backup", "list", "-o", "nosuch"],
    ["restore"], ["restore", "x", "--as", "no/name"], ["restore", "x/y"],
    ["backup", "schedule"], ["backup", "schedule", "web*"],
    ["backup", "schedule", "web*", "--every", "0"],
    ["backup", "schedule", "--every", "1h", "web*", "--keep-last", "0"],
    ["backup", "schedule", "a/b/c", "--every", "1h"],
    ["backup", "--full", "schedule", "web*", "--every", "1h"],
    ["backup", "schedule", "delete"], ["backup", "schedule", "delete", "a/b/c"],
    ["backup", "schedule", "list", "-o", "nosuch"]])
def test_usage_errors_come_before_etcd(cluster, command):
    done = cluster.cli("--etcd", "http://127.0.0.1:1", *command, input="")
    assert done.returncode == 2, (command, done.stderr)
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


# -- end to end, on two peers --------------------------------------------------------

@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_vm_backed_up_destroyed_and_restored_twice(cluster, two_hosts, store):
    vm_uuid = boot_vms(cluster, "web1")["web1"]["uuid"]
    before = task_ids(cluster)
    dry = cluster.cli_json("backup", "web1", "--dry-run")
    assert dry == {"automation": None, "state": "dry-run", "vms": [
        {"name": "web1", "uuid": vm_uuid, "host": "host1", "state": "running"}]}
    assert task_ids(cluster) == before

    done = cluster.cli("--format", "json", "backup", "web1")
    assert done.returncode == 0, done.stderr
    assert "web1 on host1: backed up" in done.stderr
    doc = json.loads(done.stdout)
    assert doc["state"] == "done" and set(doc) == {"automation", "state", "vms"}, doc
    (taken,) = doc["vms"]
    assert set(taken) == BACKUP_KEYS
    assert (taken["name"], taken["uuid"], taken["host"], taken["target"], taken["kind"],
            taken["error"]) == ("web1", vm_uuid, "host1", "host2", "full", None), taken
    backup_id = taken["backup"]

    (row,) = cluster.cli_json("backup", "list")
    assert (row["id"], row["vm"], row["uuid"], row["target"], row["kind"], row["newest"]) == (
        backup_id, "web1", vm_uuid, "host2", "full", True)
    shown = cluster.cli_json("vmlist", "-o", "name,backup")
    assert shown == [{"name": "web1", "backup": {"id": backup_id, "time": row["time"]}}]
    table = cluster.cli("vmlist", "-o", "name,backup", "--no-headers", "--separator", ",")
    assert re.fullmatch(r"web1,\d+s ago\n", table.stdout), table.stdout

    assert cluster.cli_json("destroy", "web1")["state"] == "done"
    wait_for(lambda: "web1" not in listed_vms(cluster), what="web1 gone from vmlist")
    doc = cluster.cli_json("restore", backup_id)
    assert doc["state"] == "done" and set(doc) == {"automation", "state", "vms"}, doc
    (back,) = doc["vms"]
    assert set(back) == RESTORE_KEYS
    assert (back["name"], back["uuid"], back["restored_from"], back["error"]) == (
        "web1", vm_uuid, backup_id, None)
    wait_for(lambda: listed_vms(cluster).get("web1", {}).get("uuid") == vm_uuid,
             what="web1 back under its uuid")

    refused(cluster, ["restore", backup_id], 1, "VM 'web1' still exists")
    doc = cluster.cli_json("restore", backup_id, "--as", "other")
    (copy,) = doc["vms"]
    assert doc["state"] == "done" and copy["name"] == "other" and copy["uuid"] != vm_uuid
    wait_for(lambda: {"web1", "other"} <= set(listed_vms(cluster)), what="web1 and other listed")

    doc = cluster.cli_json("backup", "delete", backup_id, "--yes")
    assert doc == {"automation": doc["automation"], "state": "done", "backups": [
        {"id": backup_id, "vm": "web1", "target": "host2", "state": "deleted", "error": None}]}
    assert cluster.cli_json("backup", "list") == [] and backup_keys(store) == []
    assert cluster.cli_json("vmlist", "-o", "name,backup", "web1") == [
        {"name": "web1", "backup": None}]


# -- schedules ------------------------------------------------------------------------

def schedule_keys(store) -> dict[str, int]:
    """``{key: mod revision}`` under schedules/backup/: what a refusal must not touch."""
    return {kv.key: kv.mod_revision for kv in store.range(keys.backup_schedule())[0]}


def listed_schedules(cluster) -> dict:
    """``backup schedule list`` by pattern."""
    return {row["pattern"]: row for row in cluster.cli_json("backup", "schedule", "list")}


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_bad_schedules_are_refused_in_one_line_and_write_nothing(cluster, store):
    start_peers(cluster, store, ["host1"])
    web = cluster.cli_json("backup", "schedule", "web*", "--every", "1h", "--keep-last", "2")
    cluster.cli_json("backup", "schedule", "db*", "--every", "1d")
    before, stored = task_ids(cluster), schedule_keys(store)

    for every, said in [("0", "bad interval '0': at least 1s"), ("0s", "bad interval '0s'"),
                        ("-1s", "bad interval '-1s' (want seconds"),
                        ("-5", "bad interval '-5'"), ("abc", "bad interval 'abc'"),
                        ("0.5", "bad interval '0.5': at least 1s"),
                        ("400d", "at most 366d")]:
        refused(cluster, ["backup", "schedule", "web*", f"--every={every}"], 2, said)
    for option, count in [("last", "0"), ("daily", "-1"), ("weekly", "abc"),
                          ("last", "1.5"), ("daily", "10000000")]:
        refused(cluster, ["backup", "schedule", "web*", "--every", "2h",
                          f"--keep-{option}={count}"], 2, f"bad keep-{option} {count!r}")
    refused(cluster, ["backup", "schedule", "host1/web1/x", "--every", "1h"], 2,
            "bad VM pattern 'host1/web1/x'")
    refused(cluster, ["backup", "schedule", "host1/", "--every", "1h"], 2, "bad VM pattern")
    refused(cluster, ["backup", "schedule", "web[", "--every", "1h"], 2, "unclosed '['")
    refused(cluster, ["backup", "schedule", "web*", "--every", "1h", "--to", "a/b"], 2,
            "bad host pattern 'a/b'")
    refused(cluster, ["backup", "schedule", "web*"], 2, "needs --every DURATION")
    refused(cluster, ["backup", "--full", "schedule", "web*", "--every", "1m"], 2,
            "--full is an option of backup PATTERN..., not of backup schedule")

    refused(cluster, ["backup", "schedule", "delete", "nosuch"], 1,
            "no backup schedule 'nosuch' (see backup schedule list)")
    refused(cluster, ["backup", "schedule", "delete", "web*", "nosuch", "--yes"], 1,
            "no backup schedule 'nosuch'")
    refused(cluster, ["backup", "schedule", "delete", "web*", "db*"], 2,
            "backup schedule delete matches 2 schedules: add --yes")
    assert cluster.cli_json("backup", "schedule", "delete", "nosuch", expect_rc=1) == {
        "state": "failed", "schedules": []}

    assert schedule_keys(store) == stored and task_ids(cluster) == before
    listed = listed_schedules(cluster)
    assert set(listed) == {"web*", "db*"}
    assert (listed["web*"]["every"], listed["web*"]["keep"]) == (3600, {"last": 2})
    assert listed["web*"]["schedule"] == web["schedule"]


def test_a_schedule_is_listed_and_scheduling_its_pattern_again_changes_it(cluster, store):
    start_peers(cluster, store, ["host1"])
    doc = cluster.cli_json("backup", "schedule", "web*", "--every", "1h", "--keep-daily", "7",
                           "--keep-last", "3")
    assert set(doc) == SCHEDULE_KEYS | {"state", "matching"}, doc
    assert (doc["state"], doc["pattern"], doc["every"], doc["keep"], doc["to"], doc["last"],
            doc["runs"], doc["last_run"]) == (
        "created", "web*", 3600, {"last": 3, "daily": 7}, None, None, 0, None)
    assert ISO.match(doc["next"]) and 3500 < parse_time(doc["next"]) - time.time() <= 3600
    assert re.fullmatch(r"[0-9a-f]{12}", doc["schedule"]) and doc["automation"]

    done = cluster.cli("backup", "schedule", "db1", "--to", "host2", "--every", "90m")
    assert done.returncode == 0, done.stderr
    db1 = listed_schedules(cluster)["db1"]
    assert done.stdout.splitlines()[-1] == (f"backup schedule {db1['schedule']} created: db1 "
                                            "every 90m to hosts matching 'host2', keeping all")
    done = cluster.cli("backup", "schedule", "*/list", "--every", "1d")    # a VM named list
    assert done.returncode == 0 and "created: */list every 1d" in done.stdout, done.stderr

    rows = cluster.cli_json("backup", "schedule", "list")
    assert [row["pattern"] for row in rows] == ["*/list", "db1", "web*"]
    assert all(set(row) == SCHEDULE_KEYS for row in rows)
    assert {k: v for k, v in rows[2].items() if k != "state"} == \
        {k: v for k, v in doc.items() if k not in ("state", "matching")}
    assert (rows[1]["every"], rows[1]["keep"], rows[1]["to"]) == (5400, {}, "host2")
    table = cluster.cli("backup", "schedule", "list", "-o", "pattern,every,keep,last,runs,next",
                        "--no-headers", "--separator", ";")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert [line.rsplit(";", 1)[0] for line in lines] == [
        "*/list;1d;all;-;0", "db1;90m;all;-;0", "web*;1h;last=3,daily=7;-;0"]
    assert re.fullmatch(r"in (1h29m|1h30m)", lines[1].rsplit(";", 1)[1]), lines
    header = cluster.cli("backup", "schedule", "list").stdout.splitlines()[0].split()
    assert header == ["Id", "Pattern", "Every", "Keep", "Next", "Last", "Runs"]

    done = cluster.cli("backup", "schedule", "web*", "--every", "2h", "--keep-weekly", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (f"backup schedule {doc['schedule']} changed: web* "
                                            "every 2h, keeping weekly=4")
    again = listed_schedules(cluster)
    assert len(again) == 3
    assert (again["web*"]["schedule"], again["web*"]["every"], again["web*"]["keep"],
            again["web*"]["automation"]) == (doc["schedule"], 7200, {"weekly": 4},
                                             doc["automation"])

    done = cluster.cli("backup", "schedule", "delete", "db1", "*/list", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == ("2 backup schedules deleted; the backups they "
                                            "took are kept (backup list shows them, backup "
                                            "delete removes them)")
    gone = cluster.cli_json("backup", "schedule", "delete", doc["schedule"])
    assert gone["state"] == "deleted" and [s["schedule"] for s in gone["schedules"]] == \
        [doc["schedule"]] and set(gone["schedules"][0]) == SCHEDULE_KEYS
    assert cluster.cli_json("backup", "schedule", "list") == [] and schedule_keys(store) == {}
    assert finished(store, doc["automation"])["state"] == "done"   # it ended at its next look


def test_a_schedule_every_second_keeps_exactly_its_last_backup(cluster, store, two_hosts):
    vm_uuid = boot_vms(cluster, "web1")["web1"]["uuid"]
    doc = cluster.cli_json("backup", "schedule", "web1", "--every", "1s", "--keep-last", "1")
    ran = wait_until(lambda: listed_schedules(cluster)["web1"],
                     lambda row: row["runs"] >= 2, timeout=90, interval=0.3,
                     what="two runs of the schedule")
    assert ran["last_run"]["deleted"] and not ran["last_run"]["errors"], ran
    assert ran["last_run"]["backups"] and ISO.match(ran["last"]), ran
    # A run in flight when its schedule is deleted takes its backup but prunes
    # nothing: the interval goes to an hour first, and the schedule is deleted
    # once a run under it has ended (its next one an hour away), so none is.
    cluster.cli_json("backup", "schedule", "web1", "--every", "1h", "--keep-last", "1")
    idle = wait_until(lambda: listed_schedules(cluster)["web1"],
                      lambda row: parse_time(row["next"]) > time.time() + 600, timeout=60,
                      interval=0.3, what="a run under the hour's interval")
    assert not idle["last_run"]["errors"], idle
    done = cluster.cli("backup", "schedule", "delete", "web1")
    assert done.returncode == 0 and "the backups they took are kept" in done.stdout
    assert finished(store, doc["automation"])["state"] == "done"
    (kept,) = cluster.cli_json("backup", "list", "web1")
    assert (kept["uuid"], kept["newest"], kept["id"]) == (vm_uuid, True,
                                                          idle["last_run"]["backups"][0]), kept


def test_schedule_list_survives_unreadable_records(cluster, store, etcd):
    now = time.time()
    store.put(keys.backup_schedule("aaaa"), {
        "id": "aaaa", "pattern": "web*", "every": 3600.0, "keep": {"last": 2}, "to": None,
        "created": now, "changed": now, "next": now + 3600, "last": None, "automation": None})
    put_raw(etcd.url, f"/peerctl/{store.cluster}/{keys.backup_schedule('bbbb')}",
            b"\xc1 not msgpack")
    store.put(keys.backup_schedule("cccc"), {"id": 7, "pattern": None})
    done = cluster.cli("--format", "json", "backup", "schedule", "list")
    assert done.returncode == 0, done.stderr
    warnings = done.stderr.splitlines()
    assert len(warnings) == 2 and all("skipped unreadable key schedules/backup/" in line
                                      for line in warnings), warnings
    (row,) = json.loads(done.stdout)
    assert (row["schedule"], row["every"], row["keep"], row["runs"], row["last"]) == (
        "aaaa", 3600, {"last": 2}, 0, None)
    done = cluster.cli("backup", "schedule", "list", "--no-headers", "-o", "schedule,keep")
    assert done.returncode == 0 and done.stdout.split() == ["aaaa", "last=2"], done
    done = cluster.cli("backup", "schedule", "delete", "bbbb")
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == (
        "peerctl: backup schedule bbbb is unreadable: scrub lists it, and scrub --delete "
        "removes it"), done.stderr


# -- destroy keeps backups ------------------------------------------------------------

def test_destroy_says_which_backups_it_keeps(cluster, store, two_hosts):
    booted = boot_vms(cluster, "db1", "db2", "web1")
    db1, db2 = booted["db1"]["uuid"], booted["db2"]["uuid"]
    put_backups(store, backup_record("k1", "db1", db1, age_s=600),
                backup_record("k2", "db1", db1, kind="incremental", parent="k1"),
                backup_record("k3", "db1", db1, age_s=30), backup_record("k4", "db2", db2))

    done = cluster.cli("destroy", "db1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == ("db1: its 3 backups are kept (backup list db1); "
                                            "backup delete removes them")
    doc = cluster.cli_json("destroy", "db2", "web1", "--yes")
    rows = {row["name"]: row for row in doc["vms"]}
    assert rows["db2"]["backups_kept"] == 1 and set(rows["db2"]) == VM_KEYS | {"backups_kept"}
    assert set(rows["web1"]) == VM_KEYS, rows
    wait_for(lambda: not listed_vms(cluster), what="the three VMs gone")
    assert sorted(row["id"] for row in cluster.cli_json("backup", "list")) == \
        ["k1", "k2", "k3", "k4"]


# -- the progress lines (history in, lines out, no etcd) ------------------------------

def step(index, request, target, status="ok", label="web1", **more):
    return {"index": index, "request": request, "target": target, "status": status,
            "executor": target, "label": label, "time": "2026-11-25T10:04:01Z", **more}


def plain(kind, log, args, result, state="done") -> list[str]:
    """The plain lines of an automation followed step by step (each step
    seen running, then as logged), then ended."""
    task = {"id": "a1", "kind": kind, "state": "running", "args": args, "result": None,
            "log": []}
    out = io.StringIO()
    view = ProgressView(out, "a1", tty=False, stamp=lambda: "10:04:01")
    for i, entry in enumerate(log):
        if entry["status"] != "running":
            view.update(dict(task, log=log[:i] + [dict(entry, status="running")]))
        view.update(dict(task, log=log[:i + 1]))
    view.update(dict(task, state=state, result=result, log=log))
    return [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]


def test_a_backup_says_where_it_is_copied_and_verified_not_its_bookkeeping():
    copying = {"phase": "copying 12.0 MiB of 20.0 MiB", "percent": 60, "bytes": 12 << 20,
               "total": 20 << 20}
    log = [step(0, "lock_vm", "host3"), step(1, "backup_plan", "host3"),
           step(2, "move_describe", "host1"), step(3, "backup_store", "host2"),
           step(4, "backup_take", "host1", progress=copying),     # seen running with it
           step(5, "backup_verify", "host2"), step(6, "backup_prune", "host1"),
           step(7, "unlock_vm", "host3")]
    lines = plain("backup", log,
                  {"vms": [{"name": "web1", "uuid": "u1", "host": "host1", "state": "running"}]},
                  {"vms": [{"name": "web1", "state": "done", "error": None}]})
    assert lines == ["web1 on host1: backing up  copying 12.0 MiB of 20.0 MiB 60%",
                     "web1 on host1: backed up", "web1 on host1: verified on host2"]


def test_a_restore_names_the_host_it_lands_on():
    log = [step(0, "restore_plan", "host1"), step(1, "claim", "host1"),
           step(2, "restore_disks", "host3"), step(3, "build", "host3")]
    lines = plain("restore", log, {"backup": "b1", "name": "web1", "uuid": None, "on": None},
                  {"vms": [{"name": "web1", "host": "host3", "state": "running",
                            "error": None}]})
    assert lines == ["web1 on host3: restoring its disks", "web1 on host3: disks restored",
                     "web1 on host3: building", "web1 on host3: built"]


def test_a_backup_delete_that_fails_says_so_once_per_step_and_once_at_the_end():
    log = [step(0, "backup_delete", "host2", label="web1"),
           step(1, "backup_delete", "host2", "error", label="db1", error="pool gone")]
    lines = plain("backup_delete", log, {"backups": [
        {"id": "b1", "vm": "web1", "uuid": "u1", "target": "host2"},
        {"id": "b2", "vm": "db1", "uuid": "u2", "target": "host2"}]},
        {"backups": [{"id": "b1", "vm": "web1", "target": "host2", "state": "deleted",
                      "error": None},
                     {"id": "b2", "vm": "db1", "target": "host2", "state": "error",
                      "error": "pool gone"}]}, state="failed")
    assert lines == ["web1: deleting its backup on host2", "web1: backup deleted on host2",
                     "db1: deleting its backup on host2",
                     "db1: backup delete failed: pool gone", "db1: failed: pool gone"]
