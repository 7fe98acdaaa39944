"""Automations through the real command line, on real peers and a real etcd:
ping, tasks, task, wait, abort, --detach, boot and the wildcard bulk actions
(destroy, start, stop, reboot, suspend, resume); `wait` exits 1 on failed,
aborted and stuck automations; `initiator` names the leading peer."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from engine.core import keys
from engine.core.store import Put
from tests.support import PEERCTL, ROOT, wait_for
from tests.support.cluster import alive, held_requests, start_three_peers
from tests.support.hooks import gated_hook
from tests.support.terminal import Terminal

TASK_KEYS = {"id", "kind", "state", "initiator", "members", "result", "error", "log"}
LOG_KEYS = {"index", "request", "target", "status", "executor"}
SPEC = "VCPU:1,MEMORY_MB:128,DISK_GB:1"


def test_ping_tasks_task_wait_abort(cluster, peers):
    doc = cluster.cli_json("ping", "--rounds", "2")
    assert set(doc) >= {"automation", "state", "replies"}
    assert doc["state"] == "done"
    assert sorted((r["host"], r["round"]) for r in doc["replies"]) == \
        sorted((h, n) for h in peers for n in range(2))
    assert all(r["latency_ms"] >= 0 for r in doc["replies"])
    automation = doc["automation"]

    assert cluster.cli_json("tasks") == []          # finished ones need --all
    tasks = cluster.cli_json("tasks", "--all")
    assert [t["id"] for t in tasks] == [automation]
    assert set(tasks[0]) == {"id", "kind", "state", "initiator", "created", "steps"}
    assert tasks[0]["kind"] == "ping" and tasks[0]["state"] == "done"

    task = cluster.cli_json("task", automation)
    assert TASK_KEYS <= set(task)
    assert task["state"] == "done" and task["kind"] == "ping"
    assert task["result"]["replies"] and len(task["log"]) == 6
    assert all(LOG_KEYS <= set(entry) for entry in task["log"])
    assert {entry["request"] for entry in task["log"]} == {"ping"}

    waited = cluster.cli_json("wait", automation)
    assert waited["id"] == automation and waited["state"] == "done"
    assert cluster.cli_json("abort", automation) == {"id": automation, "state": "done"}

    done = cluster.cli("task", automation)
    assert done.returncode == 0 and "ping" in done.stdout and automation in done.stdout


def test_ping_detach_then_wait(cluster, peers):
    doc = cluster.cli_json("ping", "host2", "--rounds", "3", "--detach")
    assert list(doc) == ["automation"]
    task = cluster.cli_json("wait", doc["automation"])
    assert task["state"] == "done"
    assert {r["host"] for r in task["result"]["replies"]} == {"host2"}
    # the table form prints just the id
    done = cluster.cli("ping", "--detach")
    assert done.returncode == 0
    automation = done.stdout.strip()
    assert cluster.cli_json("wait", automation)["state"] == "done"


def test_ping_table_and_plain_progress(cluster, peers):
    done = cluster.cli("ping", "host*", "--rounds", "2", input="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split()[:2] == ["Host", "Replies"]
    assert "done" in done.stdout.splitlines()[-1]
    # no terminal: plain progress lines on stderr, one per reply; the
    # automation's end is said once, on stdout
    assert "host1: ping ok" in done.stderr and " done" not in done.stderr
    assert "\x1b[" not in done.stderr
    assert cluster.cli_json("ping", "nosuch*", expect_rc=1)["replies"] == []


def test_hostlist_with_live_peers(cluster, peers):
    hosts = cluster.cli_json("hostlist")
    assert [h["host"] for h in hosts] == peers
    assert all(h["alive"] and h["enabled"] for h in hosts)
    cluster.kill("host3")
    wait_for(lambda: "host3" not in alive(cluster), timeout=15, what="host3 seen dead")
    hosts = {h["host"]: h for h in cluster.cli_json("hostlist")}
    assert hosts["host3"]["alive"] is False        # still listed, from hostcfg/
    done = cluster.cli("hostlist")
    assert "2 hosts responded (2 enabled" in done.stdout
    assert "1 host not responding: host3" in done.stdout


def vms_by_name(cluster):
    return {vm["name"]: vm for vm in cluster.cli_json("vmlist")}


def test_boot_then_bulk_actions_with_wildcards(cluster, peers):
    doc = cluster.cli_json("boot", "web1", "web2", "db1", "--resources", SPEC)
    assert doc["state"] == "done", doc
    assert sorted(vm["name"] for vm in doc["vms"]) == ["db1", "web1", "web2"]
    assert all(vm["state"] == "running" and vm["uuid"] and vm["host"] for vm in doc["vms"])
    wait_for(lambda: len(vms_by_name(cluster)) == 3, what="three VMs listed")
    vms = vms_by_name(cluster)
    assert {vm["host"] for vm in vms.values()} <= set(peers)

    stopped = cluster.cli_json("stop", "*web*", "--yes")
    assert stopped["state"] == "done"
    assert sorted((vm["name"], vm["state"]) for vm in stopped["vms"]) == \
        [("web1", "shutoff"), ("web2", "shutoff")]
    wait_for(lambda: vms_by_name(cluster)["web1"]["state"] == "shutoff",
             what="web1 listed shutoff")

    host = vms["web1"]["host"]
    started = cluster.cli_json("start", f"{host}/web1")      # one VM: no --yes needed
    assert [(vm["name"], vm["state"]) for vm in started["vms"]] == [("web1", "running")]

    destroyed = cluster.cli_json("destroy", "*", "--yes")
    assert destroyed["state"] == "done" and len(destroyed["vms"]) == 3
    wait_for(lambda: vms_by_name(cluster) == {}, what="no VM left")
    assert cluster.cli_json("vmlist", "*web*", expect_rc=1) == []


def test_boot_that_cannot_be_placed_fails_with_exit_1(cluster, peers):
    done = cluster.cli("--format", "json", "boot", "huge1",
                       "--resources", "VCPU:100000,MEMORY_MB:128")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    doc = json.loads(done.stdout)
    assert doc["state"] == "failed", doc
    [vm] = doc["vms"]
    assert vm["name"] == "huge1" and vm["state"] == "error" and vm["host"] is None
    assert vm["error"], vm          # says why
    assert "huge1" in done.stderr.splitlines()[-1]
    # `wait` on a failed automation: the same final object, exit 1
    waited = cluster.cli_json("wait", doc["automation"], expect_rc=1)
    assert waited["state"] == "failed" and waited["result"]["vms"][0]["state"] == "error"
    assert cluster.cli_json("vmlist") == []


def test_boot_name_in_use_exits_1(cluster, peers):
    assert cluster.cli_json("boot", "solo", "--resources", SPEC)["state"] == "done"
    done = cluster.cli("boot", "solo", "--resources", SPEC)
    assert done.returncode == 1 and "solo" in done.stderr


@pytest.fixture
def held_builds(cluster, tmp_path):
    """Three peers whose builds wait (a build.pre hook) until the test opens
    the gate this returns: the boot runs for as long as the test needs."""
    with held_requests(cluster, str(tmp_path / "hooks"), "build") as gate:
        yield gate


def test_progress_of_a_ten_vm_boot_and_ctrl_c_detaches(cluster, held_builds):
    names = [f"vm{i:02d}" for i in range(10)]
    terminal = Terminal([sys.executable, PEERCTL, "boot", *names, "--resources", SPEC],
                        cluster.env)
    # the live view, redrawn in place: one line per VM with its current step
    # and a summary bar; all ten VMs show in one frame
    vm_line = re.compile(r"^  (vm\d\d)\s+(claim|build|release|destroy)\s+"
                         r"(queued|running|ok|error|lost|timeout)\b", re.M)

    def all_ten():
        terminal.read()
        frames = terminal.frames()      # checks that each redraw covers the last frame
        for frame in reversed(frames[1:]):
            if frame.endswith("\n") and \
                    sorted({match[0] for match in vm_line.findall(frame)}) == names:
                return frame
        return None
    frame = wait_for(all_ten, timeout=60, interval=0, what="a redrawn frame with all ten VMs")
    lines = frame.rstrip("\n").split("\n")
    assert len(lines) == 11, frame                  # ten VM lines, then the bar
    bar = re.fullmatch(r"\[[#-]+\] \d+/\d+ steps\s+10 targets\s+running\s+[\d.]+s\s+(\S+)",
                       lines[-1])
    assert bar, lines[-1]
    automation = bar.group(1)
    terminal.type(b"\x03")       # Ctrl-C on the terminal: SIGINT to the command
    code = terminal.finish()
    text = terminal.text()
    assert code == 130, text
    assert "Traceback" not in text
    assert f"wait {automation}" in text, text

    # the automation went on without us: wait picks it up again
    held_builds.open()
    task = json.loads(subprocess.run(
        [sys.executable, PEERCTL, "--format", "json", "wait", automation],
        capture_output=True, text=True, env=cluster.env, cwd=ROOT, timeout=120).stdout)
    assert task["state"] == "done", task
    states = {vm["name"]: vm["state"] for vm in task["result"]["vms"]}
    assert states == {name: "running" for name in names}
    listed = cluster.cli_json("vmlist", "vm*")
    assert sorted(vm["name"] for vm in listed) == names


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_detached_boot_then_suspend_resume_reboot_and_detached_destroy(cluster, peers):
    doc = cluster.cli_json("boot", "app1", "app2", "--resources", SPEC, "--detach")
    assert list(doc) == ["automation"]
    booted = cluster.cli_json("wait", doc["automation"])
    assert TASK_KEYS <= set(booted) and booted["id"] == doc["automation"]
    assert booted["state"] == "done" and booted["kind"] == "boot"
    assert sorted((vm["name"], vm["state"]) for vm in booted["result"]["vms"]) == \
        [("app1", "running"), ("app2", "running")]
    wait_for(lambda: len(vms_by_name(cluster)) == 2, what="two VMs listed")

    def act(*args, expect):
        doc = cluster.cli_json(*args)
        assert set(doc) >= {"automation", "state", "vms"} and doc["state"] == "done", doc
        assert sorted((vm["name"], vm["state"]) for vm in doc["vms"]) == expect, doc
        names = dict(expect)
        wait_for(lambda: {n: vm["state"] for n, vm in vms_by_name(cluster).items()
                          if n in names} == names, what=f"vmlist shows {expect}")

    act("suspend", "app*", "--yes", expect=[("app1", "paused"), ("app2", "paused")])
    # resume is not destructive: no --yes needed for two VMs
    act("resume", "app*", expect=[("app1", "running"), ("app2", "running")])
    act("reboot", "app1", expect=[("app1", "running")])     # one VM: no --yes needed
    done = cluster.cli("reboot", "app*", input="")
    assert done.returncode == 2 and "--yes" in done.stderr.splitlines()[-1]

    done = cluster.cli("destroy", "app*", "--yes", "--detach")
    assert done.returncode == 0, done.stderr
    automation = done.stdout.strip()            # the table form: just the id
    assert re.fullmatch(r"\S+", automation), done.stdout
    destroyed = cluster.cli_json("wait", automation)
    assert destroyed["state"] == "done" and destroyed["kind"] == "destroy"
    assert sorted((vm["name"], vm["state"]) for vm in destroyed["result"]["vms"]) == \
        [("app1", "destroyed"), ("app2", "destroyed")]
    wait_for(lambda: vms_by_name(cluster) == {}, what="no VM left")


@pytest.fixture
def held_pings(cluster, tmp_path):
    """Three peers whose pings wait (a ping.pre hook) until the test opens the
    gate; returns the peers and the gate."""
    hooks = str(tmp_path / "hooks")
    gate = gated_hook(hooks, request="ping")
    yield start_three_peers(cluster, hooks), gate
    gate.open()


def leader_in_logs(cluster, automation, hosts):
    """The host whose peer log says it leads ``automation`` (the last one to say so)."""
    leaders = []
    for host in hosts:
        for line in cluster.log(host).splitlines():
            if "initiator_leads" in line and f"automation={automation}" in line:
                leaders.append(re.search(r"\bhost=(\S+)", line).group(1))
    return leaders[-1] if leaders else None


def test_json_detach_then_abort_a_running_automation_and_wait_exits_1(cluster, held_pings):
    hosts, gate = held_pings
    rounds = 20
    # a script following with --format json is interrupted (SIGINT, no
    # terminal): it detaches and still prints {"automation": ID} on stdout
    following = subprocess.Popen([sys.executable, PEERCTL, "--format", "json", "ping",
                                  "--rounds", str(rounds)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=cluster.env, cwd=ROOT)
    [automation] = wait_for(lambda: [t["id"] for t in cluster.cli_json("tasks")],
                            what="the ping started")

    def step_running():
        task = cluster.cli_json("task", automation)
        return task if any(e["status"] == "running" for e in task["log"]) else None
    running = wait_for(step_running, timeout=30, what="a ping step running")
    assert running["state"] == "running"
    following.send_signal(signal.SIGINT)
    out, err = following.communicate(timeout=30)
    assert following.returncode == 130, (out, err)
    assert json.loads(out) == {"automation": automation}
    assert err.splitlines()[-1] == f"Re-attach with: python peerctl.py wait {automation}"
    assert "Traceback" not in err
    # `initiator` names the peer leading the automation, as its own log says
    leader = wait_for(lambda: leader_in_logs(cluster, automation, hosts),
                      what="the leader's log line")
    assert running["initiator"] == leader and leader in running["members"]
    assert automation in [t["id"] for t in cluster.cli_json("tasks")]

    assert cluster.cli_json("abort", automation) == {"id": automation, "state": "aborted"}
    gate.open()             # the first round's pings end; no further round starts
    waited = cluster.cli_json("wait", automation, expect_rc=1)
    assert waited["id"] == automation and waited["state"] == "aborted"
    assert waited["error"] and "abort" in waited["error"]
    assert waited["initiator"] == leader
    assert len(waited["log"]) < 3 * rounds          # it stopped early
    assert cluster.cli_json("tasks") == []
    done = cluster.cli("wait", automation)
    assert done.returncode == 1 and "aborted" in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr


def test_wait_exits_1_on_a_stuck_automation(cluster, peers, store):
    """An automation whose log no longer matches its worker's code goes stuck,
    saying which step; `wait` exits 1 with that reason."""
    automation, now = "stuck-" + uuid.uuid4().hex[:8], time.time()
    spec = {"id": automation, "kind": "ping", "version": 1, "created": now,
            "args": {"hosts": ["host1"], "rounds": 1}, "members": ["host1"],
            "wanted_members": 1}
    # Step 0 as an older build of the worker logged it: same request, other fingerprint.
    entry = {"index": 0, "worker": "0", "seq": 0, "worker_name": "ping", "request": "ping",
             "target": "host1", "args": {"round": 0}, "fingerprint": "from-older-code",
             "time": now, "deadline": now + 60, "label": None, "local": False,
             "initiator": "host1"}
    store.txn([], [Put(keys.spec(automation), spec),
                   Put(keys.log_entry(automation, 0), entry),
                   Put(keys.response(automation, 0), {"status": "ok", "value": {}}),
                   Put(keys.status(automation), {"state": "running", "updated": now}),
                   Put(keys.task(automation), {"id": automation, "kind": "ping",
                                               "state": "running", "created": now,
                                               "members": ["host1"], "steps": 1}),
                   Put(keys.member("host1", automation), {"since": now})])
    waited = cluster.cli_json("wait", automation, "--timeout", "60", expect_rc=1)
    assert waited["state"] == "stuck", waited
    assert "step 0" in waited["error"] and "ping@host1" in waited["error"], waited["error"]
    assert waited["initiator"] == "host1"
    assert len(waited["log"]) == 1          # nothing more was appended
    done = cluster.cli("wait", automation)
    assert done.returncode == 1 and "stuck" in done.stderr.splitlines()[-1]


def test_abort_exits_1_while_the_automation_still_runs(cluster, store):
    """`abort` asks the leader and waits; a leader that does not act on it in
    that time (here a ghost candidate that never answers; the wait shortened
    from its 15 s by $PEERCTL_ABORT_WAIT) leaves the automation running: exit
    1 saying so, the JSON still {id, state}."""
    automation, now = "ghost-" + uuid.uuid4().hex[:8], time.time()
    spec = {"id": automation, "kind": "ping", "version": 1, "created": now,
            "args": {"hosts": ["ghost"], "rounds": 1}, "members": ["ghost"],
            "wanted_members": 1}
    store.txn([], [Put(keys.spec(automation), spec),
                   Put(keys.status(automation), {"state": "running", "updated": now}),
                   Put(keys.task(automation), {"id": automation, "kind": "ping",
                                               "state": "running", "created": now,
                                               "members": ["ghost"], "steps": 0}),
                   Put(keys.elect(automation) + "1", "ghost")])
    done = cluster.cli("--format", "json", "abort", automation, env={"PEERCTL_ABORT_WAIT": "1"})
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert json.loads(done.stdout) == {"id": automation, "state": "running"}
    [line] = done.stderr.splitlines()
    assert line.startswith(f"peerctl: automation {automation} is still running"), line
    assert line.endswith(f"wait {automation}")
