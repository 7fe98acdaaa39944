"""Two KVM hosts on one machine: private libvirtd daemons (real-QEMU tier).

Each daemon (engine/hypervisor/daemons.py) has its own host UUID, socket,
state and virtlogd; libvirt migrates a running guest from one to the other
as between two machines.  The guest is diskless: the test kernel booted
directly with the busybox initramfs; the tests need it running, not booted
(Linux crawls through early boot on this project's CI machines), and use the
tier's accelerator (:data:`tests.support.qemu_guest.LINUX_ACCEL`).
"""
from __future__ import annotations

import os
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET

import libvirt
import pytest

from engine.hypervisor.domain_xml import DomainSpec, domain_type, domain_xml
from tests.support import qemu_guest, wait_for
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture: skips saying why)

LIVE_MOVE = (libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
             | libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE)


@pytest.fixture(scope="module")
def kernel(libvirtd_pair):
    """The guest's kernel, initrd and command line, where both QEMUs read them."""
    return qemu_guest.guest_args(qemu_guest.GUEST_DIR, libvirtd_pair.dir)


@pytest.fixture
def conns(libvirtd_pair):
    opened = [libvirt.open(uri) for uri in libvirtd_pair.uris]
    yield opened
    for conn in opened:
        conn.close()


def diskless_guest(conn, kernel, workdir: str, name: str):
    """A running 64 MiB guest with no disk, its serial console logged by the
    daemon's virtlogd into ``workdir``; the domain and the log's path."""
    spec = DomainSpec(uuid=str(uuidlib.uuid4()), name=name, vcpus=1, memory_mb=64,
                      disk_gb=0, domain_type=domain_type(conn.getType(), qemu_guest.LINUX_ACCEL),
                      console_log=os.path.join(workdir, f"{name}.console.log"), **kernel)
    return conn.createXML(domain_xml(spec), 0), spec.console_log


def host_uuid(conn) -> str:
    return ET.fromstring(conn.getCapabilities()).findtext("host/uuid")


def test_each_daemon_is_a_host_of_its_own_and_runs_a_guest(libvirtd_pair, conns, kernel):
    uuids = [host_uuid(conn) for conn in conns]
    assert uuids == [daemon.host_uuid for daemon in libvirtd_pair.daemons]
    assert uuids[0] != uuids[1]
    # start() again finds each daemon running from its directory: same PID
    pids = [daemon.record()["pid"] for daemon in libvirtd_pair.daemons]
    assert [daemon.start().record()["pid"] for daemon in libvirtd_pair.daemons] == pids
    for i, conn in enumerate(conns):
        dom, console = diskless_guest(conn, kernel, libvirtd_pair.dir, f"alone{i}")
        try:
            assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
            # QEMU never opens the log: its file is the daemon's virtlogd at work
            assert os.path.exists(console)
            assert [d.name() for d in conn.listAllDomains(0)] == [f"alone{i}"]
        finally:
            dom.destroy()


def test_a_running_guest_migrates_live_from_one_daemon_to_the_other(libvirtd_pair, conns,
                                                                     kernel):
    source, destination = conns
    dom, _console = diskless_guest(source, kernel, libvirtd_pair.dir, "mover")
    uuid = dom.UUIDString()
    target = libvirtd_pair.daemons[1]
    params = {libvirt.VIR_MIGRATE_PARAM_URI: f"unix://{target.migration_dir}/mover.sock"}
    started = time.monotonic()
    dom.migrateToURI3(target.uri, params, LIVE_MOVE)
    took = time.monotonic() - started
    moved = destination.lookupByUUIDString(uuid)
    try:
        assert moved.state()[0] == libvirt.VIR_DOMAIN_RUNNING
        assert moved.isPersistent()
        with pytest.raises(libvirt.libvirtError):
            source.lookupByUUIDString(uuid)
        assert source.listAllDomains(0) == []
        print(f"live migration of a 64 MiB diskless guest: {took:.2f} s")
    finally:
        moved.destroy()
        moved.undefine()
    wait_for(lambda: destination.listAllDomains(0) == [], timeout=10,
             what="the moved guest gone from the destination")
