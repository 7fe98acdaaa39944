"""Backups of a real guest's disk between two KVM hosts, and restores that
bring its data back (QEMU/KVM tier).

Two private libvirtd (``libvirtd_pair``), a peer on each, the tier's busybox
guest booted on host1 from its disk image.  The guest writes markers into
sectors of its own disk (``/dev/vda``, past the boot filesystem) with
``dd``; a restore that shows a marker got it from the backup's data.
"""
from __future__ import annotations

import subprocess

import libvirt
import pytest

from engine.core import keys
from engine.core.values import readable
from engine.hypervisor.storage import qcow2
from tests.support import qemu_guest
from tests.support.guest_disk import SECTOR_A, SECTOR_B, MiB, read_marker, write_marker
from tests.support.kvm import BOOT_TIMEOUT, kvm  # noqa: F401  (kvm: a fixture)
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

def backed_up(kvm, *args):
    done = kvm.cluster.cli_json("backup", *args, timeout=600)
    assert done["state"] == "done", done
    (row,) = done["vms"]
    return row


def booted_from_backup(kvm, restored):
    (vm,) = restored["vms"]
    assert restored["state"] == "done" and vm["state"] == "running", restored
    assert qemu_guest.wait_for_console(kvm.console(vm["host"], vm["uuid"]),
                                       qemu_guest.READY_MARKER, BOOT_TIMEOUT), \
        "the restored guest did not come up"
    return vm


def test_restore_brings_back_what_each_backup_held_and_an_incremental_costs_what_changed(kvm):
    vm = kvm.boot("db")
    uuid = vm["uuid"]
    write_marker(kvm, "host1", uuid, SECTOR_A, "MARKER-A")
    full = backed_up(kvm, "db")
    assert (full["kind"], full["target"], full["consistency"]) == \
        ("full", "host2", "crash-consistent"), full

    kvm.shell("host1", uuid, "dd if=/dev/urandom of=/dev/vda bs=1M seek=600 count=20 "
                             "2>/dev/null; sync")
    write_marker(kvm, "host1", uuid, SECTOR_B, "MARKER-B")
    incremental = backed_up(kvm, "db")
    assert (incremental["kind"], incremental["target"]) == ("incremental", "host2"), incremental
    print(f"\nfull backup moved {full['bytes'] / MiB:.1f} MiB; the incremental after the "
          f"guest wrote 20 MiB moved {incremental['bytes'] / MiB:.1f} MiB")
    assert 20 * MiB <= incremental["bytes"] <= 3 * 20 * MiB, incremental
    record = readable(kvm.store.get(keys.backup(incremental["backup"])))
    assert record["parent"] == full["backup"]

    kvm.cluster.cli_json("destroy", "db", "--yes", timeout=120)
    latest = booted_from_backup(kvm, kvm.cluster.cli_json(
        "restore", incremental["backup"], "--on", "host2", timeout=600))
    assert (latest["name"], latest["uuid"], latest["host"]) == ("db", uuid, "host2")
    assert read_marker(kvm, "host2", uuid, SECTOR_A) == "MARKER-A"
    assert read_marker(kvm, "host2", uuid, SECTOR_B) == "MARKER-B"

    older = booted_from_backup(kvm, kvm.cluster.cli_json(
        "restore", full["backup"], "--as", "db-then", "--on", "host1", timeout=600))
    assert older["uuid"] != uuid and older["host"] == "host1"
    assert read_marker(kvm, "host1", older["uuid"], SECTOR_A) == "MARKER-A"
    assert read_marker(kvm, "host1", older["uuid"], SECTOR_B) == ""


def disk_compat(kvm, host, uuid) -> str:
    conn = libvirt.open(kvm.uri[host])
    try:
        pool = conn.storagePoolLookupByName(f"peerctl-{host}")
        pool.refresh(0)
        return qcow2.version(pool.storageVolLookupByName(f"{uuid}.qcow2"))
    finally:
        conn.close()


def test_an_old_disk_or_a_cold_move_breaks_the_chain_and_the_full_backup_says_why(kvm):
    vm = kvm.boot("old")
    uuid = vm["uuid"]
    # A disk as peerctl made them before backups: qcow2 version 2, started
    # behind peerctl's back so that it runs on it.
    kvm.cluster.cli_json("stop", "old", timeout=120)
    conn = libvirt.open(kvm.uri["host1"])
    try:
        path = conn.storagePoolLookupByName("peerctl-host1").storageVolLookupByName(
            f"{uuid}.qcow2").path()
        subprocess.run(["qemu-img", "amend", "-f", "qcow2", "-o", "compat=0.10", path],
                       check=True)
        conn.lookupByUUIDString(uuid).create()
    finally:
        conn.close()
    assert disk_compat(kvm, "host1", uuid) == "0.10"
    # up (the console log starts again with the domain): it powers off on the ACPI button
    assert qemu_guest.wait_for_console(kvm.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT)
    old = backed_up(kvm, "old")
    assert old["kind"] == "full" and "not qcow2 version 3" in old["reason"], old

    kvm.cluster.cli_json("stop", "old", timeout=120)
    kvm.cluster.cli_json("start", "old", timeout=120)
    assert disk_compat(kvm, "host1", uuid) == "1.1", "start amends a shut-off old disk"
    first = backed_up(kvm, "old")
    assert first["kind"] == "full" and "no checkpoint" in first["reason"], first
    assert backed_up(kvm, "old")["kind"] == "incremental"

    for there in ("host2", "host1"):        # live: the checkpoint goes along
        moved = kvm.cluster.cli_json("migrate", "old", "--to", there, "--yes", timeout=300)
        assert moved["state"] == "done", moved
    assert backed_up(kvm, "old")["kind"] == "incremental"

    kvm.cluster.cli_json("stop", "old", timeout=120)
    for there in ("host2", "host1"):        # cold: no QEMU runs there to check its bitmap
        moved = kvm.cluster.cli_json("migrate", "old", "--to", there, "--yes", timeout=300)
        assert moved["state"] == "done", moved
    kvm.cluster.cli_json("start", "old", timeout=120)
    after_move = backed_up(kvm, "old")
    assert after_move["kind"] == "full" and "gone from the VM" in after_move["reason"], \
        after_move
    assert backed_up(kvm, "old")["kind"] == "incremental"
