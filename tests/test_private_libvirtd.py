"""Two KVM hosts on one machine: private libvirtd daemons (real-QEMU tier).

Each daemon (engine/hypervisor/local/daemons.py) has its own host UUID, socket,
state and virtlogd; libvirt migrates a running guest from one to the other
as between two machines.  The guest is diskless: the test kernel booted
directly with the busybox initramfs; the tests need it running, not booted
(Linux crawls through early boot on this project's CI machines), and use the
tier's accelerator (:data:`tests.support.qemu_guest.LINUX_ACCEL`).
"""
from __future__ import annotations

import json
import os
import shutil
import ipaddress
import subprocess
import sys
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET

import libvirt
import pytest

from engine import supervisor
from engine.hypervisor.local.daemons import PrivateLibvirtd, netns_exists, netns_pids
from engine.hypervisor.local.rack import Rack
from engine.hypervisor.domain.domain_xml import DomainSpec, domain_type, domain_xml
from tests.support import PEERCTL, qemu_guest, wait_for
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

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


def test_a_running_guest_migrates_live_over_tls_from_one_host_to_the_other(libvirtd_pair, conns,
                                                                     kernel):
    source, destination = conns
    dom, _console = diskless_guest(source, kernel, libvirtd_pair.dir, "mover")
    uuid = dom.UUIDString()
    # as between machines: libvirt over TLS to the other's address, QEMU's
    # stream over TCP with TLS to the port it listens on there
    started = time.monotonic()
    dom.migrateToURI3(libvirtd_pair.remote_uris[1], {}, LIVE_MOVE | libvirt.VIR_MIGRATE_TLS)
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


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return bool(f.read())           # a zombie has an empty command line
    except OSError:
        return False


