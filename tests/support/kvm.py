"""Two KVM hosts with real peers, for the QEMU tier's cluster tests: the
``kvm`` fixture.

Peers host1 and host2 run on the two private daemons of ``libvirtd_pair``
(two machines of a rack in a box: each reaches the other's libvirt over TCP
and TLS, its ``--libvirt-remote``; one guest network ``default`` with
DHCP), on a real etcd; ``kvm.boot(name)`` boots the tier's busybox guest on host1 from a disk
image through the image cache and waits for its ready marker; ``where``,
``volumes`` and ``assert_on`` read the hypervisors, pools and placement;
``shell`` runs a command in a guest through its serial console.

Import the fixtures into a test module::

    from tests.support.kvm import kvm  # noqa: F401  (a fixture)
    from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401
    from tests.support.qemu_guest import guest_dir  # noqa: F401
"""
from __future__ import annotations

import os
import shutil

import libvirt
import pytest

from engine.core import api, failpoints, keys
from engine.placement import open_placement
from tests.support import qemu_guest, wait_for
from tests.support.cluster import start_automation, stop_guard
from tests.support.image_sources import allow_images

__all__ = ["kvm", "Kvm", "BOOT_TIMEOUT", "HOSTS"]

BOOT_TIMEOUT = 120.0
HOSTS = ("host1", "host2")


@pytest.fixture
def kvm(cluster, store, libvirtd_pair, guest_dir):
    """Peers host1 and host2 on the two private daemons; ``kvm.boot(name)``
    boots the test guest on host1 and waits for its console."""
    kvm = Kvm(cluster, store, libvirtd_pair, guest_dir)
    yield kvm
    kvm.close()


