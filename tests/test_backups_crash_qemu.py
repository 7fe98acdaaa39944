"""Backups through crashes (QEMU/KVM tier): whoever dies, and wherever, a
backup completes or its attempt is cleaned up, and the chain stays one a
restore can trust.

After every scenario: exactly the backups that completed are recorded;
no scratch volume on the VM's host, no backup volume on the target that no
record names, no socket directory of a pull whose peer died, no backup job left on the domain, only the newest backup's
checkpoint on it, no VM lock held; and the next incremental restores the
guest's data.
"""
from __future__ import annotations

import os
import signal
import tempfile

import libvirt
import pytest

from engine.core import api, failpoints, keys
from engine.core.values import readable
from engine.hypervisor.storage import nbdpull
from tests.support import qemu_guest, wait_for
from tests.support.guest_disk import read_marker, write_marker
from tests.support.cluster import finished
from tests.support.kvm import BOOT_TIMEOUT, Kvm
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

MEMBERS = ("m1", "m2", "m3")        # every member of the automations that lead
SECTORS = {"A": 1_000_000, "B": 1_000_008, "C": 1_000_016}


@pytest.fixture
def armed(tmp_path):
    return str(tmp_path / "failpoints")


@pytest.fixture
def kvm(cluster, store, libvirtd_pair, guest_dir, armed):  # noqa: F811
    """host1 and host2 on the two daemons, with crash points armed from the
    ``armed`` file; the guest ``db`` booted on host1."""
    kvm = Kvm(cluster, store, libvirtd_pair, guest_dir,
              peer_env={"*": {failpoints.ENV: armed}})
    yield kvm
    kvm.close()


def write(kvm, uuid, letter, host="host1"):
    write_marker(kvm, host, uuid, SECTORS[letter], f"MARKER-{letter}")


def read(kvm, host, uuid, letter) -> str:
    return read_marker(kvm, host, uuid, SECTORS[letter])


def start_backup(kvm, vm, prefer=None):
    return api.start_automation(kvm.store, "backup", {
        "vms": [{"name": vm["name"], "uuid": vm["uuid"], "host": "host1",
                 "state": "running"}], "to": "host2"}, prefer=prefer)


def records(kvm) -> dict:
    return {r["id"]: r for r in (readable(kv) for kv in kvm.store.range(keys.backup())[0])}


def pool_volumes(kvm, host, pool) -> list[str]:
    conn = libvirt.open(kvm.uri[host])
    try:
        found = conn.storagePoolLookupByName(pool)
        found.refresh(0)
        return sorted(v.name() for v in found.listAllVolumes(0))
    finally:
        conn.close()


def checkpoints_and_job(kvm, uuid):
    conn = libvirt.open(kvm.uri["host1"])
    try:
        dom = conn.lookupByUUIDString(uuid)
        return (sorted(c.getName() for c in dom.listAllCheckpoints(0)),
                dom.jobInfo()[0])
    finally:
        conn.close()


def leftovers(kvm, uuid) -> list[str]:
    """What no completed backup accounts for, on either host."""
    kept = records(kvm)
    newest = max(kept.values(), key=lambda r: r["time"])
    left = [f"scratch {v} on host1" for v in pool_volumes(kvm, "host1", "peerctl-host1")
            if v.startswith("backup-")]
    named = {d["volume"] for r in kept.values() for d in r["disks"]}
    stored = pool_volumes(kvm, "host2", "peerctl-backup-host2")
    left += [f"unrecorded {v} on host2" for v in stored if v not in named]
    left += [f"recorded {v} missing on host2" for v in named if v not in stored]
    checkpoints, job = checkpoints_and_job(kvm, uuid)
    left += [f"checkpoint {c}" for c in checkpoints if c != newest["checkpoint"]]
    if newest["checkpoint"] not in checkpoints:
        left.append(f"the newest backup's checkpoint {newest['checkpoint']} is gone")
    if job != libvirt.VIR_DOMAIN_JOB_NONE:
        left.append("a job on the domain")
    left += [f"lock {kv.key}" for kv in kvm.store.range(keys.lock("vm/"))[0]]
    left += [f"qemu-nbd's socket directory {name}, its peer dead"
             for name in os.listdir(tempfile.gettempdir())
             if name.startswith(nbdpull.SOCKETS)
             and not os.path.exists(f"/proc/{name[len(nbdpull.SOCKETS):].split('-')[0]}")]
    return left


def assert_nothing_left(kvm, uuid):
    """Swept at the latest by the next sweep of a peer that came back."""
    found = []

    def clean():
        found[:] = leftovers(kvm, uuid)
        return not found
    try:
        wait_for(clean, timeout=60, interval=0.5, what="nothing left over")
    except AssertionError:
        raise AssertionError(f"left over: {found}") from None


