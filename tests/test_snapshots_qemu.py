"""Snapshots of a real guest (QEMU/KVM tier): a marker written after a
snapshot is gone once the VM is reverted to it, and the guest runs; with
and without memory; and what snapshots do with backups' checkpoints.

Two private libvirtd (``libvirtd_pair``), a peer on each, the tier's busybox
guest booted on host1.  The guest writes markers into sectors of its own
disk with ``dd`` (as tests/test_backups_qemu.py does)."""
from __future__ import annotations

import time

import libvirt
import pytest

from engine.core import keys
from engine.core.values import readable
from tests.support import qemu_guest, wait_until
from tests.support.kvm import BOOT_TIMEOUT, kvm  # noqa: F401  (kvm: a fixture)
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu

SECTOR_A, SECTOR_C = 1_000_000, 1_000_016


def write_marker(kvm, uuid, sector, text):
    kvm.shell("host1", uuid, f"echo {text} | dd of=/dev/vda bs=512 seek={sector} "
                             "conv=notrunc 2>/dev/null; sync")


def read_marker(kvm, uuid, sector) -> str:
    """The text at ``sector``, read past the guest's page cache."""
    out = kvm.shell("host1", uuid, "echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; "
                                   f"echo READ-$((0)):$(dd if=/dev/vda bs=512 skip={sector} "
                                   "count=1 2>/dev/null | head -n 1 | tr -cd 'A-Za-z0-9-')")
    for line in out.splitlines():
        if "READ-0:" in line:
            return line.split("READ-0:", 1)[1].strip()
    raise AssertionError(f"the guest printed no READ line: {out!r}")


def done(kvm, *args, timeout=600):
    doc = kvm.cluster.cli_json("snapshot", *args, timeout=timeout)
    assert doc["state"] == "done", doc
    (row,) = doc["vms"]
    return row


def libvirt_snapshots(kvm, uuid) -> list[str]:
    conn = libvirt.open(kvm.uri["host1"])
    try:
        return sorted(s.getName() for s in conn.lookupByUUIDString(uuid).listAllSnapshots(0))
    finally:
        conn.close()


def checkpoints(kvm, uuid) -> list[str]:
    conn = libvirt.open(kvm.uri["host1"])
    try:
        return sorted(c.getName() for c in conn.lookupByUUIDString(uuid).listAllCheckpoints(0))
    finally:
        conn.close()


@pytest.mark.parametrize("memory", [False, True], ids=["disks", "memory"])
def test_a_revert_forgets_what_was_written_since_and_the_guest_runs(kvm, memory):
    vm = kvm.boot("snap")
    uuid = vm["uuid"]
    write_marker(kvm, uuid, SECTOR_A, "MARKER-A")
    made = done(kvm, "create", "snap", "--name", "before", *(["--memory"] if memory else []))
    assert made["snapshots"][0]["memory"] is memory, made
    record = readable(kvm.store.get(keys.snapshot(uuid, "before")))
    assert (record["host"], record["memory"], record["state"]) == ("host1", memory, "running")
    assert libvirt_snapshots(kvm, uuid) == ["before"]

    write_marker(kvm, uuid, SECTOR_C, "MARKER-C")
    assert read_marker(kvm, uuid, SECTOR_C) == "MARKER-C"
    reverted = done(kvm, "revert", "snap", "before", "--yes")
    assert reverted["state"] == "running", reverted
    assert kvm.where(uuid) == {"host1": "running"}
    if not memory:      # booted again from the disks: its console starts over
        assert qemu_guest.wait_for_console(kvm.console("host1", uuid),
                                           qemu_guest.READY_MARKER, BOOT_TIMEOUT)
    assert read_marker(kvm, uuid, SECTOR_C) == ""
    assert read_marker(kvm, uuid, SECTOR_A) == "MARKER-A"
    if memory:
        # libvirt restarts QEMU with the snapshot loaded (the console log starts
        # over): the guest resumed where it was, and its new log shows no boot
        assert kvm.boots_seen("host1", uuid) == 0

    done(kvm, "delete", "snap", "before")
    assert libvirt_snapshots(kvm, uuid) == []
    assert kvm.store.range(keys.snapshot(uuid, ""))[0] == []


