"""Backups nobody asked to prune are kept (issue 48, item 6), through the
real command line on libvirt's test driver with real peers: a schedule
prunes only the backups it made; a protected backup is kept from every
prune and ``backup delete`` refuses it; a backup a running restore reads is
neither pruned nor deleted under it, and a restore whose initiator is
SIGKILLed leaves no hold behind; ``backup list`` shows ``schedule`` and
``protected``."""
from __future__ import annotations

import signal

import pytest

from engine.core import api, keys
from engine.core.values import readable
from tests.support import wait_for, wait_until
from tests.support.api_client import ApiClient, answers, api_peer_args, free_port
from tests.support.cluster import boot_vms, finished, refused, start_peers
from tests.support.hooks import write_hook


def backups(cluster, pattern=None) -> dict:
    """``backup list`` (JSON) by id."""
    return {row["id"]: row for row in cluster.cli_json("backup", "list",
                                                       *([pattern] if pattern else []))}


def schedule_row(cluster, pattern) -> dict:
    return {row["pattern"]: row for row in cluster.cli_json("backup", "schedule", "list")}[pattern]


def backed_up(cluster, *args) -> str:
    doc = cluster.cli_json("backup", *args)
    assert doc["state"] == "done", doc
    (vm,) = doc["vms"]
    return vm["backup"]


def holds(store, backup_id) -> dict:
    return (readable(store.get(keys.backup(backup_id))) or {}).get("holds") or {}


