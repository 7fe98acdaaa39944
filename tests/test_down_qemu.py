"""`down` after `up --libvirt qemu` leaves nothing running, and `up` again
uses what the directory was set up with (QEMU/KVM tier).

A real cluster of two KVM hosts on private daemons, as a user makes it;
an HA guest booted on host1 and moved live to host2.  `down` is SIGKILLed
right after asking the guests to shut down, and run again: it finishes.
Then no process `up` started runs (checked by every PID known, and by
scanning /proc for the state directory in command lines), the guest
powered off through its ACPI button, the namespace and its bridge are gone.
`up` with no flags brings back two QEMU hosts and nothing else; once more,
it starts nothing; another hypervisor is refused.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from engine import supervisor
from engine.hypervisor.local.daemons import PrivateLibvirtd, delete_netns, netns_exists
from engine.hypervisor.local.localnet import DEFAULT_BRIDGE
from tests.support import PEERCTL, qemu_guest
from tests.support.kvm import BOOT_TIMEOUT
from tests.support.libvirtd_pair import cannot_run_reason
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`


def running(pid) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return bool(f.read())           # a zombie has an empty command line
    except (OSError, TypeError):
        return False


def naming(path: str) -> dict[int, str]:
    """The processes whose command line names ``path``: {pid: command}."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if path.encode() in command:
            found[int(entry)] = command.replace(b"\0", b" ").decode(errors="replace")
    return found


