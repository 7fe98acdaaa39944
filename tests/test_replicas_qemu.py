"""Replicas of a real guest's disk and HA restarts from them (QEMU/KVM
tier).

host1 and host2 on two private libvirtd, the drained test-driver members
m1 and m2 to lead automations (``ha_kvm``).  The guest writes markers into
sectors of its disk; a guest restarted on host2 that shows a marker got it
from its replica.  The replica is updated every 10 s; a marker written
before an update completed is in the replica, one written after it may be
missing, and the result's ``data_as_of`` says which update it came from.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

import libvirt
import pytest

from engine.backups import replicas
from engine.core import api, failpoints
from engine.hypervisor.domain.domain_xml import pool_xml
from engine.hypervisor.storage import blockmap
from engine.hypervisor.storage.volcopy import copy_volume
from tests.support import qemu_guest, wait_for, wait_until
from tests.support.cluster import finished
from tests.support.kvm import BOOT_TIMEOUT, kvm  # noqa: F401  (kvm: a fixture)
from tests.support.guest_disk import SECTOR_A, SECTOR_B, read_marker, write_marker
from tests.support.ha_kvm import ha_kvm  # noqa: F401  (a fixture)
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`


def replica(store, uuid):
    return (replicas.read(store, uuid) or {}).get("replica")


def updated_after(store, uuid, moment, timeout=90):
    """The replica once an update taken after ``moment`` is complete."""
    return wait_until(lambda: replica(store, uuid),
                      lambda r: r and r["host"] == "host2" and r["time"] > moment,
                      timeout=timeout, interval=0.2, what="a replica update after the write")


def restarted_on_host2(kvm, name, uuid):
    wait_for(lambda: kvm.where(uuid).get("host2") == "running", timeout=120, interval=0.5,
             what="the guest running on host2")
    assert qemu_guest.wait_for_console(kvm.console("host2", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT), "the restarted guest did not boot"
    (vm,) = [v for v in kvm.cluster.cli_json("vmlist") if v["name"] == name]
    assert (vm["host"], vm["state"], vm["recovered"]["from"]) == \
        ("host2", "running", "host1"), vm
    return vm


def test_an_ha_restart_brings_a_guest_back_on_its_replica_host_with_its_data(ha_kvm, store):
    kvm = ha_kvm
    vm = kvm.boot("db", "--ha", "restart")
    uuid = vm["uuid"]
    kvm.cluster.cli_json("replicate", "db", "--every", "10s")
    first = updated_after(store, uuid, 0)
    write_marker(kvm, "host1", uuid, SECTOR_A, "MARKER-A")
    wrote_a = time.time()
    kept = updated_after(store, uuid, wrote_a)
    assert kept["kind"] == "incremental" and kept["seq"] > first["seq"], kept
    write_marker(kvm, "host1", uuid, SECTOR_B, "MARKER-B")
    kvm.cluster.kill("host1")
    killed = time.time()

    vm = restarted_on_host2(kvm, "db", uuid)
    as_of = vm["recovered"]["data_as_of"]
    assert as_of >= kept["time"] and as_of < killed, (vm["recovered"], kept)
    assert read_marker(kvm, "host2", uuid, SECTOR_A) == "MARKER-A"
    assert read_marker(kvm, "host2", uuid, SECTOR_B) in ("MARKER-B", "")
    print(f"\nrecovery point: the replica's data was {killed - as_of:.1f} s old at the kill")

    kvm.start_peer("host1")
    wait_for(lambda: "host1" in api.live_hosts(store), timeout=60, what="host1 back")
    wait_for(lambda: kvm.where(uuid) == {"host2": "running"}, timeout=60, interval=0.5,
             what="host1's stale copy undefined, one copy left")
    asides = kvm.cluster.cli_json("aside", "list", "host1")
    assert [(a["name"], a["uuid"]) for a in asides] == [("db", uuid)], asides
    kvm.cluster.cli_json("replicate", "db", "--stop")
    wait_for(lambda: replicas.read(store, uuid) is None, timeout=60, what="replication ended")
    kvm.cluster.cli_json("destroy", "db", "--yes", timeout=120)


def test_peers_killed_mid_update_leave_a_whole_replica(ha_kvm, store):
    """The source's peer dies while it copies an update, and the replica
    host's peer dies while it writes one in: each time the replica stays
    whole, and the guest restarted from it has the last recorded update's
    data."""
    kvm = ha_kvm
    vm = kvm.boot("db")         # no HA yet: its peer's death would fence it
    uuid = vm["uuid"]
    kvm.cluster.cli_json("replicate", "db", "--every", "10s")
    updated_after(store, uuid, 0)
    write_marker(kvm, "host1", uuid, SECTOR_A, "MARKER-A")
    kvm.shell("host1", uuid, "dd if=/dev/urandom of=/dev/vda bs=1M seek=600 count=20 "
                             "2>/dev/null; sync")
    wrote_a = time.time()
    failpoints.arm(str(kvm.armed), ["copying"])
    wait_for(lambda: failpoints.fired(str(kvm.armed)), timeout=60,
             what="the source's peer killed while it copies")
    kvm.start_peer("host1")
    with_a = updated_after(store, uuid, wrote_a)

    kvm.cluster.cli_json("ha", "db", "restart")
    write_marker(kvm, "host1", uuid, SECTOR_B, "MARKER-B")
    wrote_b = time.time()
    for _ in range(3):
        cut = len(failpoints.fired(str(kvm.armed)))
        failpoints.arm(str(kvm.armed), ["replica committed"])
        wait_for(lambda: len(failpoints.fired(str(kvm.armed))) > cut, timeout=60,
                 what="the replica host's peer killed while it writes an update in")
        with_b = replica(store, uuid)
        if with_b["time"] > wrote_b:
            break
        # the update cut had begun before B was written: host2 back, and cut the next
        kvm.start_peer("host2")
        wait_for(lambda: "host2" in api.live_hosts(store), timeout=60, what="host2 back")
    assert with_b["time"] > wrote_b and with_b["pending"], with_b   # recorded, not finished
    kvm.start_peer("host2")
    wait_for(lambda: "host2" in api.live_hosts(store), timeout=60, what="host2 back")
    kvm.cluster.kill("host1")

    vm = restarted_on_host2(kvm, "db", uuid)
    assert vm["recovered"]["data_as_of"] >= with_b["time"] > with_a["time"]
    assert read_marker(kvm, "host2", uuid, SECTOR_A) == "MARKER-A"
    assert read_marker(kvm, "host2", uuid, SECTOR_B) == "MARKER-B"
    kvm.cluster.cli_json("destroy", "db", "--yes", timeout=120)


def replica_volumes(kvm, host) -> list[str]:
    conn = libvirt.open(kvm.uri[host])
    try:
        pool = conn.storagePoolLookupByName(f"peerctl-{host}")
        pool.refresh(0)
        return sorted(v.name() for v in pool.listAllVolumes(0)
                      if v.name().startswith("bk-replica"))
    finally:
        conn.close()


def test_a_replica_left_on_a_host_that_was_down_is_swept_when_it_returns(kvm, store):
    vm = kvm.boot("web")
    uuid = vm["uuid"]
    kvm.cluster.cli_json("replicate", "web", "--every", "10s")
    kept = updated_after(store, uuid, 0)
    assert replica_volumes(kvm, "host2") == sorted(d["volume"] for d in kept["disks"])
    kvm.cluster.kill("host2")
    automation = replicas.read(store, uuid)["automation"]
    kvm.cluster.cli_json("replicate", "web", "--stop")
    wait_for(lambda: replicas.read(store, uuid) is None, timeout=120,
             what="replication stopped with its replica's host down")
    # the record goes first, the automation's status with its next step
    assert finished(store, automation)["state"] == "done"
    assert replica_volumes(kvm, "host2"), "nothing could delete them while host2 was down"
    kvm.start_peer("host2")
    wait_for(lambda: replica_volumes(kvm, "host2") == [], timeout=60,
             what="host2's peer sweeping the replica nobody names")
    kvm.cluster.cli_json("destroy", "web", "--yes", timeout=120)


MiB = 1 << 20


def test_a_live_move_to_the_replicas_host_copies_only_what_changed_since(kvm, store):
    vm = kvm.boot("db")
    uuid = vm["uuid"]
    kvm.shell("host1", uuid, "dd if=/dev/urandom of=/dev/vda bs=1M seek=600 count=20 "
                             "2>/dev/null; sync")
    write_marker(kvm, "host1", uuid, SECTOR_A, "MARKER-A")
    wrote = time.time()
    kvm.cluster.cli_json("replicate", "db", "--every", "10s")
    updated_after(store, uuid, wrote)
    write_marker(kvm, "host1", uuid, SECTOR_B, "MARKER-B")

    moved = kvm.cluster.cli_json("migrate", "db", "--to", "host2", "--yes", timeout=300)
    (row,) = moved["vms"]
    assert (moved["state"], row["host"], row["state"]) == ("done", "host2", "running"), moved
    via = row["via_replica"]
    assert via["used"] is True, row
    print(f"\nmove onto the replica: {row['disk_bytes'] / MiB:.1f} MiB of disk crossed in the "
          f"migration, {via['bytes'] / MiB:.1f} MiB in the last update, the guest paused "
          f"{via['paused_ms']:.0f} ms for it; the guest had written 20 MiB before")
    assert row["disk_bytes"] < 20 * MiB and via["bytes"] < 20 * MiB, row
    assert read_marker(kvm, "host2", uuid, SECTOR_A) == "MARKER-A"
    assert read_marker(kvm, "host2", uuid, SECTOR_B) == "MARKER-B"
    assert kvm.where(uuid) == {"host2": "running"}
    consumed = replicas.read(store, uuid)["consumed"]
    assert consumed["host"] == "host2" and consumed["seq"] == via["seq"], consumed
    # replication goes on, the other way, from the disk the move froze on host1
    back = wait_until(lambda: replica(store, uuid),
                      lambda r: r and r["host"] == "host1" and not r["pending"],
                      timeout=90, interval=0.2, what="a new replica on host1")
    print(f"the update back to host1: {back['kind']}, {back['bytes'] / MiB:.2f} MiB ({back['reason']})")
    assert back["kind"] == "delta" and back["bytes"] < 2 * MiB, back
    assert sorted(volume_paths(kvm, "host1", "bk-")) == [d["volume"] for d in back["disks"]]
    kvm.cluster.cli_json("replicate", "db", "--stop")
    kvm.cluster.cli_json("destroy", "db", "--yes", timeout=120)


@pytest.fixture
def cut_kvm(cluster, store, libvirtd_pair, guest_dir, tmp_path):  # noqa: F811
    """``ha_kvm`` with host1 a machine of its own: its peer (and so its
    guard) runs inside its daemon's namespace and reaches etcd over the
    rack, at this machine's address there, as a real host reaches an etcd
    member; pulling its cable (``rack.set_link``) partitions it."""
    from engine.core import failpoints as fp
    from tests.support.ha_kvm import MARGIN, start_member
    from tests.support.kvm import Kvm
    from tests.support.tcp_proxy import TcpProxy
    armed = tmp_path / "failpoints"
    armed.write_text("")
    host, port = cluster.etcd_url.rsplit("//", 1)[1].split(":")
    over_the_rack = TcpProxy(host, int(port), host=libvirtd_pair.rack.gateway).start()
    common = {fp.ENV: str(armed), "PEERCTL_HA_RETRY": "2"}
    kvm = Kvm(cluster, store, libvirtd_pair, guest_dir,
              peer_env={"*": common, "host1": {"PEERCTL_ETCD": over_the_rack.url}},
              peer_args=["--ha-margin", MARGIN], inside=["host1"])
    kvm.armed = armed
    for member in ("m1", "m2"):
        start_member(kvm, member)
    wait_for(lambda: {"m1", "m2"} <= set(api.live_hosts(store)), what="members alive")
    kvm.cluster.cli_json("drain", "m*", "--yes")
    try:
        yield kvm
    finally:
        libvirtd_pair.rack.set_link("kvm1", True)
        over_the_rack.cut()
        kvm.close()


def test_a_host_cut_from_the_rack_is_fenced_and_its_guest_comes_back_from_its_replica(
        cut_kvm, store, libvirtd_pair):
    """host1's link goes down with a replicated HA guest on it: its guard
    powers the guest off before its lease can expire, and the guest comes
    back on host2 from its replica; with the link back, host1 keeps its
    copy aside and one copy runs."""
    kvm = cut_kvm
    vm = kvm.boot("db", "--ha", "restart")
    uuid = vm["uuid"]
    kvm.cluster.cli_json("replicate", "db", "--every", "10s")
    updated_after(store, uuid, 0)
    write_marker(kvm, "host1", uuid, SECTOR_A, "MARKER-A")
    kept = updated_after(store, uuid, time.time())

    libvirtd_pair.rack.set_link("kvm1", False)
    cut = time.time()
    # host1's daemon still answers this machine on its UNIX socket: the
    # guard, cut off like its peer, powered the guest off there
    wait_for(lambda: kvm.where(uuid).get("host1") != "running", timeout=60, interval=0.2,
             what="host1's copy fenced")
    fenced = time.time()
    vm = restarted_on_host2(kvm, "db", uuid)
    assert vm["recovered"]["data_as_of"] >= kept["time"]
    assert read_marker(kvm, "host2", uuid, SECTOR_A) == "MARKER-A"
    assert kvm.where(uuid).get("host1") != "running", "two copies ran"
    print(f"\nfenced {fenced - cut:.1f} s after the cut; running on host2 "
          f"{time.time() - cut:.1f} s after it")

    libvirtd_pair.rack.set_link("kvm1", True)
    wait_for(lambda: "host1" in api.live_hosts(store), timeout=90, what="host1 back")
    wait_for(lambda: kvm.where(uuid) == {"host2": "running"}, timeout=60, interval=0.5,
             what="host1's stale copy set aside, one copy left")
    kvm.cluster.cli_json("replicate", "db", "--stop")
    kvm.cluster.cli_json("destroy", "db", "--yes", timeout=120)


# -- reverse replication: after an HA restart, only the differing blocks go back -----------

def volume_paths(kvm, host, prefix) -> dict:
    """name -> path of ``host``'s pool volumes whose name starts with ``prefix``."""
    conn = libvirt.open(kvm.uri[host])
    try:
        pool = conn.storagePoolLookupByName(f"peerctl-{host}")
        pool.refresh(0)
        return {v.name(): v.path() for v in pool.listAllVolumes(0)
                if v.name().startswith(prefix)}
    finally:
        conn.close()