def test_up_gives_each_host_a_private_daemon_and_down_stops_them(libvirtd_pair, kernel,
                                                                 cluster_name):
    """`up --libvirt qemu`: a daemon per host in the cluster's network
    namespace, each peer on its own.  `down --keep-guests` stops peers,
    guards and daemons; a guest left running keeps running, with its
    daemon's virtlogd, the network's dnsmasq and so the namespace, all
    listed as kept, and the next `up` takes it up again.  A plain `down`
    powers off a guest that does not shut down in time, and everything
    goes, the namespace too."""
    state = qemu_guest.world_readable_tmpdir("peerctl-up-")   # short: socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCTL_")}
    env.update(PEERCTL_CLUSTER=cluster_name, PEERCTL_CONF=os.devnull,
               PYTHONUNBUFFERED="1")

    def cli(*args):
        done = subprocess.run([sys.executable, PEERCTL, "--format", "json", *args],
                              capture_output=True, text=True, env=env, cwd=state,
                              timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def up():
        return cli("up", "--hosts", "2", "--libvirt", "qemu", "--state-dir", state)

    def down(*flags):
        doc = cli("down", "--state-dir", state, *flags)
        return {s["name"]: s["what"] for s in doc["stopped"]}, doc["kept"]

    namespace = supervisor.netns_name(cluster_name)
    try:
        started = time.monotonic()
        first = up()
        took = time.monotonic() - started
        peers = first["peers"]
        assert [(p["host"], p["libvirt"]) for p in peers] == [("host1", "qemu"), ("host2", "qemu")]
        recorded = supervisor.read_up(state)
        assert recorded["config"] == {"hosts": 2, "libvirt": "qemu"}
        daemons = recorded["daemons"]
        assert [d["host"] for d in daemons] == ["host1", "host2"]
        assert [p["libvirt_uri"] for p in peers] == [d["uri"] for d in daemons]
        assert all(d["dir"] == os.path.join(state, d["host"], "libvirtd") for d in daemons)
        rack = recorded["netns"]
        assert (rack["name"], rack["created"], rack["hosts"]) == \
            (namespace, True, ["host1", "host2"])
        addresses = [str(ipaddress.ip_network(rack["subnet"])[11 + i]) for i in range(2)]
        for i, daemon in enumerate(daemons):      # each host a machine of its own
            assert daemon["pid"] in netns_pids(f"{namespace}-host{i + 1}")
            assert daemon["pid"] not in netns_pids(f"{namespace}-host{2 - i}")
        conns = [libvirt.open(d["uri"]) for d in daemons]
        assert host_uuid(conns[0]) != host_uuid(conns[1])
        assert [(p["name"], p["role"]) for p in first["processes"]] == \
            [("etcd", "etcd"), ("host1/libvirtd", "libvirtd"), ("host1/virtlogd", "virtlogd"),
             ("host2/libvirtd", "libvirtd"), ("host2/virtlogd", "virtlogd"),
             ("host1", "peer"), ("host2", "peer")]
        hosts = cli("--etcd", first["etcd"][0], "hostlist", "-o",
                    "host,alive,hypervisor,libvirt_remote")
        assert [(h["host"], h["alive"], h["hypervisor"].split()[0]) for h in hosts] == \
            [("host1", True, "QEMU"), ("host2", True, "QEMU")]
        # the other hosts reach each daemon over TCP and TLS at its address
        assert [h["libvirt_remote"].split("?")[0] for h in hosts] == \
            [f"qemu+tls://{address}:16514/system" for address in addresses]
        for h in hosts:
            remote = libvirt.open(h["libvirt_remote"])
            try:
                assert host_uuid(remote) == host_uuid(conns[int(h["host"][-1]) - 1])
            finally:
                remote.close()
        print(f"up --hosts 2 --libvirt qemu: {took:.1f} s")
        # again: everything is found running, nothing started
        assert not any(p["started"] for p in up()["peers"])
        assert [d["pid"] for d in supervisor.read_up(state)["daemons"]] == \
            [d["pid"] for d in daemons]

        # down --keep-guests with a guest running on host1
        dom, _console = diskless_guest(conns[0], kernel, state, "stays")
        qemu = PrivateLibvirtd.from_record(daemons[0]).guest_pids()["stays"]
        for conn in conns:
            conn.close()
        what, kept = down("--keep-guests")
        assert list(what) == ["host1", "host2", "etcd", "host1/guard", "host2/guard",
                              "host1/stays", "host1/dnsmasq", "host1/libvirtd",
                              "host1/virtlogd", "host2/libvirtd", "host2/virtlogd",
                              f"netns {namespace}-host1", f"netns {namespace}-host2",
                              f"netns {namespace}"]
        assert [(k["name"], k["role"], k["pid"]) for k in kept] == \
            [("host1/stays", "guest", qemu),
             ("host1/dnsmasq", "dnsmasq", kept[1]["pid"]),
             ("host1/virtlogd", "virtlogd", daemons[0]["virtlogd"]["pid"]),
             (f"netns {namespace}-host1", "netns", None),
             (f"netns {namespace}", "netns", None)]
        assert what[f"netns {namespace}-host2"] == "deleted"
        assert all(running(k["pid"]) for k in kept[:3])
        assert all(w in ("stopped", "killed", "deleted") for n, w in what.items()
                   if n not in {k["name"] for k in kept}), what
        pids = [p["pid"] for p in peers] + [d["pid"] for d in daemons] \
            + [daemons[1]["virtlogd"]["pid"]]
        assert not any(running(pid) for pid in pids)
        assert PrivateLibvirtd.from_record(daemons[0]).guests() == ["stays"]
        assert netns_exists(namespace) and supervisor.read_up(state)["netns"]["deleted"] is False

        # up brings the daemons back, and host1's takes its guest up again
        assert all(p["started"] for p in up()["peers"])
        again = supervisor.read_up(state)["daemons"]
        assert again[0]["virtlogd"]["pid"] == daemons[0]["virtlogd"]["pid"]
        conn = libvirt.open(again[0]["uri"])
        try:
            assert conn.lookupByName("stays").state()[0] == libvirt.VIR_DOMAIN_RUNNING
        finally:
            conn.close()

        # down: the guest, still in early boot, cannot hear the power button
        # in time and is powered off; everything goes, the namespace too
        what, kept = down("--guest-timeout", "1")
        assert what.pop("host1/stays") == "powered off" and kept == []
        assert all(w in ("stopped", "killed", "deleted") for w in what.values()), what
        pids = [d["pid"] for d in again] + [d["virtlogd"]["pid"] for d in again] + [qemu]
        assert not any(running(pid) for pid in pids)
        assert not netns_exists(namespace)
        assert supervisor.read_up(state)["netns"]["deleted"] is True
    finally:
        subprocess.run([sys.executable, PEERCTL, "down", "--state-dir", state],
                       capture_output=True, env=env, cwd=state, timeout=120)
        for record in supervisor.read_up(state).get("daemons") or []:
            daemon = PrivateLibvirtd.from_record(record)
            if daemon.guests():         # a failure above left one: destroy it
                _destroy_all(daemon.start())
                daemon.stop()
        if supervisor.read_up(state).get("netns", {}).get("created"):
            Rack.from_record(supervisor.read_up(state)["netns"]).delete()
        shutil.rmtree(state, ignore_errors=True)


def _destroy_all(daemon) -> None:
    conn = libvirt.open(daemon.uri)
    try:
        for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            dom.destroy()
    finally:
        conn.close()
