"""The plain progress lines a command writes while it follows an automation
(no terminal: a pipe, a CI log), and the host its terminal lines name.

History in, lines out, no etcd: each test writes an automation's log as
``engine.core.api.task_view`` makes it, lets :class:`ProgressView` follow
it step by step (each step seen running, then finished) and asserts the
exact lines written.  A line names what happened to a VM and on which host
it is, never the bookkeeping around it (locks, claims, releases), which
runs on whichever member leads."""
from __future__ import annotations

import io

from engine.commandline.progress import ProgressView

STAMP = "10:04:01"


def step(index, request, target="host1", status="ok", label="web1", **more):
    """A log entry; ``target`` host1 is where the leader runs bookkeeping."""
    return {"index": index, "request": request, "target": target, "status": status,
            "executor": None if status == "queued" else target, "label": label,
            "time": "2026-11-25T10:04:01Z", **more}


def automation(kind, log, state="running", args=None, result=None, error=None):
    return {"id": "a1", "kind": kind, "version": 1, "state": state, "initiator": "host1",
            "members": ["host1", "host2", "host3"], "created": "2026-11-25T10:04:00Z",
            "args": args or {}, "result": result, "error": error, "log": log}


def followed(task):
    """The views a follower sees of ``task``: each step running, then as
    logged, then the automation as it ended."""
    log = task["log"]
    for i, entry in enumerate(log):
        if entry["status"] != "running":
            yield dict(task, state="running", result=None, error=None,
                       log=log[:i] + [dict(entry, status="running", error=None)])
        yield dict(task, state="running", result=None, error=None, log=log[:i + 1])
    yield task


def plain(*views) -> list[str]:
    out = io.StringIO()
    view = ProgressView(out, "a1", tty=False, stamp=lambda: STAMP)
    for task in views:
        view.update(task)
    lines = out.getvalue().splitlines()
    assert all(line.startswith(STAMP + " ") for line in lines), lines
    return [line[len(STAMP) + 1:] for line in lines]


def vm(name, host, state="running"):
    return {"name": name, "uuid": f"uuid-{name}", "host": host, "state": state}


def row(name, host, state, error=None, **more):
    return {"name": name, "uuid": f"uuid-{name}", "host": host, "state": state,
            "error": error, **more}


def test_a_boot_says_where_each_vm_was_built_and_not_that_the_automation_is_done():
    boot = automation("boot", [
        step(0, "claim", label="web1"), step(1, "claim", label="db1"),
        step(2, "build", "host3", label="web1"), step(3, "build", "host2", label="db1")],
        state="done", result={"vms": [row("web1", "host3", "running"),
                                      row("db1", "host2", "running")]})
    out = io.StringIO()
    view = ProgressView(out, "a1", tty=False, stamp=lambda: STAMP)
    for task in followed(boot):
        view.update(task)
    assert out.getvalue().splitlines() == ["10:04:01 web1 on host3: building",
                                           "10:04:01 web1 on host3: built",
                                           "10:04:01 db1 on host2: building",
                                           "10:04:01 db1 on host2: built"]


def test_bookkeeping_elsewhere_never_names_a_host_the_vm_is_not_on():
    # stop web1 on host3: the lock and the unlock run on host2, the leader
    stop = automation("stop", [
        step(0, "lock_vm", "host2"), step(1, "stop", "host3"), step(2, "unlock_vm", "host2")],
        state="done", args={"vms": [vm("web1", "host3")]},
        result={"vms": [row("web1", "host3", "shutoff")]})
    assert plain(*followed(stop)) == ["web1 on host3: stopping", "web1 on host3: stopped"]


def test_the_vm_host_comes_from_the_command_when_the_action_step_is_not_seen_yet():
    destroy = automation("destroy", [step(0, "lock_vm", "host2"),
                                     step(1, "destroy", "host3", status="running")],
                         args={"vms": [vm("web1", "host3")]})
    assert plain(destroy) == ["web1 on host3: destroying"]
    locked = automation("destroy", [step(0, "lock_vm", "host2", status="running")],
                        args={"vms": [vm("web1", "host3")]})
    assert plain(locked) == []


def test_a_view_seen_twice_prints_nothing_new():
    stop = automation("stop", [step(0, "stop", "host3")], args={"vms": [vm("web1", "host3")]})
    assert plain(stop, stop, dict(stop, log=[dict(stop["log"][0])])) == ["web1 on host3: stopped"]


