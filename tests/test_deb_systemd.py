"""The Debian package on a fresh bookworm host, under a real systemd.

A debootstrapped bookworm tree (tests/support/nspawn.py) is booted with
``systemd-nspawn -b``: systemd is the container's PID 1.  The .deb that
``packaging/deb/build`` makes from this tree is installed there with
``apt install ./peerctl_*.deb``; the host's peer runs as ``peerctl.service``
from /etc/peerctl/peerctl.conf alone and joins the suite's etcd on loopback
(the container shares the machine's network namespace).  Its hypervisor is
a private libvirtd serving libvirt's test driver, on this machine, its
socket bound into the container: its VMs outlive the peer as QEMU's do, so
the peer runs an HA guard.  A second host, ``spare``, is a peer on this
machine: it watches the upgrade and takes what HA restarts.

In one booted container per worker (the QEMU tier's, kept lean):
- the package installs with apt on a host with only Debian's packages, and
  the host is listed alive by ``peerctl hostlist`` (the time from ``apt
  install`` to that, and the package's size, are printed); systemd follows
  the peer itself (``MainPID``);
- a SIGKILLed peer is restarted by systemd (``Restart=on-failure``);
- ``systemctl stop`` is clean: the peer logs ``peer_stopped``, nothing is
  SIGKILLed, the unit ends ``inactive`` with result ``success``;
- ``systemctl restart`` with an HA VM: back within the lease, the VM keeps
  running where it was (same domain, no HA action), the guard the same;
  then ``systemctl stop``: the guard survives the stop and fences the VM
  before it runs anywhere else; HA then restarts it on ``spare``;
- an upgrade (``code add`` of a wheel, ``upgrade --to``): ``MainPID``
  follows the new release's process, no restart counted; a stop after it
  is clean: the unit's ExecStop signals the process systemd did not start
  and waits for it (systemd 252 would SIGKILL it at once);
- a tar.gz release (``git archive``, an sdist) unpacks on Debian's python3
  3.11.2, which has no tarfile filters.

Each test starts the unit again if one before it on the same worker left
it stopped, so that pytest-xdist may hand them to different workers (each
then boots its own container).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from urllib.parse import quote

import pytest

from engine.core import keys
from tests.support import ROOT, qemu_guest, wait_for, wait_until
from tests.support.cluster import Cluster
from tests.support.libvirtd_pair import cannot_run_reason
from tests.support.nspawn import Machine, why_not
from tests.support.releases import build_packages, build_release

pytestmark = pytest.mark.qemu

HOST = "debhost"
SPARE = "spare"
SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
BUILD = os.path.join(ROOT, "packaging", "deb", "build")


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    """The package, built once by its one command."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("deb")
    done = subprocess.run(["bash", BUILD, str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    path = done.stdout.strip().splitlines()[-1]
    assert os.path.basename(path).startswith("peerctl_") and path.endswith("_amd64.deb")
    return path


@pytest.fixture(scope="module")
def hypervisor():
    """A private libvirtd serving the test driver: ``(uri, connection,
    directory to bind)``; a connection stays open, or the test driver
    forgets its domains."""
    reason = cannot_run_reason()
    if reason:
        pytest.skip(reason)
    from engine.hypervisor.local.daemons import PrivateLibvirtd
    import libvirt
    base = qemu_guest.world_readable_tmpdir("peerctl-debd-")
    daemon = PrivateLibvirtd(base, "deb")
    try:
        daemon.start()
        uri = f"test+unix:///default?socket={quote(daemon.socket, safe='/')}"
        conn = libvirt.open(uri)
        yield uri, conn, base
        conn.close()
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


class Host:
    """The booted container, the package installed, its peer on."""

    def __init__(self, machine: Machine, cli: Cluster, conn):
        self.machine = machine
        self.cli = cli              # the command line on this machine: same etcd, cluster
        self.conn = conn            # the host's hypervisor, seen from this machine

    def sh(self, command: str, **kw) -> subprocess.CompletedProcess:
        return self.machine.run(command, **kw)

    def prop(self, name: str) -> str:
        return self.sh(f"systemctl show -P {name} peerctl.service").stdout.strip()

    def main_pid(self) -> int:
        return int(self.prop("MainPID"))

    def journal(self, lines: int = 40) -> str:
        return self.sh(f"journalctl -u peerctl.service --no-pager -o cat -n {lines}",
                       check=False).stdout

    def journal_since(self, cursor: str) -> str:
        return self.sh(f"journalctl -u peerctl.service --no-pager -o cat "
                       f"--after-cursor={shlex.quote(cursor)}", check=False).stdout

    def cursor(self) -> str:
        out = self.sh("journalctl -u peerctl.service -n 0 --show-cursor --no-pager",
                      check=False).stdout
        return out.strip().rsplit("cursor: ", 1)[-1]

    def alive(self) -> bool:
        done = self.sh("peerctl --format json hostlist", check=False, timeout=60)
        rows = json.loads(done.stdout) if done.returncode == 0 else []
        return any(h["host"] == HOST and h["alive"] for h in rows)

    def start(self) -> None:
        self.sh("systemctl start peerctl.service", timeout=120)
        wait_for(self.alive, timeout=90, interval=0.5, what=f"{HOST} listed alive")

    def ensure_serving(self) -> None:
        """Started again if a test before (on this worker) left it stopped."""
        if self.prop("ActiveState") != "active":
            self.start()

    def guard_pid(self) -> int | None:
        """The guard's PID inside the container, while it runs."""
        done = self.sh(f"cat /var/lib/peerctl/{self.cli.name}/guard/pid", check=False)
        try:
            pid = int(json.loads(done.stdout))
        except (ValueError, TypeError):
            return None
        return pid if self.sh(f"kill -0 {pid}", check=False).returncode == 0 else None

    def running_domains(self) -> dict[str, int]:
        """The hypervisor's running domains: ``{name: libvirt id}``."""
        return {d.name(): d.ID() for d in self.conn.listAllDomains() if d.isActive()}

    def vms(self) -> dict[str, dict]:
        return {vm["name"]: vm for vm in self.cli.cli_json("vmlist")}


@pytest.fixture(scope="module")
def host(etcd, deb, hypervisor, tmp_path_factory):
    uri, conn, base = hypervisor
    cli = Cluster(etcd.url, "deb" + uuid.uuid4().hex[:8], tmp_path_factory.mktemp("cli"))
    cli.start_peer(SPARE, ttl=5)
    try:
        with Machine(binds=(base,)) as machine:
            h = Host(machine, cli, conn)
            machine.copy_in(deb, "/root/" + os.path.basename(deb))
            began = time.monotonic()
            h.sh("apt-get install -y -q --no-install-recommends "
                 + shlex.quote("/root/" + os.path.basename(deb)), timeout=300)
            installed = time.monotonic()
            # the conffile, edited as an administrator would
            h.sh("cat > /etc/peerctl/peerctl.conf", input=(
                "[peerctl]\n"
                f"etcd = {etcd.url}\n"
                f"cluster = {cli.name}\n"
                f"host = {HOST}\n"
                f"libvirt = {uri}\n"
                "ttl = 5\n"))
            h.sh("systemctl enable --now peerctl.service", timeout=120)
            wait_for(h.alive, timeout=90, interval=0.5, what=f"{HOST} listed alive")
            up = time.monotonic()
            print(f"\n.deb: {os.path.getsize(deb) / 2**20:.1f} MiB; apt install "
                  f"{installed - began:.1f} s; from apt install to {HOST} listed alive "
                  f"{up - began:.1f} s")
            yield h
    finally:
        cli.close()


def test_the_build_refuses_bad_arguments(tmp_path):
    done = subprocess.run(["bash", BUILD, str(tmp_path / "out"), "more"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.splitlines() == \
        ["usage: packaging/deb/build [OUTDIR]"], done
    assert not (tmp_path / "out").exists()


def test_the_package_installs_and_its_peer_runs_under_systemd(host):
    assert host.sh("readlink /proc/1/exe").stdout.strip().endswith("systemd")
    assert host.prop("ActiveState") == "active"
    assert host.sh("dpkg-query -W -f='${Conffiles}' peerctl").stdout.split()[0] \
        == "/etc/peerctl/peerctl.conf"
    assert host.sh("test -d /var/lib/peerctl/" + host.cli.name).returncode == 0
    pid = host.main_pid()
    command = host.sh(f"cat /proc/{pid}/cmdline").stdout.split("\0")
    assert command[:1] == ["/usr/bin/python3"] and "peer" in command, command
    assert host.guard_pid() is not None            # a hypervisor whose VMs outlive it


def test_a_killed_peer_is_restarted_by_systemd(host):
    host.ensure_serving()
    before = host.main_pid()
    restarts = int(host.prop("NRestarts"))
    os.kill(host.machine.host_pid(before), signal.SIGKILL)
    after = wait_until(host.main_pid, lambda pid: pid not in (0, before), timeout=60,
                       interval=0.2, what="a new main process")
    wait_for(lambda: host.prop("ActiveState") == "active", timeout=90, interval=0.5,
             what="the unit active again")
    assert int(host.prop("NRestarts")) == restarts + 1
    assert host.main_pid() == after
    wait_for(host.alive, timeout=90, interval=0.5, what=f"{HOST} listed alive again")


def assert_stopped_cleanly(host, pid: int, cursor: str) -> None:
    """The peer ``pid`` stopped on SIGTERM, itself: nothing SIGKILLed."""
    said = host.journal_since(cursor)
    assert host.prop("ActiveState") == "inactive", said
    assert host.prop("Result") == "success", said
    assert "peer_stopped" in said and "SIGKILL" not in said, said
    assert host.sh(f"test -e /proc/{pid}", check=False).returncode != 0
    peers = [line for line in host.sh("ps -eo args=").stdout.splitlines()
             if "peerctl" in line and line.rstrip().endswith(" peer")]
    assert peers == [], peers


def test_systemctl_stop_is_clean(host):
    host.ensure_serving()
    pid = host.main_pid()
    assert host.prop("ActiveState") == "active" and pid > 1
    cursor = host.cursor()
    began = time.monotonic()
    host.sh("systemctl stop peerctl.service", timeout=200)
    print(f"\nsystemctl stop: {time.monotonic() - began:.1f} s")
    assert_stopped_cleanly(host, pid, cursor)
    host.start()


def test_an_ha_vm_through_systemctl_restart_then_stop(host):
    """A restart within the lease: the HA VM runs on where it was, no HA
    action.  A stop: the guard survives it and fences the VM before it runs
    anywhere else; HA then restarts it on the spare host."""
    host.ensure_serving()
    booted = host.cli.cli_json("boot", "ha1", "--ha", "restart", "--network", "none",
                               "--on", HOST, "--resources", SMALL)
    assert booted["state"] == "done", booted
    running = host.running_domains()
    assert "ha1" in running, running
    guard = host.guard_pid()
    before = host.main_pid()
    host.sh("systemctl restart peerctl.service", timeout=200)
    wait_for(host.alive, timeout=90, interval=0.5, what=f"{HOST} listed alive again")
    assert host.main_pid() not in (0, before)
    assert host.running_domains() == running        # the same domain, never stopped
    vm = host.vms()["ha1"]
    assert (vm["host"], vm["state"]) == (HOST, "running"), vm
    assert not vm.get("recovered"), vm
    assert host.cli.store.get(keys.recovery(HOST)) is None     # no HA action
    assert host.guard_pid() == guard                 # the same guard, still guarding

    pid = host.main_pid()
    cursor = host.cursor()
    host.sh("systemctl stop peerctl.service", timeout=200)
    assert_stopped_cleanly(host, pid, cursor)
    assert host.guard_pid() == guard, "the guard went with the peer"

    def moved():
        vm = host.vms().get("ha1", {})
        if vm.get("host") == SPARE and vm.get("state") == "running":
            # never two copies: the guard fenced it here before HA started it there
            assert "ha1" not in host.running_domains(), "ha1 runs on both hosts"
            return True
        return False
    wait_for(moved, timeout=120, interval=0.5, what="ha1 restarted on spare")
    host.start()


def test_a_source_archive_is_a_release_on_debians_python(host, tmp_path):
    """``code add`` of a ``git archive``-style tar.gz, by the package's
    ``peerctl`` on Debian's python3 (3.11.2)."""
    archive = build_release(tmp_path, "0.2.1")
    host.machine.copy_in(archive, "/root/peerctl-0.2.1.tar.gz")
    done = host.sh("peerctl --format json code add /root/peerctl-0.2.1.tar.gz", check=False,
                   timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version"] == "0.2.1"


def test_an_upgrade_hands_the_unit_to_the_new_process(host, tmp_path):
    """``code add`` of a wheel, then ``upgrade --to``: the new release's
    process tells systemd ``MAINPID=`` itself; the unit follows it, and no
    restart is counted; a stop then stops that process cleanly."""
    host.ensure_serving()
    before = host.main_pid()
    restarts = host.prop("NRestarts")
    release = build_packages(tmp_path, "0.2.0")["wheel"]
    assert host.cli.cli_json("code", "add", release)["version"] == "0.2.0"
    ran = host.cli.cli("--format", "json", "upgrade", "--to", "0.2.0", HOST, "--yes",
                       timeout=300)
    assert ran.returncode == 0, (ran.stdout, ran.stderr, host.journal(30))
    done = json.loads(ran.stdout)
    assert [(h["host"], h["state"]) for h in done["hosts"]] == [(HOST, "upgraded")], done
    after = wait_until(host.main_pid, lambda pid: pid not in (0, before), timeout=60,
                       interval=0.2, what="MainPID to follow the new process")
    command = host.sh(f"cat /proc/{after}/cmdline").stdout.split("\0")
    assert any(part.endswith("/releases/0.2.0/peerctl.py") for part in command), command
    assert host.prop("ActiveState") == "active"
    assert host.prop("NRestarts") == restarts           # followed, not restarted
    assert host.sh(f"test -e /proc/{before}", check=False).returncode != 0
    rows = host.cli.cli_json("hostlist", HOST)
    assert rows[0]["alive"] and rows[0]["version"].startswith("0.2.0"), rows

    cursor = host.cursor()
    host.sh("systemctl stop peerctl.service", timeout=200)
    assert "SIGKILL" not in host.journal_since(cursor)
    assert_stopped_cleanly(host, after, cursor)