class Kvm:
    def __init__(self, cluster, store, pair, guest_dir, peer_env=None, peer_args=(),
                 inside=()):
        """``peer_env``: host -> more environment for its peer (all hosts
        under ``"*"``); ``peer_args``: more arguments for every peer;
        ``inside``: the hosts whose peer runs inside its daemon's network
        namespace (it must reach etcd at an address of the rack: its
        ``PEERCTL_ETCD`` in ``peer_env``), as on a machine of its own."""
        self.cluster, self.store, self.pair = cluster, store, pair
        self.peer_env, self.peer_args = peer_env or {}, list(peer_args)
        self.inside = set(inside)
        self.work = qemu_guest.world_readable_tmpdir("peerctl-moves-")
        self.image = qemu_guest.build_disk_image(os.path.join(self.work, "guest.img"),
                                                 guest_dir, self.work)
        allow_images(store, self.image)     # an image source of its own, listed
        self.uri = dict(zip(HOSTS, pair.uris))
        self.remote_uri = dict(zip(HOSTS, pair.remote_uris))
        self.state = {h: os.path.join(self.work, f"state-{h}") for h in HOSTS}
        for host in HOSTS:
            self.start_peer(host)
        wait_for(lambda: set(HOSTS) <= set(api.live_hosts(store)), timeout=60,
                 interval=0.2, what="both peers alive")
        placement = open_placement("etcd", store)
        wait_for(lambda: set(HOSTS) <= {p["name"] for p in placement.providers()},
                 timeout=30, interval=0.2, what="both hosts registered")

    def close(self):
        """Stop the peers, then the guards they started (by recorded PID), clear the
        guests this test left on the module's daemons (a failed test's guest
        would otherwise be the next test's VM: its metadata names host1),
        drop the files."""
        from pathlib import Path
        for host in HOSTS:
            if host in self.cluster.peers:
                self.cluster.kill(host)     # first: a live peer starts its guard again
            stop_guard(Path(self.state[host]))
        for daemon in self.pair.daemons:
            daemon.clear_guests()
        shutil.rmtree(self.work, ignore_errors=True)

    def start_peer(self, host):
        self.cluster.start_peer(host, libvirt=self.uri[host],
                                env={"PEERCTL_QEMU_ACCEL": qemu_guest.LINUX_ACCEL,
                                     **self.peer_env.get("*", {}),
                                     **self.peer_env.get(host, {})},
                                extra_args=["--state-dir", self.state[host],
                                            "--libvirt-remote", self.remote_uri[host],
                                            *self.peer_args],
                                netns=self.pair.netns[HOSTS.index(host)]
                                if host in self.inside else None)

    def restart_the_dead(self, automation, members=(), armed=None):
        """Start again each peer that died: ``members`` (the cluster's own
        peers that lead, with the crash points ``armed``) and the two KVM
        hosts; the automation's task once it ended, else None."""
        for host in (*members, *HOSTS):
            if host not in self.cluster.peers or self.cluster.peers[host].poll() is None:
                continue
            if host in HOSTS:
                self.start_peer(host)
            else:
                self.cluster.start_peer(host, env={failpoints.ENV: armed} if armed else None)
        task = api.get_task(self.store, automation)
        return task if task["state"] in keys.TERMINAL_STATES else None

    def boot(self, name, *flags):
        booted = self.cluster.cli_json(
            "boot", name, "--on", "host1", "--resources", "VCPU:1,MEMORY_MB:128,DISK_GB:1",
            "--image", f"file://{self.image}", *flags, timeout=BOOT_TIMEOUT)
        (vm,) = booted["vms"]
        assert booted["state"] == "done" and vm["host"] == "host1", booted
        assert qemu_guest.wait_for_console(self.console("host1", vm["uuid"]),
                                           qemu_guest.READY_MARKER, BOOT_TIMEOUT), \
            "the guest did not come up"
        return vm

    def console(self, host, uuid):
        return os.path.join(self.state[host], "console", f"{uuid}.log")

    def boots_seen(self, host, uuid):
        try:
            with open(self.console(host, uuid), errors="replace") as f:
                return f.read().count(qemu_guest.READY_MARKER)
        except FileNotFoundError:
            return 0

    def where(self, uuid) -> dict:
        """host -> the domain's state on that host's hypervisor."""
        found = {}
        for host in HOSTS:
            conn = libvirt.open(self.uri[host])
            try:
                dom = conn.lookupByUUIDString(uuid)
                found[host] = {1: "running", 3: "paused", 5: "shutoff"}.get(
                    dom.state()[0], str(dom.state()[0]))
            except libvirt.libvirtError:
                pass
            finally:
                conn.close()
        return found

    def volumes(self, uuid) -> dict:
        found = {}
        for host in HOSTS:
            conn = libvirt.open(self.uri[host])
            try:
                pool = conn.storagePoolLookupByName(f"peerctl-{host}")
                pool.refresh(0)
                names = [v.name() for v in pool.listAllVolumes(0) if v.name().startswith(uuid)]
                if names:
                    found[host] = names
            except libvirt.libvirtError:
                pass
            finally:
                conn.close()
        return found

    def assert_on(self, uuid, host, state="running"):
        assert self.where(uuid) == {host: state}
        wait_for(lambda: list(self.volumes(uuid)) == [host], timeout=30, interval=0.5,
                 what=f"volumes of {uuid} on {host} only (have {self.volumes(uuid)})")
        placement = open_placement("etcd", self.store)
        names = {p["uuid"]: p["name"] for p in placement.providers()}
        held = {a["consumer"]: a["allocations"] for a in placement.all_allocations()
                if a["allocations"]}
        assert list(held) == [uuid], f"orphan or missing allocations: {held}"
        assert [names[rp] for rp in held[uuid]] == [host]
        assert self.store.range(keys.lock("vm/"))[0] == []

    def migrate(self, uuid, name, **args):
        return start_automation(self.store, "migrate", {
            "vms": [{"name": name, "uuid": uuid, "host": "host1", "state": "running"}],
            **args})

    def shell(self, host, uuid, command, timeout=120.0) -> str:
        """Run ``command`` in the guest's shell on its serial console (the
        test guest's respawned ``sh``) and give what it printed.  The end is
        a marker the typed line does not contain (the shell echoes it)."""
        self._typed = getattr(self, "_typed", 0) + 1
        path = self.console(host, uuid)
        start = os.path.getsize(path) if os.path.exists(path) else 0
        end = f"PEERCTL-DONE-{self._typed}"

        def printed():
            with open(path, errors="replace") as f:
                f.seek(start)
                text = f.read()
            return text if end in text else None
        conn = libvirt.open(self.uri[host])
        try:
            stream = conn.newStream(0)
            conn.lookupByUUIDString(uuid).openConsole(None, stream,
                                                      libvirt.VIR_DOMAIN_CONSOLE_FORCE)
            stream.send(f"{command}; echo PEERCTL-DONE-$(({self._typed}))\n".encode())
            try:
                text = wait_for(printed, timeout=timeout, interval=0.2,
                                what=f"{command!r} to finish in the guest")
            except AssertionError as exc:
                with open(path, errors="replace") as f:
                    raise AssertionError(f"{exc}; the console ends: {f.read()[-800:]!r}") \
                        from None
            stream.abort()
        finally:
            conn.close()
        return text[:text.rindex(end)]