class Local:
    """The command line, run where a user runs it, on one state directory."""

    def __init__(self, state: str, cluster: str):
        self.state = state
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCTL_")}
        self.env.update(PEERCTL_CLUSTER=cluster, PEERCTL_CONF=os.devnull,
                        PYTHONUNBUFFERED="1", PEERCTL_QEMU_ACCEL=qemu_guest.LINUX_ACCEL)

    def run(self, *args, env=None, timeout=300):
        return subprocess.run([sys.executable, PEERCTL, *args], capture_output=True,
                              text=True, env={**self.env, **(env or {})}, cwd=self.state,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def json(self, *args, **kwargs):
        done = self.run("--format", "json", *args, **kwargs)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def up(self, *args) -> dict:
        """``up`` on the state directory; later commands reach its etcd
        (wherever it listens: 2379 only when no other cluster of this
        machine holds it, and tests run side by side)."""
        doc = self.json("up", "--state-dir", self.state, *args)
        self.env["PEERCTL_ETCD"] = ",".join(doc["etcd"])
        return doc


@pytest.fixture
def local(guest_dir, cluster_name):  # noqa: F811
    why = cannot_run_reason()
    if why is not None:
        pytest.skip(why)
    state = qemu_guest.world_readable_tmpdir("pc-down-")     # short: socket paths
    local = Local(state, cluster_name)
    local.image = qemu_guest.build_disk_image(os.path.join(state, "guest.img"), guest_dir,
                                              state)
    yield local
    local.run("down", "--state-dir", state, "--guest-timeout", "1")
    up = supervisor.read_up(state)
    for record in up.get("daemons") or []:      # what a failure above left
        daemon = PrivateLibvirtd.from_record(record)
        if daemon.guests():
            daemon.start().clear_guests()
            daemon.stop()
    if (up.get("netns") or {}).get("created"):
        delete_netns(up["netns"]["name"])
    shutil.rmtree(state, ignore_errors=True)


def known_pids(state: str) -> dict[str, int]:
    """Every PID `up` and its peers made that the directory tells of."""
    up = supervisor.read_up(state)
    pids = {p["name"]: p["pid"] for p in supervisor.processes(up)}
    for record in up.get("daemons") or []:
        daemon = PrivateLibvirtd.from_record(record)
        pids.update({f"{record['host']}/{name}": pid
                     for name, pid in daemon.guest_pids().items()})
        if daemon.dnsmasq_pid():
            pids[f"{record['host']}/dnsmasq"] = daemon.dnsmasq_pid()
    for path in glob.glob(os.path.join(state, "host*", "guard", "pid")):
        with open(path) as f:
            pids[f"{path.split(os.sep)[-3]}/guard"] = json.load(f)
    return pids


def bridge_outside(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def test_down_leaves_nothing_running_and_up_again_keeps_the_hypervisor(local, cluster_name):
    state = local.state
    namespace = supervisor.netns_name(cluster_name)
    bridge_before = bridge_outside(DEFAULT_BRIDGE)
    first = local.up("--hosts", "2", "--libvirt", "qemu")
    assert [(p["host"], p["libvirt"]) for p in first["peers"]] == \
        [("host1", "qemu"), ("host2", "qemu")]
    local.json("images", "sources", "--add", state)    # where its image is, listed
    booted = local.json("boot", "vm1", "--on", "host1", "--ha", "restart", "--resources",
                        "VCPU:1,MEMORY_MB:128,DISK_GB:1", "--image", f"file://{local.image}")
    (vm,) = booted["vms"]
    assert qemu_guest.wait_for_console(
        os.path.join(state, "host1", "console", f"{vm['uuid']}.log"),
        qemu_guest.READY_MARKER, BOOT_TIMEOUT), "the guest did not come up"
    moved = local.json("migrate", "vm1", "--to", "host2", "--yes")
    assert [(v["host"], v["mode"], v["state"]) for v in moved["vms"]] == \
        [("host2", "live", "running")], moved
    pids = known_pids(state)
    assert {"host1/guard", "host2/guard", "host2/vm1", "host1/dnsmasq"} <= set(pids), pids
    assert all(running(pid) for pid in pids.values()), pids

    # killed just after asking the guests to shut down; run again, it finishes
    armed = os.path.join(state, "failpoints")
    with open(armed, "w") as f:
        f.write("down_guests\n")
    killed = local.run("down", "--state-dir", state, env={"PEERCTL_FAILPOINTS": armed})
    assert killed.returncode == -9, (killed.stdout, killed.stderr)
    assert "shutting down 1 guest (host2/vm1)" in killed.stderr, killed.stderr
    done = local.run("--format", "json", "down", "--state-dir", state)
    assert done.returncode == 0, done.stderr
    down = json.loads(done.stdout)
    what = {s["name"]: s["what"] for s in down["stopped"]}
    assert down["kept"] == [] and what[f"netns {namespace}"] == "deleted", what
    assert what.get("host2/vm1", "shut down") == "shut down", what
    assert what["host1/dnsmasq"] in ("stopped", "killed"), what

    left = {name: pid for name, pid in pids.items() if running(pid)}
    assert left == {}, f"still running after down: {left}"
    assert naming(state) == {}, f"processes naming {state}: {naming(state)}"
    assert not netns_exists(namespace)
    assert bridge_outside(DEFAULT_BRIDGE) == bridge_before
    console = os.path.join(state, "host2", "console", f"{vm['uuid']}.log")
    with open(console, errors="replace") as f:
        assert "power button: powering off" in f.read(), "not an ACPI shutdown"

    # up with no flags: the directory's two QEMU hosts, never a test-driver one
    again = local.up()
    assert [(p["host"], p["libvirt"], p["started"]) for p in again["peers"]] == \
        [("host1", "qemu", True), ("host2", "qemu", True)]
    hosts = local.json("hostlist")
    assert [(h["host"], h["hypervisor"].split()[0]) for h in hosts] == \
        [("host1", "QEMU"), ("host2", "QEMU")]
    once_more = local.up()
    assert not any(p["started"] for p in once_more["peers"])
    assert [p["pid"] for p in once_more["processes"]] == [p["pid"] for p in again["processes"]]
    for flags in (["--libvirt", "test:///default"], ["--hosts", "3"]):
        refused = local.run("up", "--state-dir", state, *flags)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, \
            (flags, refused.stderr)
    assert [p["host"] for p in supervisor.read_up(state)["peers"]] == ["host1", "host2"]