def disk_sum(kvm, host, uuid) -> str:
    """The MD5 of the whole disk as the guest reads it (QEMU's view, which
    the image file may lag behind)."""
    out = kvm.shell(host, uuid, "echo SUM-$((0)):$(md5sum /dev/vda | cut -c1-32)", timeout=600)
    for line in out.splitlines():
        if "SUM-0:" in line:
            return line.split("SUM-0:", 1)[1].strip()
    raise AssertionError(f"the guest printed no SUM line: {out!r}")


def failed_over_with_writes(kvm, store, name):
    """A replicated HA guest that wrote 4 MiB on host1 after its last
    update, then was restarted on host2 and wrote 5 MiB there; host1 back,
    its stale copy aside.  ``(uuid, last update before the kill)``."""
    vm = kvm.boot(name, "--ha", "restart")
    uuid = vm["uuid"]
    kvm.shell("host1", uuid, "dd if=/dev/urandom of=/dev/vda bs=1M seek=600 count=20 "
                             "2>/dev/null; sync")
    write_marker(kvm, "host1", uuid, SECTOR_A, "MARKER-A")
    wrote = time.time()
    kvm.cluster.cli_json("replicate", name, "--every", "10s")
    kept = updated_after(store, uuid, wrote)
    kvm.shell("host1", uuid, "dd if=/dev/urandom of=/dev/vda bs=1M seek=700 count=4 "
                             "2>/dev/null; sync")
    kvm.cluster.kill("host1")
    restarted_on_host2(kvm, name, uuid)
    write_marker(kvm, "host2", uuid, SECTOR_B, "MARKER-C")
    kvm.shell("host2", uuid, "dd if=/dev/urandom of=/dev/vda bs=1M seek=800 count=5 "
                             "2>/dev/null; sync")
    return uuid, kept