def test_snapshots_and_backup_checkpoints(kvm):
    """Measured: a snapshot can be taken while the VM has checkpoints; a
    backup (incremental too) works beside a snapshot; a revert deletes the
    checkpoints first (QEMU cannot load a snapshot under a dirty bitmap),
    so the next backup is full; libvirt refuses to migrate a VM with a
    snapshot."""
    vm = kvm.boot("ck")
    uuid = vm["uuid"]
    first = kvm.cluster.cli_json("backup", "ck", timeout=600)
    assert first["state"] == "done", first
    assert len(checkpoints(kvm, uuid)) == 1

    done(kvm, "create", "ck", "--name", "disks")
    done(kvm, "create", "ck", "--name", "mem", "--memory")
    assert libvirt_snapshots(kvm, uuid) == ["disks", "mem"]
    beside = kvm.cluster.cli_json("backup", "ck", timeout=600)
    assert beside["state"] == "done" and beside["vms"][0]["kind"] == "incremental", beside

    conn = libvirt.open(kvm.uri["host1"])
    try:
        with pytest.raises(libvirt.libvirtError, match="cannot migrate domain with 2 snapshots"):
            conn.lookupByUUIDString(uuid).migrateToURI3(
                kvm.uri["host2"], {}, libvirt.VIR_MIGRATE_LIVE
                | libvirt.VIR_MIGRATE_NON_SHARED_DISK | libvirt.VIR_MIGRATE_PEER2PEER)
    finally:
        conn.close()

    reverted = done(kvm, "revert", "ck", "mem", "--yes")
    assert reverted["state"] == "running" and len(reverted["dropped"]) == 1, reverted
    assert checkpoints(kvm, uuid) == []
    after = kvm.cluster.cli_json("backup", "ck", timeout=600)
    assert after["state"] == "done", after
    assert after["vms"][0]["kind"] == "full" and "gone" in after["vms"][0]["reason"], after

    reverted = done(kvm, "revert", "ck", "disks", "--yes")
    assert reverted["state"] == "running" and len(reverted["dropped"]) == 1, reverted
    assert qemu_guest.wait_for_console(kvm.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT)
    deleted = kvm.cluster.cli_json("snapshot", "delete", "ck", "disks", "mem", "--yes")
    assert deleted["state"] == "done", deleted
    assert libvirt_snapshots(kvm, uuid) == []


def test_a_shut_off_vm_with_a_checkpoint_is_snapshotted_and_reverted(kvm):
    """libvirt can neither snapshot a shut-off VM with checkpoints nor
    delete them: their bitmaps go with qemu-img, and the result says so."""
    vm = kvm.boot("off")
    uuid = vm["uuid"]
    assert kvm.cluster.cli_json("backup", "off", timeout=600)["state"] == "done"
    write_marker(kvm, uuid, SECTOR_A, "MARKER-A")
    kvm.cluster.cli_json("stop", "off", timeout=120)
    made = done(kvm, "create", "off", "--name", "cold")
    assert made["state"] == "shutoff" and len(made["dropped"]) == 1, made
    assert checkpoints(kvm, uuid) == []

    kvm.cluster.cli_json("start", "off", timeout=120)
    assert qemu_guest.wait_for_console(kvm.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT)
    write_marker(kvm, uuid, SECTOR_C, "MARKER-C")
    kvm.cluster.cli_json("stop", "off", timeout=120)
    reverted = done(kvm, "revert", "off", "cold", "--yes")
    assert reverted["state"] == "shutoff", reverted
    kvm.cluster.cli_json("start", "off", timeout=120)
    assert qemu_guest.wait_for_console(kvm.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT)
    assert read_marker(kvm, uuid, SECTOR_C) == ""
    assert read_marker(kvm, uuid, SECTOR_A) == "MARKER-A"


def test_a_replicated_vm_keeps_its_snapshot_and_a_revert_makes_the_next_update_a_delta(kvm):
    """A replica copies the disks as they are and leaves the snapshot
    where it is; a revert drops the replica's checkpoint with the others,
    so the next update sends the blocks that differ from the previous
    replica (a delta) and says why; a move is refused, naming the
    snapshot."""
    from engine.backups import replicas
    vm = kvm.boot("rp")
    uuid = vm["uuid"]

    def replica_after(moment):
        return wait_until(lambda: (replicas.read(kvm.store, uuid) or {}).get("replica"),
                          lambda r: r and r["time"] > moment, timeout=90, interval=0.2,
                          what="a replica update")
    kvm.cluster.cli_json("replicate", "rp", "--every", "10s")
    replica_after(0)
    done(kvm, "create", "rp", "--name", "s1")
    made = time.time()
    beside = replica_after(made)
    assert beside["kind"] == "incremental" and libvirt_snapshots(kvm, uuid) == ["s1"], beside
    refused = kvm.cluster.cli("migrate", "rp", "--to", "host2", "--yes")
    assert refused.returncode == 1 and "has snapshot 's1'" in refused.stderr, refused.stderr

    reverted = done(kvm, "revert", "rp", "s1", "--yes")
    assert any(name.startswith("peerctl-replica") for name in reverted["dropped"]), reverted
    after = replica_after(time.time())
    assert after["kind"] == "delta" and "gone from the VM" in after["reason"] \
        and "from replica update" in after["reason"], after
    kvm.cluster.cli_json("replicate", "rp", "--stop")
    kvm.cluster.cli_json("destroy", "rp", "--yes", timeout=120)