def assert_restores(kvm, backup_id, letters, name):
    restored = kvm.cluster.cli_json("restore", backup_id, "--as", name, "--on", "host2",
                                    timeout=600)
    (vm,) = restored["vms"]
    assert restored["state"] == "done", restored
    assert qemu_guest.wait_for_console(kvm.console("host2", vm["uuid"]),
                                       qemu_guest.READY_MARKER, BOOT_TIMEOUT)
    for letter in SECTORS:
        assert read(kvm, "host2", vm["uuid"], letter) == \
            (f"MARKER-{letter}" if letter in letters else ""), letter
    kvm.cluster.cli_json("destroy", name, "--yes", timeout=120)


def test_the_initiator_killed_at_every_step_boundary_still_makes_one_incremental(
        kvm, armed):
    # every peer reads the same crash points: whoever leads next dies at the next one
    for member in MEMBERS:
        kvm.cluster.start_peer(member, env={failpoints.ENV: armed})
    wait_for(lambda: set(MEMBERS) <= set(api.live_hosts(kvm.store)), what="members alive")
    vm = kvm.boot("db")
    write(kvm, vm["uuid"], "A")
    first = finished(kvm.store, start_backup(kvm, vm, prefer=list(MEMBERS)), timeout=300)
    assert first["state"] == "done", first["error"]
    write(kvm, vm["uuid"], "B")
    steps = list(dict.fromkeys(e["request"] for e in first["log"]))
    failpoints.arm(armed, [f"append {request}" for request in steps] + ["finish"])
    automation = start_backup(kvm, vm, prefer=list(MEMBERS))
    task = wait_for(lambda: kvm.restart_the_dead(automation, MEMBERS, armed), timeout=600,
                    interval=0.1, what="the backup to finish through the crashes")
    fired = [point for point, _, _ in failpoints.fired(armed)]
    assert task["state"] == "done", (task["error"], task["result"])
    assert fired == [f"append {request}" for request in steps] + ["finish"]
    (row,) = task["result"]["vms"]
    assert row["kind"] == "incremental", row
    assert sorted(records(kvm)) == sorted([first["result"]["vms"][0]["backup"], row["backup"]])
    assert_nothing_left(kvm, vm["uuid"])
    assert_restores(kvm, row["backup"], "AB", "db-b")


@pytest.mark.parametrize("point, dies", [("backup begun", "host1"), ("finishing", "host1"),
                                         ("pulling", "host2")])
def test_a_peer_killed_mid_backup_leaves_one_complete_backup_or_nothing(kvm, armed, point,
                                                                        dies):
    """The VM's host just after its pull job began, or before it ends the
    job the target has read; the target mid-read."""
    vm = kvm.boot("db")
    write(kvm, vm["uuid"], "A")
    first = finished(kvm.store, start_backup(kvm, vm), timeout=300)
    assert first["state"] == "done", first["error"]
    write(kvm, vm["uuid"], "B")
    failpoints.arm(armed, [point])
    automation = start_backup(kvm, vm)
    task = wait_for(lambda: kvm.restart_the_dead(automation),
                    timeout=600, interval=0.1, what="the backup to end through the crash")
    assert [p for p, _, _ in failpoints.fired(armed)] == [point]
    the_rest_holds(kvm, vm, first, task)


def the_rest_holds(kvm, vm, first, task):
    """Exactly the completed backups recorded, nothing left, and the next
    incremental restores what the guest wrote."""
    kept = records(kvm)
    if task["state"] == "done":
        assert len(kept) == 2 and task["result"]["vms"][0]["backup"] in kept
    else:
        assert list(kept) == [first["result"]["vms"][0]["backup"]], task
    assert_nothing_left(kvm, vm["uuid"])
    write(kvm, vm["uuid"], "C")
    following = finished(kvm.store, start_backup(kvm, vm), timeout=300)
    assert following["state"] == "done", following["error"]
    (row,) = following["result"]["vms"]
    assert row["kind"] == "incremental", row
    assert_nothing_left(kvm, vm["uuid"])
    assert_restores(kvm, row["backup"], "ABC", "db-c")


def test_the_vms_host_killed_while_the_target_reads_its_export(kvm, armed):
    """The export lives in the VM host's libvirtd, not in its peer: the
    target reads on, records, and the job ends once the peer is back."""
    vm = kvm.boot("db")
    write(kvm, vm["uuid"], "A")
    first = finished(kvm.store, start_backup(kvm, vm), timeout=300)
    assert first["state"] == "done", first["error"]
    write(kvm, vm["uuid"], "B")
    failpoints.arm(armed, ["pause pulling"])       # the target stops mid-read...
    automation = start_backup(kvm, vm)
    (paused,) = wait_for(lambda: failpoints.fired(armed), timeout=300,
                         what="the target to stop mid-read")
    kvm.cluster.kill("host1")                       # ...the VM's host's peer dies...
    os.kill(paused[1], signal.SIGCONT)              # ...and the target reads on
    task = wait_for(lambda: kvm.restart_the_dead(automation),
                    timeout=600, interval=0.1, what="the backup to end through the crash")
    the_rest_holds(kvm, vm, first, task)
