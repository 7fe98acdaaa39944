"""Moving VMs through the real command line (issue 10): ``drain``,
``undrain``, ``migrate`` and ``evacuate`` on real peers (libvirt's test
driver, so moves are ``redefine``) and a real etcd; ``hostlist`` showing a
drained host; the refusals that start nothing; and the progress view of a
long step (pure, no etcd)."""
from __future__ import annotations

import io
import json
import re
import sys
import time

import pytest

from engine.commandline.progress import ProgressView
from engine.core import features, keys
from tests.support import PEERCTL, wait_for
from tests.support.cluster import boot_vms, listed_vms, ready_hosts, refused, task_ids
from tests.support.terminal import Terminal

SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
MOVE_KEYS = {"name", "uuid", "from", "host", "state", "mode", "downtime_ms", "bytes",
             "disk_bytes", "via_replica", "error"}


# -- helpers ------------------------------------------------------------------------



def hosts(cluster):
    return {h["host"]: h for h in cluster.cli_json("hostlist")}




# -- drain, undrain, hostlist, boot --------------------------------------------------

def test_drain_shows_in_hostlist_and_boot_never_lands_there(cluster, two_hosts):
    doc = cluster.cli_json("drain", "host2")
    assert doc == {"hosts": [{"host": "host2", "drained": True}]}
    listed = hosts(cluster)
    assert listed["host2"]["drained"] is True and listed["host1"]["drained"] is False
    table = cluster.cli("hostlist", "-o", "host,status", "--no-headers", "--separator", " ")
    assert table.stdout.splitlines() == ["host1 up", "host2 drained"]
    assert re.search(r"\(2 enabled, 1 drained, \d busy\)", cluster.cli("hostlist").stdout)

    booted = boot_vms(cluster, *[f"d{i}" for i in range(4)], on="host*")
    assert {vm["host"] for vm in booted.values()} == {"host1"}

    wait_for(lambda: set(booted) <= set(listed_vms(cluster)), what="the VMs listed")
    on = {h: sum(vm["host"] == h for vm in cluster.cli_json("vmlist")) for h in two_hosts}
    # more than one host: asked for (no terminal here: refused, nothing drained)
    refused(cluster, ["drain", "host*"], 2, "drain matches 2 hosts: add --yes")
    assert hosts(cluster)["host1"]["drained"] is False
    dry = cluster.cli_json("drain", "host*", "--dry-run")
    assert dry["state"] == "dry-run" and hosts(cluster)["host1"]["drained"] is False
    again = cluster.cli("drain", "host*", "--yes")      # harmless to repeat; one line per host
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"{h} drained" + (f" ({on[h]} VM{'s stay' if on[h] > 1 else ' stays'} on it)"
                          if on[h] else "") for h in two_hosts]
    assert on["host1"] >= 4
    refused(cluster, ["boot", "late", "--resources", SPEC], 1, "late")

    assert cluster.cli_json("undrain", "host*") == {"hosts": [
        {"host": "host1", "drained": False}, {"host": "host2", "drained": False}]}
    assert all(h["status"] == "up" for h in cluster.cli_json(
        "hostlist", "-o", "host,status"))
    assert {vm["host"] for vm in listed_vms(cluster).values()} == {"host1"}     # nothing moved back
    assert cluster.cli("undrain", "host1").stdout == "host1 undrained\n"

    refused(cluster, ["drain", "nosuch*"], 1, "no host matches 'nosuch*'")
    assert cluster.cli_json("drain", "nosuch*", expect_rc=1) == {"hosts": []}
    refused(cluster, ["drain", "a/b"], 2, "bad host pattern 'a/b'")


# -- refusals: nothing started ------------------------------------------------------

