"""The first backup after a live move is incremental, and right (QEMU/KVM
tier): the checkpoint of the newest backup crosses with the VM (QEMU
carries its bitmap with the disk, ``move_adopt`` defines it again,
:mod:`engine.hypervisor.moves.checkpoints`).

Two private libvirtd, a peer on each, the tier's busybox guest booted on
host1.  The guest writes markers into sectors of its own disk: one before
the full backup, one after it but before the move (only the bitmap QEMU
carried knows of it), one after the move; a restore of the incremental
shows every one, so the incremental held every write since the full.
Whoever is killed in the middle of a move (the source's peer, the
destination's, the automation's leader), the next backup is incremental
and restores every marker, or full and says why: never an incremental
that misses a write.

host2 keeps the backups, and a backup is never kept on the VM's own host:
the chain goes on once the VM is back on host1, so each scenario moves it
there and back (with a third host, one move is enough).
"""
from __future__ import annotations

import libvirt
import pytest

from engine.core import api
from tests.support import qemu_guest, wait_for
from tests.support.guest_disk import read_marker, write_marker
from tests.support.cluster import finished, start_automation
from tests.support.kvm import BOOT_TIMEOUT, HOSTS, kvm  # noqa: F401  (kvm: a fixture)
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

MiB = 1 << 20
SECTORS = {"A": 1_000_000, "B": 1_000_008, "C": 1_000_016, "D": 1_000_024}


def write(kvm, host, uuid, letter):
    write_marker(kvm, host, uuid, SECTORS[letter], f"MARKER-{letter}")


def read(kvm, host, uuid, letter) -> str:
    return read_marker(kvm, host, uuid, SECTORS[letter])


def backed_up(kvm, name):
    done = kvm.cluster.cli_json("backup", name, timeout=600)
    assert done["state"] == "done", done
    (row,) = done["vms"]
    return row


def moved(kvm, name, to):
    done = kvm.cluster.cli_json("migrate", name, "--to", to, "--yes", timeout=300)
    assert done["state"] == "done", done
    (row,) = done["vms"]
    assert (row["host"], row["mode"], row["state"]) == (to, "live", "running"), row
    return row


def assert_restores(kvm, backup_id, letters, name, on="host2"):
    """The backup, restored as VM ``name``, holds exactly ``letters``."""
    restored = kvm.cluster.cli_json("restore", backup_id, "--as", name, "--on", on,
                                    timeout=600)
    assert restored["state"] == "done", restored
    (vm,) = restored["vms"]
    assert qemu_guest.wait_for_console(kvm.console(on, vm["uuid"]), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT), "the restored guest did not come up"
    found = {letter: read(kvm, on, vm["uuid"], letter) for letter in SECTORS}
    assert found == {letter: f"MARKER-{letter}" if letter in letters else ""
                     for letter in SECTORS}
    kvm.cluster.cli_json("destroy", name, "--yes", timeout=120)


def test_the_first_backup_after_live_moves_is_incremental_and_holds_every_write(kvm):
    """There and back: the backups' target, host2, cannot keep a backup of
    a VM it runs (a backup is never on the VM's own host), so the chain goes
    on once the VM is back on host1, its checkpoint carried twice."""
    vm = kvm.boot("db")
    uuid = vm["uuid"]
    write(kvm, "host1", uuid, "A")
    full = backed_up(kvm, "db")
    assert full["kind"] == "full", full
    write(kvm, "host1", uuid, "B")          # known to host1's bitmap only

    moved(kvm, "db", "host2")
    write(kvm, "host2", uuid, "C")          # known to host2's bitmap only
    moved(kvm, "db", "host1")
    write(kvm, "host1", uuid, "D")
    after = backed_up(kvm, "db")
    assert (after["kind"], after["reason"]) == ("incremental", None), after
    print(f"\nfull backup {full['bytes'] / MiB:.1f} MiB; the first backup after two live "
          f"moves {after['bytes'] / MiB:.2f} MiB")
    assert after["bytes"] <= full["bytes"] / 4, (full, after)
    assert_restores(kvm, after["backup"], "ABCD", "db-d")
    assert_restores(kvm, full["backup"], "A", "db-a")


def defined_checkpoints(kvm, host, uuid) -> list[str]:
    conn = libvirt.open(kvm.uri[host])
    try:
        return sorted(c.getName() for c in conn.lookupByUUIDString(uuid).listAllCheckpoints(0))
    except libvirt.libvirtError:
        return []           # no copy there
    finally:
        conn.close()


def _copying(store, automation):
    task = api.get_task(store, automation)
    return task if any(e["request"] == "move_migrate" and e.get("progress")
                       for e in task["log"]) else None


@pytest.mark.parametrize("dies", ["source", "destination", "initiator"])
def test_a_move_killed_midway_leaves_no_checkpoint_that_claims_more_than_it_knows(kvm,
                                                                                  dies):
    if dies == "initiator":
        kvm.cluster.start_peer("m1")
        wait_for(lambda: "m1" in api.live_hosts(kvm.store), what="m1 alive")
    vm = kvm.boot("db")
    uuid = vm["uuid"]
    write(kvm, "host1", uuid, "A")
    assert backed_up(kvm, "db")["kind"] == "full"
    write(kvm, "host1", uuid, "B")
    # A copy slow enough to be killed in the middle: the destination's peer
    # gone makes the source abort it; the source's or the leader's leaves
    # libvirtd carrying it on by itself.
    moving = start_automation(kvm.store, "migrate", {
        "vms": [{"name": "db", "uuid": uuid, "host": "host1", "state": "running"}],
        "to": "host2", "bandwidth_mib": 2 if dies == "destination" else 64},
        **({"prefer": ["m1"], "members": 1} if dies == "initiator" else {}))
    wait_for(lambda: _copying(kvm.store, moving), timeout=120, interval=0.2,
             what="the copy to be under way")
    victim = {"source": "host1", "destination": "host2", "initiator": "m1"}[dies]
    kvm.cluster.kill(victim)
    if dies == "initiator":
        kvm.cluster.start_peer("m1")
    task = finished(kvm.store, moving, timeout=300)
    if dies != "initiator":
        kvm.start_peer(victim)
    (row,) = task["result"]["vms"]
    if row["state"] == "error":
        # The move's own verdict when it found the VM running nowhere (the
        # destination's copy still paused for the migration, the source's
        # stopped): both kept for an operator, its lock held.  No checkpoint
        # was defined on either side's behalf meanwhile.
        assert "then the source has it" in row["error"], row
        assert defined_checkpoints(kvm, "host2", uuid) == [], row
        pytest.skip(f"the move ended with the VM on neither host ({row['error']}): "
                    "docs/moves.md, step 6; nothing to back up until an operator decides")
    assert row["host"] in HOSTS and row["state"] == "running", row
    kvm.assert_on(uuid, row["host"])
    write(kvm, row["host"], uuid, "C")
    if row["host"] == "host2":              # the backups' target: home again to go on
        moved(kvm, "db", "host1")
    write(kvm, "host1", uuid, "D")

    following = backed_up(kvm, "db")
    print(f"\n{dies} killed: the VM ended on {row['host']}; the next backup is "
          f"{following['kind']} ({following['reason']})")
    assert following["kind"] == "incremental" or following["reason"], following
    assert_restores(kvm, following["backup"], "ABCD", "db-d")
