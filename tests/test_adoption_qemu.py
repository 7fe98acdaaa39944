"""Brownfield on real QEMU/KVM: a guest an administrator made by hand is
adopted where it runs, moved live, backed up and let go again, and never
restarts (QEMU/KVM tier).

Two private libvirtd (``libvirtd_pair``), peers host1 on kvm1 and host2 on
kvm2 (the ``kvm`` fixture).  On kvm1, through libvirt alone, a storage pool
``brownfield``, a qcow2 volume in it and a persistent running domain on
that disk with an interface on the pair's ``default`` network, no peerctl
metadata (:mod:`tests.support.brownfield_guest`).  Its console prints the
guest's uptime every second: the first reading after each step is greater
than the last before it, so the guest never rebooted.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import libvirt
import pytest

from engine.hypervisor.domain.domain_xml import NAMESPACE
from tests.support import wait_until
from tests.support.brownfield_guest import POOL, fresh_uptime, make_brownfield, \
    remove_brownfield, uptimes
from tests.support.kvm import kvm  # noqa: F401  (a fixture)
from tests.support.libvirtd_pair import NETWORK, libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

NAME = "legacy-db"


@pytest.fixture
def brownfield(kvm, libvirtd_pair):
    """The hand-made guest, running on kvm1; removed from both daemons after."""
    guest = make_brownfield(kvm.uri["host1"], libvirtd_pair.dir, NAME, NETWORK)
    yield guest
    remove_brownfield(list(kvm.uri.values()), guest)


def later(reading: float, before: float, step: str) -> float:
    assert reading > before, f"the guest's uptime went from {before} to {reading} " \
                             f"over {step}: it restarted"
    return reading


def macs(uri: str, uuid: str) -> list[str]:
    conn = libvirt.open(uri)
    try:
        root = ET.fromstring(conn.lookupByUUIDString(uuid).XMLDesc(0))
    finally:
        conn.close()
    return [mac.get("address") for mac in root.findall("./devices/interface/mac")]


def listed_all(kvm) -> dict:
    return {row["name"]: row for row in kvm.cluster.cli_json("vmlist", "--all")}


def consumers(kvm) -> set[str]:
    return {a["consumer"] for a in kvm.cluster.cli_json("placement", "allocations")
            if a.get("allocations")}


def test_a_hand_made_guest_is_adopted_moved_backed_up_and_let_go_without_a_restart(
        kvm, brownfield, libvirtd_pair):
    guest = brownfield
    uptime = fresh_uptime(guest.console_log)
    readings = [uptime]
    own_macs = macs(kvm.uri["host1"], guest.uuid)
    assert len(own_macs) == 1, own_macs

    row = wait_until(lambda: listed_all(kvm).get(NAME), lambda r: r and r["state"] == "running",
                     timeout=30, interval=0.5, what=f"{NAME} listed as foreign")
    assert (row["host"], row["uuid"], row["managed"], row["problems"]) == \
        ("host1", guest.uuid, False, []), row

    adopted = kvm.cluster.cli_json("adopt", f"host1/{NAME}", "--yes", timeout=120)
    assert adopted["state"] == "done" and adopted["vms"][0]["state"] == "running", adopted
    assert guest.uuid in consumers(kvm)
    uptime = later(fresh_uptime(guest.console_log), uptime, "adopt")
    readings.append(uptime)

    moved = kvm.cluster.cli_json("migrate", NAME, "--yes", timeout=300)
    assert moved["state"] == "done", moved
    (move,) = moved["vms"]
    assert (move["from"], move["host"], move["mode"], move["state"]) == \
        ("host1", "host2", "live", "running"), move
    console2 = kvm.console("host2", guest.uuid)
    uptime = later(fresh_uptime(console2), uptime, "the live move")
    readings.append(uptime)
    qemu_pid = libvirtd_pair.daemons[1].guest_pids()[NAME]

    backed = kvm.cluster.cli_json("backup", NAME, timeout=300)
    assert backed["state"] == "done", backed
    (backup,) = backed["vms"]
    assert backup["host"] == "host2" and backup["backup"], backup
    assert backup["backup"] in {b["id"] for b in kvm.cluster.cli_json("backup", "list", NAME)}
    uptime = later(fresh_uptime(console2), uptime, "the backup")
    readings.append(uptime)

    let_go = kvm.cluster.cli_json("unmanage", NAME, "--yes", timeout=120)
    assert let_go["state"] == "done" and let_go["vms"][0]["state"] == "running", let_go
    row = listed_all(kvm)[NAME]
    assert (row["host"], row["managed"], row["state"]) == ("host2", False, "running"), row
    readings.append(later(fresh_uptime(console2), uptime, "unmanage"))
    assert uptimes(console2) == sorted(uptimes(console2))
    print(f"\nthe guest's uptime before adopt, then after adopt, the move, the backup "
          f"and unmanage: {readings}")

    # Still the same QEMU, on kvm2, defined there, without peerctl's metadata.
    assert libvirtd_pair.daemons[1].guest_pids().get(NAME) == qemu_pid
    conn = libvirt.open(kvm.uri["host2"])
    try:
        dom = conn.lookupByUUIDString(guest.uuid)
        assert dom.isActive() and dom.isPersistent()
        assert macs(kvm.uri["host2"], guest.uuid) == own_macs     # its own, kept
        for flags in (libvirt.VIR_DOMAIN_AFFECT_LIVE, libvirt.VIR_DOMAIN_AFFECT_CONFIG):
            with pytest.raises(libvirt.libvirtError):
                dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE, flags)
    finally:
        conn.close()

    # Nothing of it is claimed, and nothing of it is left on kvm1: the move's
    # cleanup deleted its original volume too (ownvols/).
    assert guest.uuid not in consumers(kvm)
    assert "host1" not in kvm.volumes(guest.uuid)
    assert not os.path.exists(guest.disk)
    conn = libvirt.open(kvm.uri["host1"])
    try:
        pool = conn.storagePoolLookupByName(POOL)
        pool.refresh(0)
        assert pool.listAllVolumes(0) == []
        with pytest.raises(libvirt.libvirtError):
            conn.lookupByUUIDString(guest.uuid)
    finally:
        conn.close()