@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_bad_moves_are_refused_in_one_line_and_start_nothing(cluster, two_hosts):
    boot_vms(cluster, "web1", "web2")
    before = task_ids(cluster)
    refused(cluster, ["migrate", "web1", "--to", "host[2"], 2, "unclosed '['")
    refused(cluster, ["migrate", "web1", "--to", "a/b"], 2, "bad host pattern 'a/b'")
    refused(cluster, ["migrate", "web1", "--parallel", "0"], 2, "must be at least 1")
    refused(cluster, ["migrate", "host1/web1/x"], 2, "bad VM pattern")
    refused(cluster, ["migrate", "nosuch"], 1, "no VM matches 'nosuch'")
    refused(cluster, ["migrate", "web1", "--to", "nosuch*"], 1,
            "nowhere to move 'web1': --to 'nosuch*' matches no host")
    refused(cluster, ["migrate", "web1", "--to", "host1"], 1,
            "nowhere to move 'web1': --to 'host1' offers only host1, where it is")
    refused(cluster, ["migrate", "web*"], 2, "add --yes")       # no terminal to ask on
    refused(cluster, ["evacuate", "host1", "--to", "host1"], 1, "being evacuated")
    done = refused(cluster, ["evacuate", "host1"], 2, "add --yes")
    assert "host1/web1" in done.stderr
    assert hosts(cluster)["host1"]["drained"] is False, "nothing is drained before --yes"
    failed = cluster.cli_json("migrate", "web1", "--to", "nosuch", expect_rc=1)
    assert failed == {"automation": None, "state": "failed", "vms": []}

    cluster.cli_json("drain", "host2")
    refused(cluster, ["migrate", "web1"], 1,
            "nowhere to move 'web1': the cluster offers only host1, where it is")
    refused(cluster, ["migrate", "web1", "--to", "host2"], 1,
            "--to 'host2' has no live, undrained host (host2 drained)")
    assert task_ids(cluster) == before
    assert {vm["host"] for vm in listed_vms(cluster).values()} == {"host1"}


def test_on_a_terminal_moves_of_several_vms_ask_first(cluster, two_hosts):
    boot_vms(cluster, "w1", "w2")
    before = task_ids(cluster)
    terminal = Terminal([sys.executable, PEERCTL, "evacuate", "host1"], cluster.env)
    terminal.wait_for_text(r"Evacuate these 2 VMs\? \[y/N\]")
    assert "host1/w1 (running)" in terminal.text()
    terminal.type(b"n\n")
    assert terminal.finish() == 1
    assert "peerctl: nothing done" in terminal.text()
    assert hosts(cluster)["host1"]["drained"] is False and task_ids(cluster) == before

    terminal = Terminal([sys.executable, PEERCTL, "migrate", "w*", "--to", "host2"],
                        cluster.env)
    terminal.wait_for_text(r"Migrate these 2 VMs\? \[y/N\]")
    terminal.type(b"y\n")
    assert terminal.finish(timeout=90) == 0, terminal.text()
    assert "done: 2 of 2 VMs moved" in terminal.text()
    wait_for(lambda: {vm["host"] for vm in listed_vms(cluster).values()} == {"host2"},
             what="vmlist shows w1 and w2 on host2")


@pytest.mark.parametrize("command", [
    ["migrate", "vm1", "--to", "a/b"], ["migrate", "a/b/c"], ["evacuate", "a/b"],
    ["evacuate", "host1", "--to", "h["], ["evacuate", "host1", "--parallel", "x"],
    ["drain", "a/b"], ["undrain"], ["migrate"],
    ["migrate", "vm1", "--max-downtime", "0"], ["migrate", "vm1", "--max-downtime", "1.5"],
    ["migrate", "vm1", "--max-downtime", "10001"], ["migrate", "vm1", "--max-downtime", "x"]])
def test_usage_errors_come_before_etcd(cluster, command):
    done = cluster.cli("--etcd", "http://127.0.0.1:1", *command, input="")
    assert done.returncode == 2, (command, done.stderr)
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


@pytest.mark.parametrize("command", [["migrate", "vm1"], ["drain", "h*"], ["undrain", "h*"],
                                     ["evacuate", "h1", "--yes"]])
def test_etcd_unreachable_exits_3_in_one_line(cluster, command):
    done = cluster.cli("--etcd", "http://127.0.0.1:1", *command, input="")
    assert done.returncode == 3, (command, done.stderr)
    assert done.stderr == "peerctl: etcd unreachable at http://127.0.0.1:1\n"


def test_a_live_moves_downtime_is_passed_from_feature_level_2_and_refused_below(
        cluster, two_hosts, store):
    boot_vms(cluster, "web1")
    moved = cluster.cli_json("migrate", "web1", "--to", "host2", "--max-downtime", "40")
    assert spec_of(store, moved)["args"]["max_downtime_ms"] == 40
    moved = cluster.cli_json("migrate", "web1", "--to", "host1")
    assert spec_of(store, moved)["args"]["max_downtime_ms"] == 100      # the default

    # a cluster where an older release may still run: nothing it cannot read
    store.put("cluster/feature_level", {"level": 1, "time": 0.0})
    before = task_ids(cluster)
    refused(cluster, ["migrate", "web1", "--max-downtime", "40"], 1,
            "--max-downtime needs the cluster's feature level 2")
    assert task_ids(cluster) == before
    moved = cluster.cli_json("migrate", "web1", "--to", "host2")
    assert "max_downtime_ms" not in spec_of(store, moved)["args"]
    drained = cluster.cli_json("evacuate", "host2", "--yes")
    assert spec_of(store, drained)["version"] == 2 and drained["state"] == "done", drained