def test_a_failed_build_then_another_host_then_success():
    boot = automation("boot", [
        step(0, "claim"),
        step(1, "build", "host2", status="error", error="no space left"),
        step(2, "destroy", "host2"), step(3, "disown"), step(4, "release"),
        step(5, "claim"),
        step(6, "build", "host3", status="timeout"),
        step(7, "destroy", "host3", status="error", error="libvirt gone"),
        step(8, "disown"), step(9, "release"),
        step(10, "claim"), step(11, "build", "host1")],
        state="done", result={"vms": [row("web1", "host1", "running")]})
    assert plain(*followed(boot)) == [
        "web1 on host2: building", "web1 on host2: build failed: no space left",
        "web1 on host3: building", "web1 on host3: build timed out",
        "web1 on host3: cleanup failed: libvirt gone",
        "web1 on host1: building", "web1 on host1: built"]


def test_a_vm_that_cannot_be_placed_gets_one_failed_line_at_the_end():
    why = "no host can fit VCPU:100000,MEMORY_MB:128"
    boot = automation("boot", [step(0, "claim", label="huge1", status="error", error=why),
                               step(1, "release", label="huge1")],
                      state="failed", error=f"1 of 1 VMs could not be built: huge1: {why}",
                      result={"vms": [row("huge1", None, "error", why)]})
    assert plain(*followed(boot)) == [f"huge1: failed: {why}"]


def test_a_live_move_with_its_copy_in_progress():
    def migrating(**progress):
        return step(4, "move_migrate", "host1", status="running", label="db1",
                    progress=progress)
    head = [step(0, "lock_vm", "host3", label="db1"),
            step(1, "move_describe", "host1", label="db1"),
            step(2, "claim_move", "host3", label="db1"),
            step(3, "move_prepare", "host2", label="db1")]
    tail = [step(4, "move_migrate", "host1", label="db1"),
            step(5, "move_locate", "host3", label="db1"),
            step(6, "move_adopt", "host2", label="db1"),
            step(7, "destroy", "host1", label="db1"),
            step(8, "confirm_move", "host3", label="db1"),
            step(9, "unlock_vm", "host3", label="db1")]
    args = {"vms": [vm("db1", "host1")], "offline": False}
    views = [automation("migrate", head + [migrating(**p)], args=args)
             for p in ({"phase": "disk", "percent": 3}, {"phase": "disk", "percent": 9},
                       {"phase": "disk", "percent": 42}, {"phase": "memory", "percent": 90})]
    done = automation("migrate", head + tail, "done", args,
                      {"vms": [row("db1", "host2", "running", mode="live", **{"from": "host1"})]})
    assert plain(*views, done) == ["db1 host1 -> host2: moving (live)  disk 3%",
                                   "db1 host1 -> host2: moving (live)  disk 42%",
                                   "db1 host1 -> host2: moving (live)  memory 90%",
                                   "db1 host1 -> host2: moved (live)"]


def test_a_move_on_the_test_driver_stops_redefines_and_the_tty_names_its_new_host():
    move = automation("migrate", [
        step(0, "lock_vm", label="db1"), step(1, "move_describe", "host3", label="db1"),
        step(2, "claim_move", label="db1"), step(3, "stop", "host3", label="db1"),
        step(4, "move_prepare", "host2", label="db1"), step(5, "move_adopt", "host2", label="db1"),
        step(6, "destroy", "host3", label="db1"), step(7, "confirm_move", label="db1"),
        step(8, "unlock_vm", label="db1")],
        "done", {"vms": [vm("db1", "host3")]},
        {"vms": [row("db1", "host2", "running", mode="redefine")]})
    assert plain(*followed(move)) == ["db1 on host3: stopping for the move",
                                      "db1 on host3: stopped for the move",
                                      "db1 host3 -> host2: moved (redefine)"]
    [line, _bar] = ProgressView(io.StringIO(), "a1", tty=True).lines(move, 120, 40)
    assert line.split() == ["db1", "unlock_vm", "ok", "on", "host2", "->", "running"]


