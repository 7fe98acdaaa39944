"""The copy of a moving VM (``engine/hypervisor/moves/migration.py``) between two
real libvirtd on this machine (the ``libvirtd_pair`` fixture): ``migrate``
called directly with a source and a destination :class:`HostContext`, as
the ``move_migrate`` request runs it.

The guest is the tier's busybox Linux (direct kernel boot, TCG), with a
qcow2 data disk whose content is written before the move by ``qemu-io`` and
read back from the destination's volume after it: the destination's volume
starts blank (or as an overlay on its own copy of the base image), so what
is read there was copied.  That the guest never rebooted is read from its
consoles: the ready marker once, on the source's log; after the move the
destination's log shows the same running system answer the ACPI power
button, with no boot in between.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET

import libvirt
import pytest

from engine.core import keys, steps
from engine.errors import RequestError
from engine.hypervisor.storage import images
from engine.hypervisor.moves import checkpoints, migration
from engine.hypervisor.domain.domain_xml import (NAMESPACE, DomainSpec, domain_type, domain_xml,
                                        volume_xml)
from engine.hypervisor.host.hostctx import HostContext
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.host.vm import console_log_path
from tests.support import qemu_guest, wait_for
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

BOOT_TIMEOUT = 120.0
MiB = 1 << 20
DISK = 128 * MiB
MEMORY_MB = 128         # the Debian cloud kernel does not come up in 64 MiB


# -- fixtures ------------------------------------------------------------------

@pytest.fixture(scope="module")
def guest(libvirtd_pair):
    """kernel, initrd and cmdline of the busybox guest, in the pair's directory."""
    workdir = os.path.join(libvirtd_pair.dir, "guest")
    os.makedirs(workdir, mode=0o755, exist_ok=True)
    return qemu_guest.guest_args(qemu_guest.GUEST_DIR, workdir)


@pytest.fixture(scope="module")
def hosts(libvirtd_pair):
    """(source, destination): peer hosts on daemon 1 and daemon 2, no etcd."""
    pair = []
    for name, uri, remote in zip(("src", "dst"), libvirtd_pair.uris,
                                 libvirtd_pair.remote_uris):
        host = HostContext(f"{name}-{os.getpid()}", uri, None,
                           os.path.join(libvirtd_pair.dir, f"state-{name}"),
                           libvirt_remote=remote)
        images.ensure_pool(host)
        pair.append(host)
    return tuple(pair)


# -- helpers -------------------------------------------------------------------

def define(host, guest, uuid, disk_path) -> libvirt.virDomain:
    """The busybox guest with ``disk_path`` as its vda, defined (shut off)."""
    console = console_log_path(host, uuid)
    os.makedirs(os.path.dirname(console), exist_ok=True)
    spec = DomainSpec(uuid=uuid, name=f"mig-{uuid[:8]}", vcpus=1, memory_mb=MEMORY_MB,
                      disk_gb=0, domain_type=domain_type(host.conn.getType(),
                                                         qemu_guest.LINUX_ACCEL),
                      disk_path=disk_path, console_log=console, owner=host.host, **guest)
    return host.conn.defineXML(domain_xml(spec))


def blank_volume(host, uuid) -> libvirt.virStorageVol:
    return images.ensure_pool(host).createXML(volume_xml(f"{uuid}.qcow2", DISK, "qcow2"), 0)


def destination_xml(dom, dest, uuid, disk_path) -> str:
    """What ``move_prepare`` answers: the domain with the destination's disk,
    console log and owner."""
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    root.find("./devices/disk/source").set("file", disk_path)
    console = console_log_path(dest, uuid)
    os.makedirs(os.path.dirname(console), exist_ok=True)
    for log in root.findall("./devices/serial/log"):
        log.set("file", console)
    root.find(f"./metadata/{{{NAMESPACE}}}vm/{{{NAMESPACE}}}host").text = dest.host
    return ET.tostring(root, encoding="unicode")


