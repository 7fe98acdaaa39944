"""Real peer processes and the real command line, driven from tests."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys

from engine.core import api, keys
from tests.support import PEERCTL, ROOT, TEST_AUTOMATIONS, wait_for, wait_until
from tests.support.hooks import gated_hook

__all__ = ["Cluster", "start_peers", "start_three_peers", "ready_hosts", "refused", "alive",
           "finished", "start_automation"]


class Cluster:
    def __init__(self, etcd_url: str, name: str, tmp_path):
        self.etcd_url = etcd_url
        self.name = name
        self.tmp_path = tmp_path
        self.peers: dict[str, subprocess.Popen] = {}
        self.state_dirs: dict[str, str] = {}    # host -> the state directory its peer uses
        self._store = None

    @property
    def store(self):
        """A store of this cluster in the test's process, to wait on without
        a command-line process per poll (None for an etcd that wants TLS)."""
        if self._store is None and self.etcd_url.startswith("http://"):
            from engine.core.store import Store
            self._store = Store(self.etcd_url, self.name)
        return self._store

    @property
    def env(self) -> dict:
        env = dict(os.environ)
        env.update(PEERCTL_ETCD=self.etcd_url, PEERCTL_CLUSTER=self.name,
                   PYTHONUNBUFFERED="1")
        env.pop("PEERCTL_FORMAT", None)
        return env

    def start_peer(self, host: str, libvirt: str = "test:///default", ttl: int = 2,
                   extra_args=(), env=None, netns: str | None = None) -> subprocess.Popen:
        """``netns``: run it inside that network namespace (a machine of a
        rack in a box: ``ip netns exec`` execs the peer, same PID)."""
        log = open(self.tmp_path / f"{host}.log", "ab")
        args = ["peer", "--host", host, "--libvirt", libvirt, "--ttl", str(ttl),
                "--state-dir", str(self.tmp_path / f"state-{host}"), *extra_args]
        # the last --state-dir given is the one the peer uses
        self.state_dirs[host] = [a for i, a in enumerate(args[1:], 1)
                                 if args[i - 1] == "--state-dir"][-1]
        inside = ["ip", "netns", "exec", netns] if netns else []
        process = subprocess.Popen(
            [*inside, sys.executable, PEERCTL, *args],
            stdout=log, stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
            cwd=ROOT, start_new_session=True)
        self.peers[host] = process
        return process

    def state_dir(self, host: str) -> pathlib.Path:
        return pathlib.Path(self.state_dirs.get(host) or self.tmp_path / f"state-{host}")

    def successor(self, host: str) -> int | None:
        """The PID serving as ``host``'s peer after an upgrade handed it over
        to a new process (not the one this object started), if it runs."""
        from engine.hypervisor.local.daemons import cmdline
        from engine.releases.current import read_peer_file
        noted = read_peer_file(str(self.state_dir(host)))
        process = self.peers.get(host)
        if not noted or (process is not None and noted["pid"] == process.pid):
            return None
        running = cmdline(noted["pid"])
        return noted["pid"] if running and str(self.state_dir(host)) in running \
            and running == noted.get("cmd") else None

    def pid(self, host: str) -> int:
        """The PID serving as ``host``'s peer now."""
        return self.successor(host) or self.peers[host].pid

    def kill(self, host: str, sig=signal.SIGKILL) -> None:
        process = self.peers[host]
        successor = self.successor(host)
        if successor is not None:
            os.kill(successor, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                wait_for(lambda: not _runs(successor), timeout=30, what=f"{host}'s peer to exit")
        if process.poll() is None:
            process.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                process.wait(30)

    def log(self, host: str) -> str:
        return (self.tmp_path / f"{host}.log").read_text(errors="replace")

    def cli(self, *args, input=None, timeout=120, env=None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, PEERCTL, *args], capture_output=True,
                              text=True, env={**self.env, **(env or {})}, cwd=ROOT,
                              input=input, timeout=timeout)

    def cli_json(self, *args, expect_rc=0, **kwargs):
        done = self.cli("--format", "json", *args, **kwargs)
        assert done.returncode == expect_rc, (done.returncode, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        for host in self.peers:
            successor = self.successor(host)
            if successor is not None:
                os.kill(successor, signal.SIGCONT)
                os.kill(successor, signal.SIGKILL)
        for process in self.peers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(30)
        for host in self.peers:
            stop_guard(self.state_dir(host))


def _runs(pid: int) -> bool:
    from engine.hypervisor.local.daemons import cmdline
    return bool(cmdline(pid))


def stop_guard(state_dir) -> None:
    """SIGKILL the guard a peer started in ``state_dir``, by its recorded PID,
    if that process is still a guard (engine/hypervisor/ha/guard.py)."""
    try:
        pid = int((state_dir / "guard" / "pid").read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().split(b"\0")
    except (OSError, ValueError):
        return
    if b"engine.hypervisor.ha.guard" in command and str(state_dir).encode() in b" ".join(command):
        os.kill(pid, signal.SIGKILL)


def start_peers(cluster, store, names, hooks=None, env=None, ttl=2):
    """Start peers ``names`` and wait until each is alive in ``hosts/``."""
    extra = ["--hooks", hooks] if hooks else []
    for name in names:
        cluster.start_peer(name, ttl=ttl, extra_args=extra, env=env)
    wait_for(lambda: set(names) <= set(api.live_hosts(store)), what=f"peers {names} alive")


@contextlib.contextmanager
def held_requests(cluster, hooks: str, request: str):
    """host1 to host3 started, each ``request`` they run waiting (a pre
    hook in ``hooks``) until the test opens the gate this yields: the
    automation runs for as long as the test needs.  Opened at the end."""
    gate = gated_hook(hooks, request=request)
    start_three_peers(cluster, hooks)
    try:
        yield gate
    finally:
        gate.open()


def start_three_peers(cluster, hooks=None) -> list[str]:
    """Start host1, host2 and host3 (with ``hooks``, a directory, if given)
    and wait until ``hostlist`` shows them alive; returns their names."""
    names = ["host1", "host2", "host3"]
    for name in names:
        cluster.start_peer(name, extra_args=["--hooks", str(hooks)] if hooks else [])
    if cluster.store is not None:       # polled here first: one command, not one per poll
        wait_for(lambda: set(names) <= set(api.live_hosts(cluster.store)), timeout=30,
                 what="three peers alive")
    wait_for(lambda: set(names) <= alive(cluster), timeout=30, what="three peers alive")
    return names


def alive(cluster) -> set:
    """The hosts ``hostlist`` shows alive (none while etcd cannot answer)."""
    done = cluster.cli("--format", "json", "hostlist")
    if done.returncode != 0:
        return set()
    return {h["host"] for h in json.loads(done.stdout) if h["alive"]}


def finished(store, automation_id, timeout=60):
    """The automation's task once it is in a terminal state."""
    return wait_until(lambda: api.get_task(store, automation_id),
                      lambda t: t["state"] in keys.TERMINAL_STATES,
                      timeout=timeout, what="automation to finish")


def start_automation(store, kind, args, code=TEST_AUTOMATIONS, **options):
    """Start ``kind`` from the automation code in directory ``code``: this
    process records the kind's newest version, so it must load that code too."""
    before = os.environ.get("PEERCTL_AUTOMATIONS_PATH")
    os.environ["PEERCTL_AUTOMATIONS_PATH"] = str(code)
    try:
        return api.start_automation(store, kind, args, **options)
    finally:
        if before is None:
            del os.environ["PEERCTL_AUTOMATIONS_PATH"]
        else:
            os.environ["PEERCTL_AUTOMATIONS_PATH"] = before


def ready_hosts(cluster, store, names) -> list[str]:
    """Peers ``names`` alive, each with its placement provider: ready for boots."""
    start_peers(cluster, store, names)
    if "PEERCTL_PLACEMENT" not in cluster.env:      # polled here first: one command, not one per poll
        from engine.placement import open_placement
        placement = open_placement("etcd", store)
        wait_for(lambda: set(names) <= {p["name"] for p in placement.providers()},
                 what=f"providers of {', '.join(names)}")
    wait_for(lambda: set(names) <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what=f"providers of {', '.join(names)}")
    return list(names)


def refused(cluster, args, rc, said):
    """``args`` exits ``rc`` with one ``peerctl:`` line saying ``said``."""
    done = cluster.cli(*args, input="")
    assert done.returncode == rc, (args, done.returncode, done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("peerctl:")]
    assert len(errors) == 1 and said in errors[0], (args, done.stderr)
    return done


SMALL_VM = "VCPU:1,MEMORY_MB:64,DISK_GB:1"


def boot_vms(cluster, *names, on="host1", resources=SMALL_VM) -> dict:
    """Boot ``names`` on hosts matching ``on`` through the command line; the
    VMs by name (the boot must be done)."""
    doc = cluster.cli_json("boot", *names, "--resources", resources, "--on", on)
    assert doc["state"] == "done", doc
    return {vm["name"]: vm for vm in doc["vms"]}


def listed_vms(cluster) -> dict:
    """The VMs vmlist shows, by name."""
    return {vm["name"]: vm for vm in cluster.cli_json("vmlist")}


def task_ids(cluster) -> set:
    """The ids of every task, finished ones too."""
    return {t["id"] for t in cluster.cli_json("tasks", "--all")}
