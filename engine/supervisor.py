"""The embedded local cluster: one etcd and N peers on this machine, all
detached, what ``peerctl up`` starts and ``peerctl down`` stops.

Everything it knows lives in the state directory: ``up.json`` (the PID and
command line of each process, etcd's ports and data directory), etcd's data,
each peer's state and every process's log.

Promises:
- starting again starts only what is not running, on the ports recorded, so
  the cluster comes back with its data;
- a process is stopped only if the recorded PID still runs the recorded
  command, never a stranger that reused the PID;
- ``start`` returns once every peer it started is registered and can take a
  VM, or raises :class:`~engine.errors.Failed` with the end of the log of the
  peer that died;
- cheap to import: etcd's client is loaded only to wait for the peers.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from engine import table
from engine.errors import Failed

__all__ = ["Started", "start", "stop", "read_up", "running_up", "is_ours", "up_file",
           "PEERCTL"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERCTL = os.path.join(ROOT, "peerctl.py")      # what each peer runs


def up_file(state_dir: str) -> str:
    return os.path.join(state_dir, "up.json")


def read_up(state_dir: str) -> dict:
    """What ``up.json`` records ({} when there is none, or it is unreadable)."""
    try:
        with open(up_file(state_dir)) as f:
            up = json.load(f)
    except (OSError, ValueError):
        return {}
    return up if isinstance(up, dict) else {}


def running_up(state_dir: str) -> dict | None:
    """``up.json`` when the etcd it records still runs, else None."""
    up = read_up(state_dir)
    return up if is_ours(up.get("etcd") or {}) else None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [p.decode(errors="replace") for p in f.read().split(b"\0") if p]
    except OSError:
        return []       # gone (a zombie has an empty cmdline too)


def is_ours(record: dict) -> bool:
    """The recorded process is alive and still runs the recorded command."""
    pid = record.get("pid")
    return bool(pid) and _cmdline(pid) == record.get("cmd")


@dataclass
class Started:
    """What ``start`` did: ``up`` as now recorded, one ``(name, "started" or
    "already running", record)`` per process, the hosts started this time."""
    up: dict
    report: list = field(default_factory=list)
    started: list = field(default_factory=list)


def start(state_dir: str, cluster: str, libvirt: str, hosts: int, ttl,
          up: dict | None = None) -> Started:
    """Start etcd and peers ``host1..host<hosts>`` that are not running.  A
    state directory keeps the cluster name and each host's libvirt URI it was
    set up with; ``up`` is its ``up.json`` when the caller has read it."""
    up = read_up(state_dir) if up is None else up
    os.makedirs(state_dir, exist_ok=True)
    cluster = up.get("cluster") or cluster
    outcome = Started(up)
    etcd = up.get("etcd") or {}
    if is_ours(etcd):
        outcome.report.append(("etcd", "already running", etcd))
    else:
        etcd = _start_etcd(state_dir, etcd)
        outcome.report.append(("etcd", "started", etcd))
    up.update(state_dir=state_dir, cluster=cluster, etcd=etcd)
    _save_up(state_dir, up)

    peers = {p["host"]: p for p in up.get("peers") or []}
    for i in range(1, max(hosts, len(peers)) + 1):
        host = f"host{i}"
        peer = peers.get(host)
        if peer and is_ours(peer):
            outcome.report.append((host, "already running", peer))
            continue
        if i > hosts:
            continue
        peers[host] = _start_peer(state_dir, etcd["url"], cluster, host,
                                  (peer or {}).get("libvirt") or libvirt, ttl)
        outcome.started.append(host)
        outcome.report.append((host, "started", peers[host]))
    up["peers"] = sorted(peers.values(), key=lambda p: table.natural_key(p["host"]))
    _save_up(state_dir, up)
    if outcome.started:
        _wait_hosts(etcd["url"], cluster, peers, outcome.started)
    return outcome


def _start_etcd(state_dir: str, recorded: dict) -> dict:
    """etcd on the recorded ports when they are free (2379/2380 the first
    time), else on free ones; its record for ``up.json``."""
    from engine.core.etcd_server import EtcdServer, free_port
    client_port = recorded.get("client_port") or (2379 if _port_free(2379) else free_port())
    peer_port = recorded.get("peer_port") or (2380 if _port_free(2380) else free_port())
    if not _port_free(client_port):
        client_port = free_port()
    if not _port_free(peer_port):
        peer_port = free_port()
    server = EtcdServer(os.path.join(state_dir, "etcd-data"), client_port, peer_port,
                        log_path=os.path.join(state_dir, "etcd.log"))
    try:
        server.start()
    except (OSError, RuntimeError, TimeoutError) as exc:
        raise Failed(f"etcd did not start: {exc}") from None
    return {"pid": server.process.pid, "cmd": server.command(), "url": server.url,
            "client_port": client_port, "peer_port": peer_port,
            "data_dir": server.data_dir, "log": server.log_path}


def _start_peer(state_dir: str, url: str, cluster: str, host: str, libvirt: str,
                ttl) -> dict:
    cmd = [sys.executable, PEERCTL, "--etcd", url, "--cluster", cluster, "peer",
           "--host", host, "--libvirt", libvirt, "--ttl", str(ttl),
           "--state-dir", os.path.join(state_dir, host)]
    log_path = os.path.join(state_dir, f"{host}.log")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=ROOT,
                                   start_new_session=True)
    # ``cmd`` is what /proc shows for it: the interpreter path as exec'd
    return {"host": host, "pid": process.pid, "cmd": cmd, "libvirt": libvirt,
            "log": log_path}


def _port_free(port: int) -> bool:
    import socket
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return ""


def _save_up(state_dir: str, up: dict) -> None:
    tmp = up_file(state_dir) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(up, f, indent=2)
    os.replace(tmp, up_file(state_dir))


def _wait_hosts(url: str, cluster: str, peers: dict, hosts: list[str],
                timeout: float = 60.0) -> None:
    """Until every host in ``hosts`` is registered and can take a VM (see
    :func:`engine.cluster.ready_hosts`: `up && boot` must work)."""
    from engine.cluster import ready_hosts
    from engine.core.store import Store, StoreUnavailable
    store = Store(url, cluster, timeout=2.0)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                seen = ready_hosts(store, hosts)
            except StoreUnavailable:
                seen = set()
            missing = [h for h in hosts if h not in seen]
            if not missing:
                return
            dead = [h for h in missing if not is_ours(peers[h])]
            if dead:
                host = dead[0]
                raise Failed(f"peer {host} exited; see {peers[host]['log']}:\n"
                             + _tail(peers[host]["log"]))
            if time.monotonic() > deadline:
                raise Failed(f"peers {', '.join(missing)} not registered after {timeout:.0f}s; "
                             f"see their logs in {os.path.dirname(peers[missing[0]]['log'])}")
            time.sleep(0.1)
    finally:
        store.close()


def stop(state_dir: str) -> list[dict] | None:
    """Stop the peers (in parallel: each hands over what it leads), then
    etcd; ``[{name, pid, what}]`` with what = stopped, killed or not running;
    None when nothing was ever started here.  ``up.json`` and the data stay,
    for the next ``start``."""
    up = read_up(state_dir)
    if not up:
        return None
    stopped = []
    peers = up.get("peers") or []
    running = [p for p in peers if is_ours(p)]
    for peer in running:
        os.kill(peer["pid"], signal.SIGTERM)
    for peer in peers:
        what = _stop_process(peer) if peer in running else "not running"
        stopped.append({"name": peer["host"], "pid": peer["pid"], "what": what})
    if up.get("etcd"):
        stopped.append({"name": "etcd", "pid": up["etcd"]["pid"],
                        "what": _stop_process(up["etcd"]) if is_ours(up["etcd"])
                        else "not running"})
    return stopped


def _stop_process(record: dict, grace: float = 15.0) -> str:
    pid = record["pid"]
    if not is_ours(record):
        return "stopped"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not is_ours(record):
            return "stopped"
        time.sleep(0.05)
    if is_ours(record):
        os.kill(pid, signal.SIGKILL)
        return "killed"
    return "stopped"