def reversed_replica(store, uuid, timeout=120):
    return wait_until(lambda: replica(store, uuid),
                      lambda r: r and r["host"] == "host1" and not r["pending"],
                      timeout=timeout, interval=0.2, what="a replica back on host1")


def test_after_an_ha_restart_the_replica_goes_back_with_only_the_blocks_that_differ(
        ha_kvm, store):
    """host1 dies with writes its replica never got; the guest runs on host2
    from the replica and writes more; host1 returns and keeps its stale disk
    aside.  The next update to host1 sends only the blocks that differ from
    that disk (what host2 wrote, and what host1 wrote after the last update,
    which must be undone), about 10 MiB of a 1 GiB disk holding 50 MiB; the
    replica it builds equals host2's disk, and the guest restarted from it on
    host1 has the data of both sides."""
    kvm = ha_kvm
    uuid, kept = failed_over_with_writes(kvm, store, "db")
    kvm.start_peer("host1")
    back = reversed_replica(store, uuid)
    assert back["kind"] == "delta", back
    written = (4 + 5 + 1) * MiB            # host1's lost writes, host2's, the marker's block
    print(f"\nreverse update: {back['bytes'] / MiB:.2f} MiB sent for {written / MiB:.0f} MiB "
          f"written since the replica's last update ({kept['bytes'] / MiB:.1f} MiB then)")
    assert back["bytes"] <= 1.1 * written, back
    assert not back["pending"]
    (disk,) = back["disks"]
    on_host2 = disk_sum(kvm, "host2", uuid)     # the guest writes nothing more
    asides = kvm.cluster.cli_json("aside", "list", "host1")
    assert [a["uuid"] for a in asides] == [uuid], "the disks kept aside stay untouched"
    assert not volume_paths(kvm, "host2", "backup-"), "scratch left on the source"
    assert sorted(volume_paths(kvm, "host1", "bk-")) == [disk["volume"]] or \
        replica(store, uuid)["seq"] > back["seq"], "volumes the record does not name"

    kvm.cluster.kill("host2")           # and back again: host1 restarts it from there
    wait_for(lambda: kvm.where(uuid).get("host1") == "running", timeout=120, interval=0.5,
             what="the guest running on host1 again")
    assert qemu_guest.wait_for_console(kvm.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT)
    assert read_marker(kvm, "host1", uuid, SECTOR_A) == "MARKER-A"
    assert read_marker(kvm, "host1", uuid, SECTOR_B) == "MARKER-C"
    assert disk_sum(kvm, "host1", uuid) == on_host2, "the promoted replica is not the disk"
    kvm.start_peer("host2")
    kvm.cluster.cli_json("replicate", "db", "--stop")
    kvm.cluster.cli_json("destroy", "db", "--yes", timeout=120)