def gated(tmp_path, request):
    """A pre hook holding every ``request`` until the returned file exists."""
    hooks, gate = str(tmp_path / "hooks"), tmp_path / "open"
    write_hook(hooks, request, "pre", f"""
while not os.path.exists({str(gate)!r}):
    time.sleep(0.05)
""")
    return hooks, gate


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_a_schedule_keeps_the_backups_taken_by_hand_and_the_one_restored_from(
        cluster, store, two_hosts):
    vms = boot_vms(cluster, "web1", "web2")
    first, second = backed_up(cluster, "web2"), backed_up(cluster, "web2")
    restored = cluster.cli_json("restore", first, "--as", "web2-copy")
    assert restored["state"] == "done", restored
    doc = cluster.cli_json("backup", "schedule", "web*", "--every", "1s", "--keep-last", "2")
    ran = wait_until(lambda: schedule_row(cluster, "web*"), lambda row: row["runs"] >= 4,
                     timeout=90, interval=0.3, what="four runs of the schedule")
    assert ran["last_run"]["deleted"] and not ran["last_run"]["errors"], ran
    listed = backups(cluster, "web2")
    assert {first, second} <= set(listed), "a schedule pruned backups taken by hand"
    for manual in (first, second):
        assert (listed[manual]["schedule"], listed[manual]["protected"]) == (None, False)
    made = [row for row in listed.values() if row["schedule"] == doc["schedule"]]
    assert 2 <= len(made) <= 3, made        # keep-last 2 (3 while a run is in flight)
    assert all(row["uuid"] == vms["web2"]["uuid"] for row in listed.values())
    header = cluster.cli("backup", "list").stdout.splitlines()[0].split()
    assert "Schedule" in header and "Protected" in header
    assert [vm["name"] for vm in doc["matching"]] == ["web1", "web2", "web2-copy"]
    cluster.cli_json("backup", "schedule", "delete", "web*")


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_protected_backup_is_kept_from_prunes_and_from_backup_delete(cluster, store,
                                                                       two_hosts):
    boot_vms(cluster, "db1")
    kept = backed_up(cluster, "db1", "--protect")
    assert backups(cluster)[kept]["protected"] is True
    done = refused(cluster, ["backup", "delete", kept], 1, f"backup {kept} is protected")
    assert done.stdout == "" and kept in backups(cluster)

    doc = cluster.cli_json("backup", "unprotect", kept)
    assert doc["state"] == "unprotected" and doc["backups"][0]["protected"] is False
    doc = cluster.cli_json("backup", "protect", kept)
    assert [row["id"] for row in doc["backups"]] == [kept] and doc["backups"][0]["protected"]
    refused(cluster, ["backup", "protect", "nosuch"], 1, "no backup 'nosuch'")
    refused(cluster, ["backup", "unprotect", "a/b"], 2, "bad backup id")

    # one the schedule made, protected while it runs: never pruned, nor
    # counted (kept them all until it is protected, then the last one only:
    # a run pruning it first would leave nothing to protect)
    sched = cluster.cli_json("backup", "schedule", "db1", "--every", "1s", "--keep-last", "1000")
    first = wait_until(lambda: schedule_row(cluster, "db1"), lambda row: row["runs"] >= 1,
                       timeout=60, interval=0.3, what="a first run")
    (own,) = first["last_run"]["backups"]
    cluster.cli_json("backup", "protect", own)
    changed = cluster.cli_json("backup", "schedule", "db1", "--every", "1s", "--keep-last", "1")
    assert changed["schedule"] == sched["schedule"] and changed["state"] == "changed"
    first = schedule_row(cluster, "db1")
    later = wait_until(lambda: schedule_row(cluster, "db1"),
                       lambda row: row["runs"] >= first["runs"] + 3 and row["last_run"]["deleted"],
                       timeout=90, interval=0.3, what="runs that prune")
    assert not later["last_run"]["errors"], later
    listed = backups(cluster)
    assert {kept, own} <= set(listed)
    assert listed[own]["schedule"] == sched["schedule"] and listed[own]["protected"]
    cluster.cli_json("backup", "schedule", "delete", "db1")
    cluster.cli_json("backup", "unprotect", kept)
    doc = cluster.cli_json("backup", "delete", kept)
    assert doc["state"] == "done" and kept not in backups(cluster)


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_a_backup_a_running_restore_reads_is_neither_deleted_nor_pruned(cluster, store,
                                                                        tmp_path):
    hooks, gate = gated(tmp_path, "restore_disks")
    start_peers(cluster, store, ["host1", "host2", "host3"], hooks=hooks)
    wait_for(lambda: {"host1", "host2", "host3"} <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what="providers")
    boot_vms(cluster, "db1")
    # keeping them all until the restore holds its backup: a run pruning
    # it first would leave the restore nothing to read
    cluster.cli_json("backup", "schedule", "db1", "--to", "host2", "--every", "1s",
                     "--keep-last", "1000")
    first = wait_until(lambda: schedule_row(cluster, "db1"), lambda row: row["runs"] >= 1,
                       timeout=60, interval=0.3, what="a first run")
    (source,) = first["last_run"]["backups"]
    started = cluster.cli_json("restore", source, "--as", "copy", "--on", "host3", "--detach")
    automation = started["automation"]
    wait_for(lambda: automation in holds(store, source), what="the restore's hold")
    wait_for(lambda: any(e["request"] == "restore_disks"
                         for e in api.get_task(store, automation)["log"]),
             what="the restore reading the backup")

    refused(cluster, ["backup", "delete", source], 1,
            f"backup {source} is being read by restore {automation}")
    sched = cluster.cli_json("backup", "schedule", "db1", "--to", "host2", "--every", "1s",
                             "--keep-last", "1")
    later = wait_until(lambda: schedule_row(cluster, "db1"),
                       lambda row: row["runs"] >= first["runs"] + 3 and row["last_run"]["deleted"],
                       timeout=90, interval=0.3, what="runs that prune")
    assert source in backups(cluster), "pruned under a running restore"
    assert source not in later["last_run"]["deleted"]

    gate.touch()
    assert finished(store, automation)["state"] == "done"
    assert holds(store, source) == {}
    wait_for(lambda: source not in backups(cluster), timeout=60,
             what="the schedule pruning it once the restore is done")
    cluster.cli_json("backup", "schedule", "delete", sched["schedule"])


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_restore_whose_initiator_is_killed_leaves_no_hold(cluster, store, tmp_path):
    hooks, gate = gated(tmp_path, "restore_disks")
    start_peers(cluster, store, ["host1", "host2", "host3"], hooks=hooks)
    start_peers(cluster, store, ["m1", "m2"])
    wait_for(lambda: {"host1", "host2", "host3"} <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what="providers")
    boot_vms(cluster, "db1")
    source = backed_up(cluster, "db1", "--to", "host2")
    automation = api.start_automation(store, "restore", {
        "backup": source, "name": "copy", "on": "host3"}, prefer=["m1", "m2"], members=2)
    task = wait_until(lambda: api.get_task(store, automation),
                      lambda t: any(e["request"] == "restore_disks" for e in t["log"]),
                      what="the restore reading the backup")
    assert automation in holds(store, source)
    old = task["initiator"]
    assert old in ("m1", "m2"), task
    cluster.kill(old, signal.SIGKILL)
    wait_for(lambda: api.get_task(store, automation)["initiator"] not in (old, None),
             timeout=30, what="the other member taking the restore over")
    refused(cluster, ["backup", "delete", source], 1, "being read by restore")
    gate.touch()
    assert finished(store, automation)["state"] == "done"
    assert holds(store, source) == {}
    doc = cluster.cli_json("backup", "delete", source)
    assert doc["state"] == "done" and source not in backups(cluster)


