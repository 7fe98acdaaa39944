"""A rack in a box, end to end (QEMU/KVM tier).

``up --libvirt qemu --tls --hosts 3`` makes three machines of one rack
(engine/hypervisor/local/rack.py): each host a network namespace with its
own address, its libvirtd on TLS there, its peer inside it reaching etcd
over the rack.  On it, as an administrator would on real machines:

- a real guest migrates live from host1 to host3 over TCP and TLS, and
  keeps what it wrote to its disk and its uptime;
- ``cluster verify`` names a migration port a firewall rule blocks inside
  host2's machine, and is clean again once the rule is gone;
- a fourth machine joins by token (``host add`` as etcd's root, ``join``
  inside the new machine) while the guest runs, and takes a migration;
- that host is removed with ``--evacuate``: the guest moves off it first.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import libvirt
import pytest

from engine import supervisor
from engine.hypervisor.local.daemons import delete_netns
from engine.hypervisor.local.localnet import ensure_rack_network
from engine.hypervisor.local.rack import Rack
from tests.support import PEERCTL, qemu_guest, wait_for
from tests.support.cluster import stop_guard
from tests.support.guest_disk import read_marker, write_marker
from tests.support.kvm import BOOT_TIMEOUT, Kvm
from tests.support.libvirtd_pair import cannot_run_reason

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

HOSTS = ("host1", "host2", "host3")
SECTOR = 2048


class Rack3:
    """The three machines ``up`` made, seen from this machine: the command
    line (run beside ``./state``, so it finds etcd and the operator's
    certificate by itself), each host's libvirt and console log; and the
    guest-side helpers of the tier's ``Kvm`` (its serial shell)."""

    shell = Kvm.shell
    console = Kvm.console
    boots_seen = Kvm.boots_seen

    def __init__(self, work: str, env: dict):
        self.work, self.env = work, env
        self.state_dir = os.path.join(work, "state")
        self.uri, self.state = {}, {}

    def run(self, *args, timeout=300, inside: str | None = None):
        prefix = ["ip", "netns", "exec", inside] if inside else []
        return subprocess.run([*prefix, sys.executable, PEERCTL, "--format", "json", *args],
                              capture_output=True, text=True, env=self.env, cwd=self.work,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def cli(self, *args, timeout=300, inside: str | None = None):
        done = self.run(*args, timeout=timeout, inside=inside)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        return json.loads(done.stdout)

    def know(self, host: str, uri: str, state: str) -> None:
        self.uri[host], self.state[host] = uri, state

    def where(self, uuid) -> dict:
        found = {}
        for host, uri in self.uri.items():
            conn = libvirt.open(uri)
            try:
                found[host] = conn.lookupByUUIDString(uuid).state()[0]
            except libvirt.libvirtError:
                pass
            finally:
                conn.close()
        return found

    def uptime(self, host, uuid) -> float:
        out = self.shell(host, uuid, "echo UP-$(cut -d' ' -f1 /proc/uptime)-UP")
        return float(out.rsplit("UP-", 1)[1].split("-UP")[0])


@pytest.fixture(scope="module")
def rack():
    why = qemu_guest.skip_reason() or cannot_run_reason()
    if why is not None:
        pytest.skip(why)
    work = qemu_guest.world_readable_tmpdir("peerctl-rack-")
    env = {**os.environ, "PEERCTL_CONF": os.devnull, "PYTHONUNBUFFERED": "1",
           "PEERCTL_CLUSTER": f"rack{os.getpid()}",
           "PEERCTL_QEMU_ACCEL": qemu_guest.LINUX_ACCEL}
    for name in ("PEERCTL_ETCD", "PEERCTL_CACERT", "PEERCTL_CERT", "PEERCTL_KEY"):
        env.pop(name, None)
    r = Rack3(work, env)
    extra = []          # what the test adds beyond `up`: (daemon, peer pid, state dir, netns)
    r.extra = extra
    try:
        up = r.cli("up", "--hosts", "3", "--libvirt", "qemu", "--tls", timeout=300)
        recorded = supervisor.read_up(r.state_dir)
        for peer, daemon in zip(recorded["peers"], recorded["daemons"]):
            r.know(peer["host"], daemon["uri"], os.path.join(r.state_dir, peer["host"]))
        r.up, r.recorded = up, recorded
        r.image = qemu_guest.build_disk_image(os.path.join(work, "guest.img"),
                                              qemu_guest.GUEST_DIR, work)
        tls = os.path.join(r.state_dir, "tls")
        r.root = [f"--{name}={os.path.join(tls, file)}"       # etcd's root, for the admin
                  for name, file in (("cacert", "ca.pem"), ("cert", "root.pem"),
                                     ("key", "root-key.pem"))]
        r.cli(*r.root, "images", "sources", "--add", work)
        yield r
    finally:
        for daemon, pid, state, netns in extra:
            if pid:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            stop_guard(pathlib.Path(state))
            daemon.clear_guests()
            daemon.stop()
            delete_netns(netns, settle=5.0)
        r.run("down", timeout=300)
        recorded = supervisor.read_up(r.state_dir)
        if recorded.get("netns"):           # what a failed `down` left
            Rack.from_record(recorded["netns"]).delete(settle=5.0)
        shutil.rmtree(work, ignore_errors=True)


def test_a_rack_moves_a_guest_over_tls_checks_its_ports_takes_a_joined_host_and_lets_it_go(
        rack):
    r = rack
    booted = r.cli("boot", "db", "--on", "host1", "--resources", "VCPU:1,MEMORY_MB:128,DISK_GB:1",
                   "--image", f"file://{r.image}", "--network", "none", timeout=BOOT_TIMEOUT)
    (vm,) = booted["vms"]
    uuid = vm["uuid"]
    assert booted["state"] == "done" and vm["host"] == "host1", booted
    assert qemu_guest.wait_for_console(r.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT), "the guest did not come up"
    write_marker(r, "host1", uuid, SECTOR, "RACK-MARKER")
    before = r.uptime("host1", uuid)

    # 1. live, from host1's machine to host3's, over TCP and TLS
    moved = r.cli("migrate", "db", "--to", "host3", "--yes", timeout=300)
    (move,) = moved["vms"]
    assert (moved["state"], move["mode"], move["host"]) == ("done", "live", "host3"), moved
    assert r.where(uuid) == {"host3": libvirt.VIR_DOMAIN_RUNNING}
    assert r.uptime("host3", uuid) > before, "the guest restarted"
    assert read_marker(r, "host3", uuid, SECTOR) == "RACK-MARKER"
    assert r.boots_seen("host3", uuid) == 0, "the guest booted again on host3"

    # 2. a firewall inside host2's machine: every other host is told
    netns2 = r.recorded["netns"]["name"] + "-host2"
    rule = ["INPUT", "-p", "tcp", "--dport", "49152:49215", "-j", "REJECT"]
    subprocess.run(["ip", "netns", "exec", netns2, "iptables", "-A", *rule], check=True)
    try:
        done = r.run("cluster", "verify")
        found = json.loads(done.stdout)["problems"]
        assert done.returncode == 1
        blocked = sorted(p["problem"] for p in found if p["check"] == "reach")
        assert len(blocked) == 2 and all("cannot reach host2's migration port" in line
                                         for line in blocked), found
    finally:
        subprocess.run(["ip", "netns", "exec", netns2, "iptables", "-D", *rule], check=True)
    found = json.loads(r.run("cluster", "verify").stdout)["problems"]
    assert [p["check"] for p in found] == ["etcd"], found    # one member: said, and only that

    # 3. a fourth machine joins by token while the guest runs
    rack_of_three = Rack.from_record(r.recorded["netns"])
    rack4 = rack_of_three.build([*rack_of_three.hosts, "host4"])
    tls = os.path.join(r.state_dir, "tls")
    daemon = rack4.libvirtd("host4", os.path.join(r.work, "host4"), "libvirtd", tls)
    r.extra.append([daemon, None, os.path.join(r.work, "host4", "state"), rack4.netns("host4")])
    daemon.start()
    ensure_rack_network(rack4, {"host1": r.uri["host1"], "host4": daemon.uri})
    gateway_etcd = r.up["etcd"][0].replace("127.0.0.1", rack4.gateway)
    added = r.cli("--etcd", gateway_etcd, *r.root, "host", "add", "host4",
                  "--address", rack4.address("host4"))
    joined = r.cli("join", added["token"], "--conf", os.path.join(r.work, "host4", "peerctl.conf"),
                   "--state-dir", os.path.join(r.work, "host4", "state"),
                   "--libvirt", daemon.uri, "--libvirt-remote", daemon.tls_uri(daemon.tls[0]),
                   inside=rack4.netns("host4"), timeout=300)
    r.extra[-1][1] = joined["peer"]["pid"]
    assert (joined["host"], joined["state"], joined["problems"]) == ("host4", "serving", []), \
        joined
    r.know("host4", daemon.uri, os.path.join(r.work, "host4", "state"))
    moved = r.cli("migrate", "db", "--to", "host4", "--yes", timeout=300)
    assert (moved["state"], moved["vms"][0]["host"]) == ("done", "host4"), moved
    assert read_marker(r, "host4", uuid, SECTOR) == "RACK-MARKER"

    # 4. host4 leaves the cluster: its guest first
    removed = r.cli(*r.root, "host", "remove", "host4", "--evacuate", "--yes", timeout=600)
    assert [(m["name"], m["from"]) for m in removed["moved"]] == [("db", "host4")], removed
    where = r.where(uuid)
    assert list(where.values()) == [libvirt.VIR_DOMAIN_RUNNING] and "host4" not in where, where
    assert "host4" not in [h["host"] for h in r.cli("hostlist")]
    (home,) = where
    assert read_marker(r, home, uuid, SECTOR) == "RACK-MARKER"
    assert r.boots_seen(home, uuid) == 0, f"the guest booted again on {home}"
    assert r.uptime(home, uuid) > before
    r.cli("destroy", "db", "--yes", timeout=120)
    wait_for(lambda: r.where(uuid) == {}, timeout=60, what="the guest gone")
