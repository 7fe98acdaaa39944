"""Two KVM hosts on this machine for the QEMU benchmarks: two private
libvirtd daemons (engine.hypervisor.local.daemons.PrivateLibvirtd), each a
machine of a rack in a box (engine.hypervisor.local.rack: a network
namespace of its own, libvirt on TLS at its address, migrations and copies
over TCP with TLS), a real etcd, a peerctl peer on each (host1, host2), and
the tier's busybox guest image.

    with two_qemu_hosts("peerctl-bbak-", "bbak") as hosts:
        hosts.cli_json("boot", ...)

Everything it started (peers and their guards, the daemons and their
guests, etcd, the work directory) is stopped and removed when the block
ends, on error too; a second Ctrl-C or SIGTERM does not cut that short.
It ends only processes it started, by PID.

Optional, for the benchmarks that take a peer away (bench/replica.py):
``peer_env`` goes to every peer's environment, and
:meth:`QemuHosts.kill` / :meth:`QemuHosts.start_peer` SIGKILL a host's peer
and start it again as it was started (the new process is stopped at the end
too).
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
from dataclasses import dataclass, field

from engine.core import api
from engine.core.etcd_server import EtcdServer
from engine.core.store import Store

from bench.bulk import wait
from bench.processes import cli_json, start_peer, stop_processes

__all__ = ["HOSTS", "QemuHosts", "two_qemu_hosts"]

HOSTS = ("host1", "host2")


@dataclass
class QemuHosts:
    work: str
    cluster: str
    etcd_url: str
    store: Store
    uris: dict          # host -> libvirt URI of its private daemon (its UNIX socket)
    remote_uris: dict   # host -> the same daemon over TCP and TLS, as other hosts reach it
    image: str          # the guest's bootable disk image (file)
    peers: dict = field(default_factory=dict)       # host -> its peer's process, the latest
    start: object = None                            # host -> a new peer process (start_peer)

    def cli_json(self, *args, timeout=300):
        return cli_json(self.etcd_url, self.cluster, *args, timeout=timeout)

    def console(self, host: str, uuid: str) -> str:
        return os.path.join(self.work, f"state-{host}", "console", f"{uuid}.log")

    def kill(self, host: str, signo=signal.SIGKILL) -> None:
        """Send ``signo`` to ``host``'s peer (its guard stays); a SIGKILL is
        waited for, so that the process is gone when this returns."""
        process = self.peers[host]
        if process.poll() is None:
            process.send_signal(signo)
            if signo == signal.SIGKILL:
                process.wait(30)

    def start_peer(self, host: str):
        """Start ``host``'s peer again, as it was started first."""
        if self.peers[host].poll() is None:
            raise RuntimeError(f"the peer of {host} is still running")
        self.peers[host] = self.start(host)
        return self.peers[host]


def _stop_guards(work: str) -> None:
    from tests.support.cluster import stop_guard
    for host in HOSTS:
        stop_guard(pathlib.Path(work) / f"state-{host}")


@contextlib.contextmanager
def two_qemu_hosts(prefix: str, cluster: str, peer_env: dict | None = None):
    import libvirt
    from engine.core import certs
    from engine.hypervisor.local.rack import Rack
    from engine.placement import open_placement
    from tests.support import qemu_guest
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

    work = qemu_guest.world_readable_tmpdir(prefix)
    daemons, peers, etcd = [], [], None
    rack = Rack(f"pcbench{os.getpid()}")
    try:
        rack.build(list(HOSTS))
        tls = os.path.join(work, "tls")
        certs.authority(tls, cluster)
        daemons = [rack.libvirtd(host, work, name, tls)
                   for host, name in zip(HOSTS, ("kvm1", "kvm2"))]
        for daemon in daemons:
            daemon.start()
        uris = dict(zip(HOSTS, (d.uri for d in daemons)))
        remote_uris = dict(zip(HOSTS, (d.tls_uri(d.tls[0]) for d in daemons)))
        image = qemu_guest.build_disk_image(os.path.join(work, "guest.img"),
                                            qemu_guest.GUEST_DIR, work)
        etcd = EtcdServer(os.path.join(work, "etcd")).start()
        store = Store(etcd.url, cluster)
        from tests.support.image_sources import allow_images
        allow_images(store, image)          # an image source of its own, listed

        def start(host):
            peers.append(start_peer(etcd.url, cluster, work, host, uris[host],
                                    remote=remote_uris[host],
                                    env={"PEERCTL_QEMU_ACCEL": qemu_guest.LINUX_ACCEL,
                                         **(peer_env or {})}))
            return peers[-1]
        started = {host: start(host) for host in HOSTS}
        wait(lambda: set(HOSTS) <= set(api.live_hosts(store)), timeout=60, interval=0.2)
        placement = open_placement("etcd", store)
        wait(lambda: set(HOSTS) <= {p["name"] for p in placement.providers()}, timeout=30,
             interval=0.2)
        yield QemuHosts(work, cluster, etcd.url, store, uris, remote_uris, image, started,
                        start)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_processes(peers)
        _stop_guards(work)
        for daemon in daemons:
            daemon.clear_guests()       # the guests go with their daemon
            daemon.stop()
        rack.delete(settle=5.0)
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
