"""A busybox guest booted by `boot` on a real peer of this machine's
libvirtd (``qemu:///system``), its shell up on the serial console: what the
console tests, of the command line and of the page, attach to."""
from __future__ import annotations

import contextlib
import os
import shutil

import libvirt

from engine.core import api
from engine.core.store import Store
from engine.placement import open_placement
from tests.support import qemu_guest, wait_for
from tests.support.cluster import Cluster
from tests.support.image_sources import allow_images

__all__ = ["BOOT_TIMEOUT", "booted_guest"]

BOOT_TIMEOUT = 120.0


@contextlib.contextmanager
def booted_guest(guest_dir, etcd_url: str, base, tag: str, peer_args=()):
    """``(cluster, name, host, uuid, console_log)`` of a running guest named
    ``<tag><pid>`` on peer ``q<tag[0]><pid>`` (unique: the libvirtd is
    shared), the peer started with ``peer_args`` too (``--api ...``);
    destroyed, and whatever it left in libvirtd removed, after."""
    workdir = qemu_guest.world_readable_tmpdir(f"peerctl-{tag}-")
    pid = os.getpid()
    host, name = f"q{tag[0]}{pid}", f"{tag}{pid}"
    cluster = Cluster(etcd_url, f"{tag}{pid}", base)
    conn = libvirt.open(qemu_guest.QEMU_URI)
    state_dir = os.path.join(workdir, f"state-{host}")
    try:
        image = qemu_guest.build_disk_image(os.path.join(workdir, "guest.img"), guest_dir,
                                            workdir)
        cluster.start_peer(host, libvirt=qemu_guest.QEMU_URI,
                           env={"PEERCTL_QEMU_ACCEL": qemu_guest.LINUX_ACCEL},
                           extra_args=["--state-dir", state_dir, *peer_args])
        store = Store(etcd_url, cluster.name)
        try:
            wait_for(lambda: host in api.live_hosts(store), timeout=60, interval=0.2,
                     what=f"{host} alive")
            placement = open_placement("etcd", store)
            wait_for(lambda: host in {p["name"] for p in placement.providers()},
                     timeout=30, interval=0.2, what=f"{host} registered as a provider")
            allow_images(store, image)      # an image source of its own, listed
        finally:
            store.close()
        booted = cluster.cli_json("boot", name, "--resources", "VCPU:1,MEMORY_MB:128,DISK_GB:1",
                                  "--image", f"file://{image}", "--network", "none",
                                  timeout=BOOT_TIMEOUT)
        assert booted["state"] == "done", booted
        (vm,) = booted["vms"]
        log = os.path.join(state_dir, "console", f"{vm['uuid']}.log")
        assert qemu_guest.wait_for_console(log, qemu_guest.READY_MARKER, BOOT_TIMEOUT), \
            "guest did not come up; console:\n" + (
                open(log, errors="replace").read() if os.path.exists(log) else "")
        yield cluster, name, host, vm["uuid"], log
    finally:
        cluster.cli("destroy", name, "--yes", timeout=60)
        cluster.close()
        qemu_guest.remove_leftovers(conn, [host], name)
        conn.close()
        shutil.rmtree(workdir, ignore_errors=True)