def restart_whoever_died(kvm, pid):
    """Start again the peer (host or member) whose process ``pid`` was."""
    from tests.support.ha_kvm import start_member
    (name,) = [n for n, p in kvm.cluster.peers.items() if p.pid == pid]
    kvm.cluster.peers[name].wait(30)
    if name in ("host1", "host2"):
        kvm.start_peer(name)
    else:
        start_member(kvm, name)
    return name


def test_the_source_the_target_and_the_initiator_killed_mid_update_back_lose_nothing(
        ha_kvm, store):
    """The update back to host1 after a failover: the source's peer dies
    with the delta built, not sent; the initiator dies as it asks host1 to
    apply it; host1's peer dies with the base copied, not yet written.  Each
    is started again: the update completes once, as a delta, the disks kept
    aside are intact, nothing is left on either host that no record names,
    and the guest restarted from the replica has every marker."""
    kvm = ha_kvm
    uuid, _kept = failed_over_with_writes(kvm, store, "db")
    kvm.cluster.cli_json("ha", "db", "none")        # host2's peer may die: no fencing
    aside_before = None
    points = ["delta built", "append replica_apply", "delta base copied"]
    failpoints.arm(str(kvm.armed), points)
    kvm.start_peer("host1")
    restarted = []
    while len(restarted) < len(points):
        wait_for(lambda: len(failpoints.fired(str(kvm.armed))) > len(restarted), timeout=180,
                 what=f"the kill at {points[len(restarted)]!r}")
        point, pid, _when = failpoints.fired(str(kvm.armed))[len(restarted)]
        if aside_before is None:
            aside_before = sorted(volume_paths(kvm, "host1", "aside-"))
        restarted.append((point, restart_whoever_died(kvm, int(pid))))
    print(f"\nkilled and restarted: {restarted}")
    assert [p for p, _ in restarted] == points
    assert restarted[0][1] == "host2" and restarted[2][1] == "host1", restarted
    back = reversed_replica(store, uuid, timeout=180)
    assert back["kind"] == "delta", back
    assert back["bytes"] <= 1.1 * (4 + 5 + 1) * MiB, back
    on_host2 = disk_sum(kvm, "host2", uuid)
    assert sorted(volume_paths(kvm, "host1", "aside-")) == aside_before, "the aside changed"
    wait_for(lambda: not volume_paths(kvm, "host2", "backup-"), timeout=30,
             what="no scratch left on the source")
    now = replica(store, uuid)
    assert sorted(volume_paths(kvm, "host1", "bk-")) == sorted(
        d["volume"] for d in now["disks"]), "volumes on host1 that the record does not name"

    kvm.cluster.cli_json("ha", "db", "restart")
    kvm.cluster.kill("host2")
    wait_for(lambda: kvm.where(uuid).get("host1") == "running", timeout=120, interval=0.5,
             what="the guest running on host1 from the replica")
    assert qemu_guest.wait_for_console(kvm.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT)
    assert read_marker(kvm, "host1", uuid, SECTOR_A) == "MARKER-A"
    assert read_marker(kvm, "host1", uuid, SECTOR_B) == "MARKER-C"
    assert disk_sum(kvm, "host1", uuid) == on_host2
    kvm.start_peer("host2")
    kvm.cluster.cli_json("replicate", "db", "--stop")
    kvm.cluster.cli_json("destroy", "db", "--yes", timeout=120)