@pytest.mark.parametrize("command", [
    ["restore", "ID", "--as", "copy", "--dry-run"],
    ["backup", "schedule", "db*", "--every", "1h", "--dry-run"],
    ["replicate", "db1", "--every", "10s", "--dry-run"],
])
def test_dry_runs_say_what_would_be_done_and_write_nothing(cluster, store, two_hosts, command):
    boot_vms(cluster, "db1")
    source = backed_up(cluster, "db1")
    command = [source if word == "ID" else word for word in command]
    before = {kv.key: kv.mod_revision for prefix in ("schedules/", "replicas/", "tasks/", "backups/")
              for kv in store.range(prefix)[0]}
    done = cluster.cli(*command)
    assert done.returncode == 0, done.stderr
    assert "would" in done.stdout.splitlines()[-1], done.stdout
    doc = cluster.cli_json(*command)
    assert doc["state"] == "dry-run", doc
    after = {kv.key: kv.mod_revision for prefix in ("schedules/", "replicas/", "tasks/", "backups/")
             for kv in store.range(prefix)[0]}
    assert after == before


def test_a_schedule_matching_no_vm_now_says_so(cluster, store, two_hosts):
    done = cluster.cli("backup", "schedule", "zzz*", "--every", "1h")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("peerctl:")]
    assert len(warnings) == 1 and "'zzz*' matches no VM now" in warnings[0], done.stderr
    assert cluster.cli_json("backup", "schedule", "zzz*", "--every", "1h")["matching"] == []


def test_protect_unprotect_and_a_refused_delete_over_http(cluster, store):
    port = free_port()
    cluster.start_peer("host1", extra_args=api_peer_args(port))
    start_peers(cluster, store, ["host2"])
    wait_for(lambda: len(cluster.cli_json("placement", "providers")) == 2, what="providers")
    client = ApiClient(f"http://127.0.0.1:{port}",
                       cluster.cli_json("token", "create", "--role", "operator")["secret"])
    wait_for(lambda: answers(client), what="the API of host1")
    vm = boot_vms(cluster, "db1")["db1"]
    status, started, _ = client.post("/v1/backups", {"patterns": ["db1"], "protect": True})
    assert status == 202, started
    task = finished(store, started["automation"])
    (kept,) = [row["backup"] for row in task["result"]["vms"]]
    (row,) = client.get("/v1/backups")[1]
    assert (row["id"], row["uuid"], row["protected"], row["schedule"]) == (
        kept, vm["uuid"], True, None)
    status, doc, _ = client.delete(f"/v1/backups/{kept}")
    assert status == 409 and doc["error"] == (f"backup {kept} is protected: backup "
                                              f"unprotect {kept} first"), doc
    status, doc, _ = client.post(f"/v1/backups/{kept}/unprotect")
    assert status == 200 and doc["backups"][0]["protected"] is False, doc
    status, doc, _ = client.post(f"/v1/backups/{kept}/protect")
    listed = cluster.cli_json("backup", "list")
    assert status == 200 and doc["state"] == "protected"
    assert [dict(r, age_s=None) for r in doc["backups"]] == [dict(r, age_s=None) for r in listed]
    assert listed[0]["protected"] is True