def spec_of(store, done: dict) -> dict:
    assert done["state"] == "done", done
    return store.get(keys.spec(done["automation"])).value


def test_migrate_dry_run_lists_what_would_move(cluster, two_hosts):
    booted = boot_vms(cluster, "db1", "db2")
    before = task_ids(cluster)
    doc = cluster.cli_json("migrate", "db*", "--to", "host2", "--dry-run")
    assert doc == {"automation": None, "state": "dry-run", "vms": [
        {"name": name, "uuid": booted[name]["uuid"], "from": "host1", "host": "host2",
         "state": "running"} for name in ("db1", "db2")]}
    done = cluster.cli("migrate", "db*", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == ["Name", "From", "To", "State", "Why", "not"]
    assert done.stdout.splitlines()[-1] == "migrate would move 2 VMs to any other host"
    assert task_ids(cluster) == before


# -- moves, end to end (automations/moves.py) -----------------------------------------

def test_migrate_moves_a_vm_to_host2(cluster, two_hosts):
    booted = boot_vms(cluster, "vmx", "vmy")
    doc = cluster.cli_json("migrate", "vmx", "--to", "host2")
    assert doc["state"] == "done", doc
    assert set(doc) == {"automation", "state", "vms"}
    (moved,) = doc["vms"]
    assert set(moved) == MOVE_KEYS
    assert moved == {"name": "vmx", "uuid": booted["vmx"]["uuid"], "from": "host1",
                     "host": "host2", "state": "running", "mode": "redefine",
                     "downtime_ms": None, "bytes": None, "disk_bytes": None,
                     "via_replica": None, "error": None}
    wait_for(lambda: listed_vms(cluster)["vmx"]["host"] == "host2", what="vmlist shows vmx on host2")
    assert listed_vms(cluster)["vmx"]["state"] == "running"
    task = cluster.cli_json("task", doc["automation"])
    assert task["kind"] == "migrate" and "move_adopt" in {e["request"] for e in task["log"]}
    assert "bandwidth_mib" not in task["args"] and "postcopy" not in task["args"]
    capped = cluster.cli_json("migrate", "vmx", "--to", "host1", "--bandwidth", "50",
                              "--postcopy", "--detach")
    args = cluster.cli_json("wait", capped["automation"])["args"]
    assert (args["bandwidth_mib"], args["postcopy"]) == (50, True)
    wait_for(lambda: listed_vms(cluster)["vmx"]["host"] == "host1", what="vmx back on host1")
    cluster.cli_json("migrate", "vmx", "--to", "host2")

    # the table form, with plain progress on stderr (no terminal)
    done = cluster.cli("migrate", "host1/vmy", "--parallel", "1", input="")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["Name", "From", "Host", "Mode", "State", "Downtime", "(ms)"]
    assert lines[1].split()[:5] == ["vmy", "host1", "host2", "redefine", "running"]
    assert lines[-1].endswith("done: 1 of 1 VMs moved")
    # plain lines: what happened to the VM, where; the automation's end once, on stdout
    assert "vmy host1 -> host2: moved (redefine)" in done.stderr.splitlines()[-1]
    assert "\x1b[" not in done.stderr and " done" not in done.stderr
    wait_for(lambda: listed_vms(cluster)["vmy"]["host"] == "host2", what="vmlist shows vmy on host2")


def test_evacuate_moves_every_vm_off_the_host_and_leaves_it_drained(cluster, two_hosts):
    booted = boot_vms(cluster, "e1", "e2", "e3")
    stopped = cluster.cli_json("stop", "e3")
    assert stopped["state"] == "done"
    doc = cluster.cli_json("evacuate", "host1", "--yes", "--parallel", "2")
    assert doc["state"] == "done", doc
    assert sorted((vm["name"], vm["from"], vm["host"], vm["state"], vm["mode"])
                  for vm in doc["vms"]) == [("e1", "host1", "host2", "running", "redefine"),
                                            ("e2", "host1", "host2", "running", "redefine"),
                                            ("e3", "host1", "host2", "shutoff", "redefine")]
    assert {vm["uuid"] for vm in doc["vms"]} == {vm["uuid"] for vm in booted.values()}
    wait_for(lambda: {vm["host"] for vm in cluster.cli_json("vmlist", "e*")} == {"host2"},
             what="vmlist to show every VM on host2")
    assert cluster.cli_json("vmlist", "host1/*", expect_rc=1) == []
    assert hosts(cluster)["host1"]["drained"] is True
    assert cluster.cli_json("task", doc["automation"])["kind"] == "evacuate"

    # nothing left: it only drains, and says so
    before = task_ids(cluster)
    assert cluster.cli_json("evacuate", "host1") == {"automation": None, "state": "done",
                                                     "vms": []}
    assert task_ids(cluster) == before


@pytest.mark.parametrize("level, version, lock", [(2, 3, "lock_vm"), (3, 4, "lock_vms")])
def test_evacuate_batches_its_moves_only_at_feature_level_3(cluster, store, level, version,
                                                             lock):
    """A cluster whose level is still 2 (a peer of the release before may
    be among its members) evacuates with version 3, a step per VM; at level
    3, version 4 locks, claims and confirms each batch in one step.  The
    command line shows the same result either way."""
    store.put(features.level_key(), {"level": level, "time": time.time()})
    ready_hosts(cluster, store, ["host1", "host2"])
    boot_vms(cluster, "f1", "f2", "f3")
    done = cluster.cli("--format", "json", "evacuate", "host1", "--yes", "--parallel", "1",
                       input="")
    doc = json.loads(done.stdout)
    assert doc["state"] == "done", doc
    assert sorted((vm["name"], vm["host"], vm["error"]) for vm in doc["vms"]) == \
        [(name, "host2", None) for name in ("f1", "f2", "f3")]
    # the plain progress on stderr: a line for each VM, batched or not
    moved = sorted(line.split(" ", 1)[1] for line in done.stderr.splitlines()
                   if line.endswith("moved (redefine)"))
    assert moved == [f"{name} host1 -> host2: moved (redefine)" for name in ("f1", "f2", "f3")], \
        done.stderr
    task = store.get(keys.spec(doc["automation"])).value
    assert (task["kind"], task["version"]) == ("evacuate", version)
    steps = [e["request"] for e in cluster.cli_json("task", doc["automation"])["log"]]
    assert steps.count(lock) == (3 if version == 3 else 1), steps
    wait_for(lambda: {vm["host"] for vm in cluster.cli_json("vmlist", "f*")} == {"host2"},
             what="vmlist to show every VM on host2")


# -- the progress of a long step (no etcd) --------------------------------------------

def migrating(status="running", **progress):
    entry = {"index": 7, "request": "move_migrate", "target": "host1", "status": status,
             "executor": "host1", "label": "db1"}
    if progress:
        entry["progress"] = progress
    return {"state": "running", "log": [entry]}


def test_plain_progress_prints_phase_changes_and_steps_of_ten_percent():
    out = io.StringIO()
    view = ProgressView(out, "a1", tty=False)
    for task in (migrating(), migrating(phase="disk", percent=0),
                 migrating(phase="disk", percent=5), migrating(phase="disk", percent=9),
                 migrating(phase="disk", percent=10), migrating(phase="disk", percent=42),
                 migrating(phase="disk", percent=50), migrating(phase="memory", percent=51),
                 migrating(phase="memory", percent=60, bytes=1 << 30),
                 migrating(phase="memory", percent=61),
                 migrating(phase="switch-over", percent=99), migrating("ok")):
        view.update(task)
    lines = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]
    # the copy's end says nothing: "moved" waits for the move to be confirmed
    # (tests/test_progress.py follows whole moves)
    assert lines == ["db1 on host1: moving",
                     "db1 on host1: moving  disk 0%",
                     "db1 on host1: moving  disk 10%",
                     "db1 on host1: moving  disk 42%",
                     "db1 on host1: moving  memory 51%",
                     "db1 on host1: moving  memory 61%",
                     "db1 on host1: moving  switch-over 99%"]


def test_terminal_progress_line_shows_phase_and_percent():
    view = ProgressView(io.StringIO(), "a1", tty=True)
    lines = view.lines(migrating(phase="disk", percent=42), 120, 40)
    assert lines[0].rstrip().endswith("move_migrate running  on host1  disk 42%")
    assert "%" not in view.lines(migrating(), 120, 40)[0]
    odd = migrating(phase="disk", percent="lots")       # a value it cannot show: phase only
    assert view.lines(odd, 120, 40)[0].rstrip().endswith("on host1  disk")

