"""The real-QEMU tier: guests on qemu:///system through the request handlers
and the VM publisher.

``.ci/libvirtd.sh`` installs what is missing (Debian packages only) and
starts virtlogd and libvirtd; the guest is a Debian cloud kernel with a
busybox initramfs, booted from a syslinux disk image that goes through the
image cache like any user image.  Skipped, saying why, where that has not
run (:func:`tests.support.qemu_guest.skip_reason`).
"""
from __future__ import annotations

import os
import shutil
import time
import uuid as uuidlib

import libvirt
import pytest

from engine.hypervisor.storage import images
from engine.hypervisor.host.vm import console_log_path
from engine.hypervisor.host.vmpublish import VmPublisher
from tests.support import qemu_guest
from tests.support.handlers import call, new_host
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

BOOT_TIMEOUT = 90.0


@pytest.fixture(scope="module")
def workdir():
    path = qemu_guest.world_readable_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def qemu_host(guest_dir, workdir):
    host = new_host(os.path.join(workdir, "state"), uri=qemu_guest.QEMU_URI,
                    name=f"qemu-{os.getpid()}")
    host.conn           # the first connection probes QEMU (several seconds)
    yield host
    # The pool (and the cached base image in it) belongs to this test host.
    try:
        pool = host.conn.storagePoolLookupByName(images.pool_name(host))
        for vol in pool.listAllVolumes(0):
            vol.delete(0)
        pool.destroy()
        pool.undefine()
    except libvirt.libvirtError:
        pass


def assert_nothing_left(host, uuid):
    with pytest.raises(libvirt.libvirtError):
        host.conn.lookupByUUIDString(uuid)
    pool = images.ensure_pool(host)
    pool.refresh(0)
    assert [v.name() for v in pool.listAllVolumes(0) if v.name().startswith(uuid)] == []
    assert not [f for f in os.listdir(os.path.join(host.state_dir, "pool"))
                if f.startswith(uuid)]


def test_kvm_guest_runs_and_destroy_leaves_nothing(qemu_host):
    """The default accelerator (KVM when /dev/kvm exists), a blank disk."""
    args = {"uuid": str(uuidlib.uuid4()), "name": f"kvm-{os.getpid()}", "vcpus": 1,
            "memory_mb": 64, "disk_gb": 1, "image": None}
    try:
        first = call(qemu_host, "build", **args)
        assert first["state"] == "running"
        assert call(qemu_host, "build", **args) == first
        dom = qemu_host.conn.lookupByUUIDString(args["uuid"])
        expected = "kvm" if os.path.exists("/dev/kvm") else "qemu"
        assert f"<domain type='{expected}'" in dom.XMLDesc(0)
        assert call(qemu_host, "suspend", uuid=args["uuid"])["state"] == "paused"
        assert call(qemu_host, "resume", uuid=args["uuid"])["state"] == "running"
    finally:
        destroyed = call(qemu_host, "destroy", uuid=args["uuid"])
    assert destroyed["volumes_deleted"] == [args["uuid"] + ".qcow2"]
    assert call(qemu_host, "destroy", uuid=args["uuid"])["volumes_deleted"] == []
    assert_nothing_left(qemu_host, args["uuid"])


def test_stop_destroys_a_guest_that_ignores_the_power_button(qemu_host):
    """A diskless guest has no OS (SeaBIOS finds nothing to boot), so nothing
    answers the ACPI power button: stop waits its timeout, then destroys."""
    args = {"uuid": str(uuidlib.uuid4()), "name": f"deaf-{os.getpid()}", "vcpus": 1,
            "memory_mb": 64, "disk_gb": 0, "image": None}
    try:
        assert call(qemu_host, "build", **args)["state"] == "running"
        started = time.monotonic()
        stopped = call(qemu_host, "stop", uuid=args["uuid"], timeout=2)
        waited = time.monotonic() - started
        assert stopped == {"uuid": args["uuid"], "state": "shutoff", "forced": True}
        assert waited >= 2.0, f"stopped after {waited:.1f}s: the guest did obey ACPI"
        dom = qemu_host.conn.lookupByUUIDString(args["uuid"])
        assert not dom.isActive() and dom.isPersistent(), "stop must not undefine"
        again = call(qemu_host, "stop", uuid=args["uuid"], timeout=2)
        assert again == {"uuid": args["uuid"], "state": "shutoff", "forced": False}
    finally:
        call(qemu_host, "destroy", uuid=args["uuid"])
    assert_nothing_left(qemu_host, args["uuid"])


def test_linux_guest_boots_from_a_cached_image_is_listed_stops_by_acpi_and_is_destroyed(
        qemu_host, guest_dir, workdir, store):
    images_dir = os.path.join(qemu_host.state_dir, "images")       # the default source
    os.makedirs(images_dir, exist_ok=True)
    image = qemu_guest.build_disk_image(os.path.join(images_dir, "guest.img"), guest_dir,
                                        workdir)
    args = {"uuid": str(uuidlib.uuid4()), "name": f"linux-{os.getpid()}", "vcpus": 1,
            "memory_mb": 128, "disk_gb": 1, "image": f"file://{image}",
            "accel": qemu_guest.LINUX_ACCEL}
    publisher = VmPublisher(store, qemu_host.host, qemu_host.conn)
    console = console_log_path(qemu_host, args["uuid"])
    try:
        assert call(qemu_host, "build", **args)["state"] == "running"
        assert qemu_guest.wait_for_console(console, qemu_guest.READY_MARKER, BOOT_TIMEOUT), \
            "guest did not come up; console:\n" + open(console, errors="replace").read()

        # The record its build writes (this host's handlers write no etcd),
        # wrong behind the publisher's back: the publisher sets it right.
        store.put(f"vms/{qemu_host.host}/{args['uuid']}", {
            "host": qemu_host.host, "name": args["name"], "uuid": args["uuid"],
            "state": "building", "want": "running"})
        publisher.reconcile()
        kvs, _ = store.range("vms/")
        assert [kv.value for kv in kvs] == [{
            "host": qemu_host.host, "name": args["name"], "uuid": args["uuid"],
            "state": "running", "vcpus": 1, "memory_mb": 128, "disk_gb": 1, "ha": "none",
            "want": "running"}]

        started = time.monotonic()
        stopped = call(qemu_host, "stop", uuid=args["uuid"], timeout=30)
        assert stopped["state"] == "shutoff"
        assert stopped["forced"] is False, "ACPI shutdown ignored: stop had to destroy"
        assert time.monotonic() - started < 30
        assert "power button" in open(console, errors="replace").read()
    finally:
        call(qemu_host, "destroy", uuid=args["uuid"])
    assert_nothing_left(qemu_host, args["uuid"])
    publisher.reconcile()       # a publisher never forgets a VM: destroy's own write does
    assert [kv.value["state"] for kv in store.range("vms/")[0]] == ["missing"]