def move_args(dom, dest, uuid, disk_path, **extra) -> dict:
    return {"uuid": uuid, "name": dom.name(), "destination": dest.host,
            "destination_uri": dest.remote_uri,
            "xml": destination_xml(dom, dest, uuid, disk_path), "disks": ["vda"],
            "incremental": False, "live": True, **extra}


def qemu_io(path: str, command: str, *options: str, check=True):
    done = subprocess.run(["qemu-io", *options, "-c", command, path],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 or not check, done.stdout + done.stderr
    return done


def holds_pattern(path: str, pattern: int, offset: int, length: int) -> bool:
    """The image at ``path`` (read-only, shared with a running QEMU) holds
    byte ``pattern`` over ``[offset, offset + length)``."""
    done = qemu_io(path, f"read -P {pattern:#x} {offset} {length}", "-r", "-U", "-f", "qcow2",
                   check=False)
    out = done.stdout + done.stderr
    if "Pattern verification failed" in out:
        return False
    assert done.returncode == 0 and f"read {length}/{length}" in out, out
    return True


def console(host, uuid) -> str:
    try:
        with open(console_log_path(host, uuid), errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def lookup(host, uuid):
    try:
        return host.conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as exc:
        assert exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN, exc
        return None


def boot_on_source(hosts, guest):
    """A running guest on the source whose disk holds 0x5a over 1-9 MiB."""
    source, _dest = hosts
    uuid = str(uuidlib.uuid4())
    disk = blank_volume(source, uuid).path()
    qemu_io(disk, f"write -P 0x5a {1 * MiB} {8 * MiB}", "-f", "qcow2")
    dom = define(source, guest, uuid, disk)
    dom.create()
    assert qemu_guest.wait_for_console(console_log_path(source, uuid),
                                       qemu_guest.READY_MARKER, BOOT_TIMEOUT), \
        f"guest not up on the source: {console(source, uuid)[-500:]!r}"
    return uuid, dom


def assert_runs_only_on_source(hosts, uuid):
    source, dest = hosts
    assert vm_state(lookup(source, uuid)) == "running"
    there = lookup(dest, uuid)
    assert there is None or not there.isActive(), "a copy runs on the destination"


# -- tests ---------------------------------------------------------------------

def test_a_running_guest_moves_live_with_its_disk_and_never_reboots(hosts, guest):
    source, dest = hosts
    uuid, dom = boot_on_source(hosts, guest)
    target = blank_volume(dest, uuid).path()
    args = move_args(dom, dest, uuid, target, max_downtime_ms=300)

    result = migration.migrate(source, args)
    print(f"\nlive move of a {MEMORY_MB} MiB guest with a {DISK // MiB} MiB disk: {result}")
    assert result["mode"] == "live"
    assert result["downtime_ms"] > 0 and result["seconds"] > 0
    assert result["memory_bytes"] > 0 and result["disk_bytes"] >= 8 * MiB
    assert result["bytes"] == result["memory_bytes"] + result["disk_bytes"]

    assert lookup(source, uuid) is None
    there = lookup(dest, uuid)
    assert vm_state(there) == "running" and there.isPersistent()
    defined = there.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    assert target in defined and f">{dest.host}<" in defined
    assert holds_pattern(target, 0x5a, 1 * MiB, 8 * MiB)
    assert not holds_pattern(target, 0x5a, 9 * MiB, 1 * MiB)

    # Run again (a retried request, after a run whose peer was killed during
    # the copy): the move is found done, nothing restarted.
    qemu_id = there.ID()
    again = migration.migrate(source, args)
    assert again["already"] is True and again["mode"] == "live"
    assert lookup(dest, uuid).ID() == qemu_id and vm_state(there) == "running"

    # The same system runs on: it answers the power button on the
    # destination's console, which never shows a boot.
    there.shutdown()
    assert qemu_guest.wait_for_console(console_log_path(dest, uuid), "power button",
                                       BOOT_TIMEOUT), console(dest, uuid)[-500:]
    assert qemu_guest.READY_MARKER not in console(dest, uuid)
    assert console(source, uuid).count(qemu_guest.READY_MARKER) == 1
    wait_for(lambda: vm_state(there) == "shutoff", timeout=30, what="guest off")


def test_a_shut_off_guest_moves_cold_on_an_image_both_hosts_have(hosts, guest,
                                                                 libvirtd_pair):
    """Incremental: each host has the base image; only the top layer moves.
    The guest never runs on the source; it is left defined and shut off on
    the destination, and starts there."""
    source, dest = hosts
    base = os.path.join(libvirtd_pair.dir, "guest", "base.raw")
    subprocess.run(["qemu-img", "create", "-f", "raw", base, str(64 * MiB)], check=True,
                   capture_output=True)
    qemu_io(base, f"write -P 0xa5 0 {1 * MiB}", "-f", "raw")
    uuid = str(uuidlib.uuid4())
    layers = {}
    for host in hosts:
        pool = images.ensure_pool(host)
        own = os.path.join(host.state_dir, "images", "base.raw")    # the default source
        os.makedirs(os.path.dirname(own), exist_ok=True)
        if os.path.exists(own):
            os.unlink(own)
        os.link(base, own)
        base_vol, fmt = images.ensure_base(host, pool, f"file://{own}")
        layers[host.host] = images.ensure_overlay(host, pool, f"{uuid}.qcow2", base_vol,
                                                  fmt, 0).path()
    qemu_io(layers[source.host], f"write -P 0x5a {8 * MiB} {4 * MiB}", "-f", "qcow2")
    dom = define(source, guest, uuid, layers[source.host])
    args = move_args(dom, dest, uuid, layers[dest.host], live=False, incremental=True)
    # As an earlier run left it that died right after starting it paused.
    dom.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)

    result = migration.migrate(source, args)
    print(f"\ncold incremental move: {result}")
    assert result["mode"] == "cold" and result["disk_bytes"] >= 4 * MiB

    assert lookup(source, uuid) is None
    there = lookup(dest, uuid)
    assert vm_state(there) == "shutoff" and there.isPersistent()
    assert holds_pattern(layers[dest.host], 0x5a, 8 * MiB, 4 * MiB)    # copied
    assert holds_pattern(layers[dest.host], 0xa5, 0, 1 * MiB)          # its own base
    assert console(source, uuid) == "", "the guest ran on the source"

    again = migration.migrate(source, args)
    assert again["already"] is True and vm_state(there) == "shutoff"

    there.create()
    assert qemu_guest.wait_for_console(console_log_path(dest, uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT), console(dest, uuid)[-500:]
    assert migration.migrate(source, args)["already"] is True
    assert vm_state(there) == "running", "a retried cold move must not stop the VM"
    there.destroy()


def test_aborts_leave_the_guest_running_on_the_source(hosts, guest, store):
    """Abort by request (a real etcd), a dead destination peer, a timeout:
    each stops the copy, the source runs on, the destination has no running
    copy; then the move succeeds."""
    source, dest = hosts
    uuid, dom = boot_on_source(hosts, guest)
    target = blank_volume(dest, uuid).path()
    slow = move_args(dom, dest, uuid, target, bandwidth_mib=1)

    # 1. abort by request, seen through steps.abort_requested
    automation, outcome = "mig" + uuidlib.uuid4().hex[:8], {}

    def step():
        with steps.running(store, automation, 3):
            try:
                outcome["result"] = migration.migrate(source, slow)
            except RequestError as exc:
                outcome["error"] = str(exc)

    runner = threading.Thread(target=step)
    runner.start()
    progress = wait_for(lambda: store.get(keys.progress(automation, 3)),
                        timeout=30, what="progress of the copy").value
    assert progress["phase"] in ("disk", "memory", "switch-over")
    assert 0 <= progress["percent"] <= 100
    asked = time.monotonic()
    store.put(keys.abort(automation), {"by": "test"})
    runner.join(60)
    assert not runner.is_alive()
    print(f"\nabort took effect in {time.monotonic() - asked:.2f} s")
    assert "aborted by request" in outcome.get("error", ""), outcome
    assert_runs_only_on_source(hosts, uuid)

    # 2. the destination's peer has no hosts/ key: gone
    watched = HostContext(source.host, source.libvirt_uri, store, source.state_dir)
    with pytest.raises(RequestError, match=f"destination peer {dest.host} is gone"):
        migration.migrate(watched, slow)
    assert_runs_only_on_source(hosts, uuid)

    # 3. a copy that cannot make it in time
    with pytest.raises(RequestError, match="did not complete within"):
        migration.migrate(source, {**slow, "timeout_per_gib": 4})
    assert_runs_only_on_source(hosts, uuid)

    # The guest ran through all of it, and moves now, by a job an earlier
    # run started before its caller died: the request watches it end and
    # finds the move done instead of starting another.
    args = move_args(dom, dest, uuid, target, bandwidth_mib=16)
    move = migration._Move(source, args)
    earlier = {}

    def earlier_run():
        try:
            dom.migrateToURI3(move.destination_uri, move.params(), move.flags())
        except libvirt.libvirtError as exc:
            earlier["error"] = exc

    runner = threading.Thread(target=earlier_run)
    runner.start()
    wait_for(lambda: migration._job_running(dom), timeout=30, what="the earlier run's job")
    result = migration.migrate(source, args)
    runner.join(60)
    assert result["already"] is True and result["mode"] == "live", result
    assert earlier == {}
    assert vm_state(lookup(dest, uuid)) == "running" and lookup(source, uuid) is None
    assert holds_pattern(target, 0x5a, 1 * MiB, 8 * MiB)
    assert console(source, uuid).count(qemu_guest.READY_MARKER) == 1
    lookup(dest, uuid).destroy()


def test_the_downtime_plan_starts_low_from_the_start_of_the_job_and_stays_under_the_ceiling(
        hosts, guest):
    """QEMU's limit is the plan's first value as soon as the job runs (set
    before it starts), it only rises while the job runs and never above
    ``max_downtime_ms``; the result's downtime is libvirt's own figure, as
    the destination's completed job statistics keep it."""
    source, dest = hosts
    uuid, dom = boot_on_source(hosts, guest)
    target = blank_volume(dest, uuid).path()
    args = move_args(dom, dest, uuid, target, max_downtime_ms=123, bandwidth_mib=32)
    outcome, limits = {}, []

    def move():
        outcome["result"] = migration.migrate(source, args)

    runner = threading.Thread(target=move)
    runner.start()
    try:
        wait_for(lambda: "result" in outcome or migration._job_running(dom), timeout=30,
                 what="the migration job")
        assert "result" not in outcome, "the move ended before its job could be seen"
        while runner.is_alive():
            try:
                limit = dom.migrateGetMaxDowntime(0)
            except libvirt.libvirtError:
                limit = None
            if limit is None:
                break           # the domain left with the job's end
            limits.append(limit)
            runner.join(0.05)   # sample every 50 ms until the move returns
    finally:
        runner.join(120)
    assert not runner.is_alive()
    assert limits[0] == migration.FIRST_DOWNTIME_MS, limits
    assert limits == sorted(limits) and limits[-1] <= 123, limits
    result = outcome["result"]
    there = lookup(dest, uuid)
    completed = there.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED
                               | libvirt.VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED)
    assert result["downtime_ms"] == completed["downtime"] > 0, (result, completed)
    there.destroy()


def test_the_downtime_plan_doubles_per_pass_that_did_not_converge_up_to_the_ceiling():
    first = migration.FIRST_DOWNTIME_MS
    idle = range(migration.PASSES_AT_FIRST + 1)
    assert [migration.downtime_limit(100, passes) for passes in idle] == [first] * len(idle)
    after = migration.PASSES_AT_FIRST
    assert [migration.downtime_limit(10_000, after + n) for n in (1, 2, 3)] == \
        [2 * first, 4 * first, 8 * first]
    assert migration.downtime_limit(100, after + 10) == 100
    assert migration.downtime_limit(10, 0) == 10        # a ceiling below the plan wins
    assert migration.downtime_limit(300, 10_000) == 300


def test_bad_requests_are_one_line_errors(hosts):
    source, dest = hosts
    base = {"uuid": str(uuidlib.uuid4()), "destination": dest.host,
            "destination_uri": dest.libvirt_uri, "xml": "<domain/>", "disks": ["vda"]}
    with pytest.raises(RequestError, match="neither on this host nor on"):
        migration.migrate(source, base)
    with pytest.raises(RequestError, match="cannot reach the hypervisor"):
        migration.migrate(source, {**base, "destination_uri":
                                   "qemu+unix:///system?socket=/nonexistent"})
    with pytest.raises(RequestError, match="own host"):
        migration.migrate(source, {**base, "destination": source.host})
    with pytest.raises(RequestError, match="bandwidth_mib"):
        migration.migrate(source, {**base, "bandwidth_mib": -1})
    with pytest.raises(RequestError, match="max_downtime_ms must be a whole number > 0"):
        migration.migrate(source, {**base, "max_downtime_ms": 2.5})


def test_checkpoints_cross_only_with_their_bitmaps(hosts, guest, libvirtd_pair):
    """libvirt carries no checkpoint: their definitions ride in the
    destination's XML for ``move_adopt``.  A destination QEMU killed before
    it stored its bitmaps leaves them missing, and no checkpoint is defined
    again without its bitmap (the next backup is full, saying so)."""
    source, dest = hosts
    uuid, dom = boot_on_source(hosts, guest)
    for name in ("peerctl-a", "peerctl-b"):
        dom.checkpointCreateXML(f"<domaincheckpoint><name>{name}</name><disks><disk "
                                "name='vda' checkpoint='bitmap'/></disks></domaincheckpoint>")
    target = blank_volume(dest, uuid).path()
    migration.migrate(source, move_args(dom, dest, uuid, target))
    there = lookup(dest, uuid)
    assert there.listAllCheckpoints(0) == []
    pidfile = os.path.join(libvirtd_pair.daemons[1].dir, "run", "qemu", f"{there.name()}.pid")
    with open(pidfile) as f:
        os.kill(int(f.read().strip()), 9)
    wait_for(lambda: not there.isActive(), timeout=30, what="the destination's QEMU gone")
    there.create()

    settled = checkpoints.settle(there)
    assert settled["carried"] == [] and set(settled["dropped"]) == {"peerctl-a", "peerctl-b"}
    assert all("missing or broken bitmap" in why for why in settled["dropped"].values()), \
        settled
    assert there.listAllCheckpoints(0) == []
    assert checkpoints.settle(there) is None, "the definitions are read once"
    there.destroy()


def test_no_checkpoint_crosses_from_a_disk_split_by_a_snapshot(hosts, guest):
    """After an external snapshot (a replica hand-off's) a checkpoint's
    writes are counted in two layers and QEMU carries the top's bitmap
    only: its definition does not go along, and the next backup is full."""
    source, dest = hosts
    uuid, dom = boot_on_source(hosts, guest)
    dom.checkpointCreateXML("<domaincheckpoint><name>peerctl-a</name><disks><disk name='vda' "
                            "checkpoint='bitmap'/></disks></domaincheckpoint>")
    top = os.path.join(os.path.dirname(blank_volume(source, f"{uuid}-x").path()),
                       f"{uuid}-top1.qcow2")
    dom.snapshotCreateXML(f"<domainsnapshot><disks><disk name='vda' snapshot='external'>"
                          f"<driver type='qcow2'/><source file='{top}'/></disk></disks>"
                          "</domainsnapshot>",
                          libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_DISK_ONLY
                          | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA)
    assert checkpoints.described(dom, ["vda"]) == []
    target = blank_volume(dest, uuid).path()
    migration.migrate(source, move_args(dom, dest, uuid, target))
    there = lookup(dest, uuid)
    assert checkpoints.settle(there) is None and there.listAllCheckpoints(0) == []
    there.destroy()