def test_a_batched_evacuation_says_where_each_of_its_vms_went():
    """evacuate v4 moves several VMs to a step, labelled with their names:
    each VM still gets its own line, with its own destination."""
    both, db1, db2 = "db1,db2", vm("db1", "host3"), vm("db2", "host3")
    move = automation("evacuate", [
        step(0, "lock_vms", label=both), step(1, "move_describe_vms", "host3", label=both),
        step(2, "claim_moves", label=both),
        step(3, "move_redefine_vms", "host1", label="db1"),
        step(4, "move_redefine_vms", "host2", label="db2"),
        step(5, "destroy_vms", "host3", label=both), step(6, "confirm_moves", label=both),
        step(7, "unlock_vms", label=both)],
        "done", {"hosts": ["host3"], "vms": [db1, db2]},
        {"vms": [row("db1", "host1", "running", mode="redefine"),
                 row("db2", "host2", "running", mode="redefine")]})
    assert plain(*followed(move)) == ["db1 host3 -> host1: moved (redefine)",
                                      "db2 host3 -> host2: moved (redefine)"]
    lines = ProgressView(io.StringIO(), "a1", tty=True).lines(move, 120, 40)
    assert [line.split()[:6] for line in lines[:2]] == [
        ["db1", "unlock_vm", "ok", "on", "host1", "->"],
        ["db2", "unlock_vm", "ok", "on", "host2", "->"]]


def test_a_move_that_is_reverted_says_so_at_once_and_why_at_the_end():
    why = "not moved: prepare on host2: disk full"
    move = automation("evacuate", [
        step(0, "lock_vm", label="db1"), step(1, "move_describe", "host1", label="db1"),
        step(2, "claim_move", label="db1"),
        step(3, "move_prepare", "host2", label="db1", status="error", error="disk full"),
        step(4, "destroy", "host2", label="db1"), step(5, "revert_move", label="db1"),
        step(6, "unlock_vm", label="db1")],
        "failed", {"hosts": ["host1"], "vms": [vm("db1", "host1")]},
        {"vms": [row("db1", "host1", "running", why)]})
    assert plain(*followed(move)) == ["db1 on host1: not moved to host2", f"db1: {why}"]


def test_an_action_that_fails_on_its_host():
    reboot = automation("reboot", [
        step(0, "lock_vm", "host2"), step(1, "reboot", "host3", status="error",
                                          error="domain is not running"),
        step(2, "unlock_vm", "host2")],
        "failed", {"vms": [vm("web1", "host3", "shutoff")]},
        {"vms": [row("web1", "host3", "error", "domain is not running")]})
    assert plain(*followed(reboot)) == [
        "web1 on host3: rebooting", "web1 on host3: reboot failed: domain is not running",
        "web1: failed: domain is not running"]


def test_a_recovery_rebuilds_from_the_dead_host_elsewhere():
    recover = automation("recover", [
        step(0, "ha_lock"), step(1, "vm_definition"), step(2, "claim_move"),
        step(3, "build", "host2"), step(4, "confirm_move"), step(5, "disown"),
        step(6, "note_restart"), step(7, "unlock_vm")],
        "done", {"host": "host3", "vms": [vm("web1", "host3")]},
        {"vms": [row("web1", "host2", "restarted", **{"from": "host3"})]})
    assert plain(*followed(recover)) == [
        "web1 host3 -> host2: restarting from its image",
        "web1 host3 -> host2: restarted from its image"]


def test_ping_lines_name_the_host_once():
    ping = automation("ping", [step(0, "ping", "host1", label="host1"),
                               step(1, "ping", "host2", label="host2", status="timeout")],
                      "failed", {"hosts": ["host1", "host2"]}, error="no reply from host2")
    assert plain(*followed(ping)) == ["host1: ping ok", "host2: ping timed out"]


def test_the_terminal_line_names_the_vm_host_not_where_its_unlock_ran():
    stop = automation("stop", [step(0, "lock_vm", "host2"), step(1, "stop", "host3"),
                               step(2, "unlock_vm", "host2", status="running")],
                      args={"vms": [vm("web1", "host3")]})
    [line, bar] = ProgressView(io.StringIO(), "a1", tty=True).lines(stop, 120, 40)
    assert line.split() == ["web1", "unlock_vm", "running", "on", "host3"]
    assert bar.startswith("[") and "2/3 steps" in bar and "1 target " in bar