def test_a_base_map_too_large_for_etcd_crosses_between_pools_through_libvirt(
        guest_dir, tmp_path):
    """The map of a disk with 40,000 written blocks (2.4 GiB of data),
    whose JSON would overflow etcd's 1.5 MiB requests, written as a map
    file in one pool of the tier's libvirtd and copied into another as
    ``replica_take_delta`` reads it (``virStorageVolDownload``, sparse):
    it arrives whole, reads back the same, and what was sent is the pages
    its entries fill (the first half every other block, the second half
    contiguous), not the 6.1 MiB file with its holes."""
    count, limit = 40_000, int(1.5 * (1 << 20))
    blocks = {index * 2: hashlib.sha256(index.to_bytes(4, "little")).hexdigest()[:32]
              for index in range(count // 2)}
    blocks |= {index: hashlib.sha256(b"%d" % index).hexdigest()[:32]
               for index in range(200_000, 200_000 + count // 2)}
    length = 400_000 * blockmap.BLOCK                # 24 GiB, mostly never written
    assert len(json.dumps({str(i): h for i, h in blocks.items()})) > limit
    conn = libvirt.open(qemu_guest.QEMU_URI)
    pools = []
    try:
        for side in ("replica", "source"):
            (tmp_path / side).mkdir()
            pools.append(conn.storagePoolCreateXML(
                pool_xml(f"peerctl-mapvol-{side}-{os.getpid()}", str(tmp_path / side)), 0))
        theirs, ours = pools
        blockmap.write_map(blocks, length, str(tmp_path / "replica" / "bk-r1-vda.map"))
        theirs.refresh(0)
        sent, _checksum = copy_volume(conn, theirs.storageVolLookupByName("bk-r1-vda.map"),
                                      conn, ours, "backup-r1-vda.basemap")
        arrived = ours.storageVolLookupByName("backup-r1-vda.basemap").path()
        assert blockmap.read_map(arrived) == (blocks, length)
        print(f"\nmap of {count} blocks: {sent / 1024:.0f} KiB sent, "
              f"{os.path.getsize(arrived) / 1024:.0f} KiB long with holes")
        assert sent <= blockmap.DIGEST * (2 * count // 2 + count // 2) + 3 * 4096, sent
    finally:
        for pool in pools:
            pool.destroy()
        conn.close()
