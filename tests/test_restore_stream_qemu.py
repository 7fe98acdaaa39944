"""Restores that read a chain once (QEMU/KVM tier): the chain's host serves
a full backup and its incrementals as one read-only image over NBD, and the
restoring host copies it into the new VM's disk.

The guest writes markers into sectors of its disk before each backup (one
of them overwritten by a later incremental, so that the newest link must
win); the restored guest reads them back.  After every scenario, crashes
included: the restore is done and its guest shows exactly the chain's
markers, no export is left on the chain's host (no record, no
``qemu-nbd``), no volume of a failed restore is left on the restoring
host, the chain's holds are released, and the stored volumes still match
their records' checksums (they were served read-only, never modified).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess

import libvirt
import pytest

from engine.core import api, failpoints, keys
from engine.core.values import readable
from engine.hypervisor.data.backup_pull import CONTENT
from engine.hypervisor.storage.file_checksum import file_checksum
from engine.hypervisor.storage.nbdpull import content_checksum
from tests.support import qemu_guest, wait_for
from tests.support.cluster import finished
from tests.support.guest_disk import read_marker, write_marker
from tests.support.kvm import BOOT_TIMEOUT, Kvm
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

MEMBERS = ("m1", "m2", "m3")        # every member of the automations that lead
SECTORS = {"A": 1_000_000, "B": 1_000_008, "C": 1_000_016, "D": 1_000_024}
# what the chain holds: A written before the full backup and overwritten
# before the third incremental; B, C, D one before each incremental
WRITTEN = [("A", "MARKER-A"), ("B", "MARKER-B"), ("C", "MARKER-C"), ("A", "MARKER-A2"),
           ("D", "MARKER-D")]
EXPECTED = {"A": "MARKER-A2", "B": "MARKER-B", "C": "MARKER-C", "D": "MARKER-D"}


@pytest.fixture
def armed(tmp_path):
    """The crash points of every peer, one file: whichever peer leads, or
    does the step, reaches a point first (the points of the chain's host and
    of the restoring host have names of their own)."""
    return str(tmp_path / "failpoints")


@pytest.fixture
def kvm(cluster, store, libvirtd_pair, guest_dir, armed):  # noqa: F811
    kvm = Kvm(cluster, store, libvirtd_pair, guest_dir, peer_env={"*": {failpoints.ENV: armed}})
    yield kvm
    kvm.close()


def backed_up(kvm, vm) -> dict:
    done = kvm.cluster.cli_json("backup", vm["name"], "--to", "host2", timeout=600)
    assert done["state"] == "done", done
    (row,) = done["vms"]
    return row


def chain_of_four(kvm) -> tuple[dict, list[dict]]:
    """The guest ``db`` on host1 and a full backup + 3 incrementals of it on host2."""
    vm = kvm.boot("db")
    taken = []
    for at, (letter, text) in enumerate(WRITTEN):
        write_marker(kvm, "host1", vm["uuid"], SECTORS[letter], text)
        if at in (0, 1, 2, 4):
            taken.append(backed_up(kvm, vm))
    assert [row["kind"] for row in taken] == ["full"] + ["incremental"] * 3, taken
    return vm, taken


def records(kvm) -> dict:
    return {r["id"]: r for r in (readable(kv) for kv in kvm.store.range(keys.backup())[0])}


def volume_path(kvm, host, pool, name) -> str:
    conn = libvirt.open(kvm.uri[host])
    try:
        found = conn.storagePoolLookupByName(pool)
        found.refresh(0)
        return found.storageVolLookupByName(name).path()
    finally:
        conn.close()


def pool_volumes(kvm, host) -> list[str]:
    conn = libvirt.open(kvm.uri[host])
    try:
        found = conn.storagePoolLookupByName(f"peerctl-{host}")
        found.refresh(0)
        return sorted(v.name() for v in found.listAllVolumes(0))
    finally:
        conn.close()


def exports_left(kvm) -> list[str]:
    """Export records on host2, and any qemu-nbd serving a restore."""
    directory = os.path.join(kvm.state["host2"], "restore-exports")
    left = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"peerctl restore" in cmdline and kvm.state["host2"].encode() in cmdline:
            left.append(f"qemu-nbd {pid}")
    return left


def assert_clean(kvm, taken, failed_uuid=None):
    """No export, no hold, the chain unmodified; no volume of a failed restore."""
    found = []

    def clean():
        found[:] = exports_left(kvm)
        return not found
    try:
        wait_for(clean, timeout=60, interval=0.5, what="no export left")
    except AssertionError:
        raise AssertionError(f"left over: {found}") from None
    kept = records(kvm)
    for row in taken:
        record = kept[row["backup"]]
        assert not record.get("holds"), record
        for disk in record["disks"]:
            path = volume_path(kvm, "host2", record["pool"], disk["volume"])
            assert stored_checksum(path, disk) == disk["checksum"], \
                f"{disk['volume']} was modified"
    if failed_uuid is not None:
        assert [v for v in pool_volumes(kvm, "host1") if v.startswith(failed_uuid)] == []


def stored_checksum(path: str, disk: dict) -> str:
    """A backup volume's checksum as its record counts it: of its content
    for a pulled backup, else of its file."""
    if disk.get("checksum_of") == CONTENT:
        return content_checksum(path)[0]
    return file_checksum(path)[0]


def data_offset(path: str) -> int:
    """Where in the file, in the middle of its guest data, a byte lies."""
    extents = json.loads(subprocess.run(["qemu-img", "map", "--output=json", "-f", "qcow2", path],
                                        capture_output=True, text=True, check=True).stdout)
    data = [e for e in extents if e.get("data") and "offset" in e]
    middle = data[len(data) // 2]
    return middle["offset"] + middle["length"] // 2


def restored_exactly(kvm, task, name):
    assert task["state"] == "done", (task.get("error"), task.get("result"))
    (vm,) = task["result"]["vms"]
    assert vm["host"] == "host1", vm
    assert qemu_guest.wait_for_console(kvm.console("host1", vm["uuid"]),
                                       qemu_guest.READY_MARKER, BOOT_TIMEOUT)
    for letter, text in EXPECTED.items():
        assert read_marker(kvm, "host1", vm["uuid"], SECTORS[letter]) == text, letter
    kvm.cluster.cli_json("destroy", name, "--yes", timeout=120)


def start_restore(kvm, backup_id, name, prefer=None):
    return api.start_automation(kvm.store, "restore", {"backup": backup_id, "name": name,
                                                       "on": "host1"}, prefer=prefer)


def requests_of(task) -> list[str]:
    return list(dict.fromkeys(entry["request"] for entry in task["log"]))


def test_a_chain_of_four_is_served_once_and_restored_exactly(kvm):
    _vm, taken = chain_of_four(kvm)
    task = finished(kvm.store, start_restore(kvm, taken[-1]["backup"], "db-r"), timeout=600)
    assert requests_of(task) == ["restore_plan", "claim", "restore_export", "restore_disks",
                                 "restore_unexport", "build", "backup_release"], task["log"]
    restored_exactly(kvm, task, "db-r")
    assert_clean(kvm, taken)


def test_a_damaged_link_restores_nothing_and_names_its_backup(kvm):
    vm, taken = chain_of_four(kvm)
    damaged = records(kvm)[taken[2]["backup"]]
    path = volume_path(kvm, "host2", damaged["pool"], damaged["disks"][0]["volume"])
    at = data_offset(path)
    with open(path, "r+b") as f:        # a flipped byte in the middle of its data
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    task = finished(kvm.store, start_restore(kvm, taken[-1]["backup"], "db-r"), timeout=600)
    assert task["state"] == "failed", task
    assert f"backup {damaged['id']}" in task["error"] and "damaged" in task["error"], \
        task["error"]
    (row,) = task["result"]["vms"]
    with open(path, "r+b") as f:        # mended, so that the chain checks again
        f.seek(at)
        f.write(byte)
    assert_clean(kvm, taken, failed_uuid=row["uuid"])
    assert vm["uuid"] != row["uuid"]


@pytest.mark.parametrize("point", ["restoring", "restore checked"])
def test_a_peer_killed_mid_restore_still_restores_exactly(kvm, armed, point):
    """The restoring host's peer killed mid-copy (its qemu-img dies with it;
    the step runs again into a fresh volume), or the chain's host's peer
    killed once it checked the chain (the export starts on the next run)."""
    _vm, taken = chain_of_four(kvm)
    failpoints.arm(armed, [point])
    automation = start_restore(kvm, taken[-1]["backup"], "db-r")
    task = wait_for(lambda: kvm.restart_the_dead(automation, MEMBERS, armed),
                    timeout=600, interval=0.1, what="the restore to end through the crash")
    assert [p for p, _, _ in failpoints.fired(armed)] == [point]
    restored_exactly(kvm, task, "db-r")
    assert_clean(kvm, taken)


def test_the_chain_hosts_peer_killed_mid_copy_leaves_the_copy_going(kvm, armed):
    """qemu-nbd runs in a session of its own: the copy finishes while the
    chain's host's peer is dead, and the export ends once it is back."""
    _vm, taken = chain_of_four(kvm)
    failpoints.arm(armed, ["pause restoring"])
    automation = start_restore(kvm, taken[-1]["backup"], "db-r")
    wait_for(lambda: failpoints.fired(armed), timeout=300, interval=0.05,
             what="the copy to start")
    kvm.cluster.kill("host2")
    kvm.cluster.kill("host1", signal.SIGCONT)
    task = wait_for(lambda: kvm.restart_the_dead(automation, MEMBERS, armed),
                    timeout=600, interval=0.1, what="the restore to end through the crash")
    restored_exactly(kvm, task, "db-r")
    assert_clean(kvm, taken)


def test_an_export_whose_restore_ended_is_swept_when_its_peer_comes_back(kvm, armed):
    """The chain's host's peer dies with its export up and stays away until
    the restore gave up: the export is ended by that peer's sweep."""
    _vm, taken = chain_of_four(kvm)
    failpoints.arm(armed, ["restore exported"])
    automation = start_restore(kvm, taken[-1]["backup"], "db-r")
    task = finished(kvm.store, automation, timeout=600)
    assert task["state"] == "failed", task
    assert exports_left(kvm), "the export should still be up while its peer is away"
    (row,) = task["result"]["vms"]
    kvm.start_peer("host2")
    assert_clean(kvm, taken, failed_uuid=row["uuid"])


def test_the_initiator_killed_at_every_step_boundary_still_restores_once(kvm, armed):
    """Whoever leads dies at each step boundary: the members first, and
    host1 or host2 when they were recruited in their stead."""
    for member in MEMBERS:
        kvm.cluster.start_peer(member, env={failpoints.ENV: armed})
    wait_for(lambda: set(MEMBERS) <= set(api.live_hosts(kvm.store)), what="members alive")
    _vm, taken = chain_of_four(kvm)
    steps = ["restore_plan", "claim", "restore_export", "restore_disks", "restore_unexport",
             "build", "backup_release"]
    failpoints.arm(armed, [f"append {request}" for request in steps] + ["finish"])
    automation = start_restore(kvm, taken[-1]["backup"], "db-r", prefer=list(MEMBERS))
    task = wait_for(lambda: kvm.restart_the_dead(automation, MEMBERS, armed),
                    timeout=600, interval=0.1, what="the restore to finish through the crashes")
    assert [p for p, _, _ in failpoints.fired(armed)] == \
        [f"append {request}" for request in steps] + ["finish"]
    restored_exactly(kvm, task, "db-r")
    assert_clean(kvm, taken)
