"""Moving real guests between two KVM hosts on this machine (QEMU/KVM tier).

Two private libvirtd (the ``libvirtd_pair`` fixture: own host UUIDs,
sockets, virtlogd), a peer on each (host1 on kvm1, host2 on kvm2), real
etcd, the real command line.  The guest is the tier's busybox Linux booted
from a disk image through the image cache; it prints its ready marker on
the serial console once per boot and powers off on the ACPI button.

After every scenario the VM runs on exactly one hypervisor, its volumes are
on that host only, and placement holds it there only.
"""
from __future__ import annotations


import pytest

from engine.core import api, keys
from tests.support import qemu_guest, wait_for
from tests.support.cluster import finished, start_automation
from tests.support.kvm import BOOT_TIMEOUT, HOSTS, kvm  # noqa: F401  (kvm: a fixture)
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`


def test_a_running_guest_moves_live_keeps_running_and_comes_back_cold(kvm):
    vm = kvm.boot("mover")
    moved = kvm.cluster.cli_json("migrate", "mover", "--to", "host2", "--yes",
                                 timeout=300)
    assert moved["state"] == "done", moved
    (result,) = moved["vms"]
    assert (result["from"], result["host"], result["mode"], result["state"]) == \
        ("host1", "host2", "live", "running"), result
    assert result["downtime_ms"] > 0 and result["bytes"] > 0, result
    kvm.assert_on(vm["uuid"], "host2")
    assert kvm.boots_seen("host2", vm["uuid"]) == 0, "the guest booted again on host2"
    listed = [v for v in kvm.cluster.cli_json("vmlist") if v["name"] == "mover"]
    assert [(v["host"], v["state"]) for v in listed] == [("host2", "running")]
    # Still the same guest, alive: it powers off on the ACPI button.
    stopped = kvm.cluster.cli_json("stop", "mover", timeout=120)
    assert stopped["state"] == "done", stopped

    back = kvm.cluster.cli_json("migrate", "mover", "--to", "host1", "--yes", timeout=300)
    assert back["state"] == "done", back
    assert (back["vms"][0]["mode"], back["vms"][0]["state"]) == ("cold", "shutoff")
    kvm.assert_on(vm["uuid"], "host1", "shutoff")
    started = kvm.cluster.cli_json("start", "mover", timeout=120)
    assert started["state"] == "done", started
    assert qemu_guest.wait_for_console(kvm.console("host1", vm["uuid"]),
                                       qemu_guest.READY_MARKER, BOOT_TIMEOUT), \
        "the disk moved back must boot again"
    kvm.cluster.cli_json("destroy", "mover", "--yes", timeout=120)


def _copying(store, automation):
    """The task once its move_migrate step reports a copy in progress."""
    task = api.get_task(store, automation)
    return task if any(e["request"] == "move_migrate" and e.get("progress")
                       for e in task["log"]) else None


def slow_move_under_way(kvm, name, bandwidth_mib):
    """Boot ``name`` on host1, start moving it to host2 with the copy capped
    at ``bandwidth_mib`` MiB/s, and wait until the copy reports progress."""
    vm = kvm.boot(name)
    moving = kvm.migrate(vm["uuid"], name, to="host2", bandwidth_mib=bandwidth_mib)
    wait_for(lambda: _copying(kvm.store, moving), timeout=120, interval=0.2,
             what="the copy to be under way")
    return vm, moving


def test_destination_peer_killed_during_the_copy_reverts(kvm):
    vm, moving = slow_move_under_way(kvm, "victim", 2)
    kvm.cluster.kill("host2")
    task = finished(kvm.store, moving, timeout=300)
    assert task["state"] == "failed"
    (result,) = task["result"]["vms"]
    assert (result["host"], result["state"]) == ("host1", "running"), result
    assert kvm.where(vm["uuid"]) == {"host1": "running"}
    kvm.start_peer("host2")        # back: it drops what the move left there
    kvm.assert_on(vm["uuid"], "host1")
    assert kvm.boots_seen("host1", vm["uuid"]) == 1, "the source must never have stopped"
    kvm.cluster.cli_json("destroy", "victim", "--yes", timeout=120)


def test_source_peer_killed_during_the_copy_is_decided_from_both_hypervisors(kvm):
    vm, moving = slow_move_under_way(kvm, "orphan", 64)
    kvm.cluster.kill("host1")       # libvirtd carries on with the migration
    task = finished(kvm.store, moving, timeout=300)
    (result,) = task["result"]["vms"]
    assert result["host"] in HOSTS and result["state"] == "running", result["error"]
    kvm.start_peer("host1")
    kvm.assert_on(vm["uuid"], result["host"])
    kvm.cluster.cli_json("destroy", "orphan", "--yes", timeout=120)


def test_abort_during_the_copy_keeps_the_source_running(kvm):
    vm, moving = slow_move_under_way(kvm, "stayer", 2)
    assert api.abort(kvm.store, moving)["state"] == "aborted"
    (result,) = api.get_task(kvm.store, moving)["result"]["vms"]
    assert (result["host"], result["state"]) == ("host1", "running"), result
    assert "abort" in result["error"]
    kvm.assert_on(vm["uuid"], "host1")
    assert kvm.boots_seen("host1", vm["uuid"]) == 1
    kvm.cluster.cli_json("destroy", "stayer", "--yes", timeout=120)


def test_initiator_killed_at_every_step_boundary_of_a_live_move(kvm, tmp_path):
    """The migration's only member, m1 (a test-driver peer that hosts
    nothing here), is killed by a failpoint just before it first appends each
    kind of step of a live move, and before the final status; it is
    restarted each time.  The guest still moves live, once, and keeps
    running."""
    from engine.core import failpoints
    armed = str(tmp_path / "failpoints")
    env = {failpoints.ENV: armed}
    kvm.cluster.start_peer("m1", env=env)
    wait_for(lambda: "m1" in api.live_hosts(kvm.store), what="m1 alive")
    vm = kvm.boot("hopper")
    steps = ["lock_vm", "move_describe", "claim_move", "move_prepare", "move_migrate",
             "move_locate", "move_adopt", "destroy", "confirm_move", "unlock_vm"]
    failpoints.arm(armed, [f"append {step}" for step in steps] + ["finish"])
    moving = start_automation(kvm.store, "migrate", {
        "vms": [{"name": "hopper", "uuid": vm["uuid"], "host": "host1", "state": "running"}],
        "to": "host2"}, prefer=["m1"], members=1)

    def restart_m1():
        if kvm.cluster.peers["m1"].poll() is not None:
            kvm.cluster.start_peer("m1", env=env)
        task = api.get_task(kvm.store, moving)
        return task if task["state"] in keys.TERMINAL_STATES else None
    task = wait_for(restart_m1, timeout=300, interval=0.1,
                    what="the move to finish through the crashes")
    assert [point for point, _, _ in failpoints.fired(armed)] == \
        [f"append {step}" for step in steps] + ["finish"]
    assert task["state"] == "done", task["error"]
    (result,) = task["result"]["vms"]
    assert (result["host"], result["mode"], result["state"]) == ("host2", "live", "running")
    kvm.assert_on(vm["uuid"], "host2")
    assert kvm.boots_seen("host2", vm["uuid"]) == 0, "the guest booted again on host2"
    kvm.cluster.cli_json("destroy", "hopper", "--yes", timeout=120)
