"""The embedded local cluster: one etcd and N peers on this machine, all
detached, what ``peerctl up`` starts and ``peerctl down`` stops.

Everything it knows lives in the state directory: ``up.json`` (the PID and
command line of each process, etcd's ports and data directory), etcd's data,
each peer's state and every process's log.

``--libvirt qemu`` (:data:`QEMU`, a keyword, not a URI) makes each host a
KVM host of its own: a private libvirtd per host
(:mod:`engine.hypervisor.daemons`) in ``STATE_DIR/<host>/libvirtd``, all of
them inside one network namespace for the cluster (``peerctl-<cluster>``),
and the host's peer pointed at its daemon.  A peer's record keeps
``libvirt: qemu`` (what was asked) and the daemon's URI as ``libvirt_uri``;
the daemons are recorded under ``daemons``, the namespace under ``netns``.
The daemons share one guest network, ``default``, inside the namespace
(:mod:`engine.hypervisor.localnet`).
``down`` stops the peers, then the daemons, then deletes the namespace if
``up`` made it and nothing runs in it any more.  Guests are left running, as
across any libvirtd restart (QEMU is daemonised, not libvirtd's child), with
their daemon's virtlogd (their consoles go through it) and so the namespace;
the next ``up`` brings the daemon back and it takes them up again.

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
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from engine import table
from engine.errors import Failed
from engine.hypervisor.daemons import cmdline   # stdlib only: still cheap to import

__all__ = ["Started", "start", "stop", "read_up", "running_up", "is_ours", "up_file",
           "PEERCTL", "QEMU", "netns_name"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERCTL = os.path.join(ROOT, "peerctl.py")      # what each peer runs
QEMU = "qemu"           # --libvirt keyword: a private libvirtd per host


def netns_name(cluster: str) -> str:
    """The network namespace of a cluster's private daemons."""
    return "peerctl-" + re.sub(r"[^A-Za-z0-9_.-]", "-", cluster)


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


def is_ours(record: dict) -> bool:
    """The recorded process is alive and still runs the recorded command."""
    pid = record.get("pid")
    return bool(pid) and cmdline(pid) == record.get("cmd")


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
    names = [f"host{i}" for i in range(1, max(hosts, len(peers)) + 1)]
    # what each host was set up with; a running peer or one asked for keeps
    # its private daemon running
    asked = {host: (peers.get(host) or {}).get("libvirt") or libvirt for host in names}
    wanted = [host for i, host in enumerate(names, 1)
              if asked[host] == QEMU and (i <= hosts or is_ours(peers.get(host) or {}))]
    uris = _start_daemons(state_dir, cluster, up, wanted, outcome) if wanted else {}
    for i, host in enumerate(names, 1):
        peer = peers.get(host)
        if peer and is_ours(peer):
            outcome.report.append((host, "already running", peer))
            continue
        if i > hosts:
            continue
        peers[host] = _start_peer(state_dir, etcd["url"], cluster, host, asked[host],
                                  uris.get(host, asked[host]), ttl)
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


def _start_daemons(state_dir: str, cluster: str, up: dict, hosts: list[str],
                   outcome: Started) -> dict:
    """The private libvirtd of each of ``hosts`` running (started in
    parallel: a daemon that must probe QEMU takes seconds), inside the
    cluster's network namespace; ``{host: uri}``.  ``up.json`` records every
    daemon that runs before a failure is raised, so ``down`` finds it."""
    from concurrent.futures import ThreadPoolExecutor
    from engine.hypervisor.daemons import PrivateLibvirtd, ensure_netns, netns_exists
    recorded_ns = up.get("netns") or {}
    name = recorded_ns.get("name") or netns_name(cluster)
    existed = netns_exists(name)
    created = ensure_netns(name)
    # made by an earlier `up` and kept by `down` (guests ran in it): still ours
    ours = created or (existed and recorded_ns.get("name") == name
                       and recorded_ns.get("created", False))
    up["netns"] = {"name": name, "created": ours}
    records = {d["host"]: d for d in up.get("daemons") or []}
    daemons = {}
    for host in hosts:
        daemon = (PrivateLibvirtd.from_record(records[host]) if host in records
                  else PrivateLibvirtd(os.path.join(state_dir, host), "libvirtd", name))
        daemons[host] = (daemon, daemon.running())
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        futures = {host: pool.submit(daemon.start) for host, (daemon, _) in daemons.items()}
    for host, (daemon, was_running) in daemons.items():
        records[host] = {"host": host, "role": "libvirtd", **daemon.record()}
        if futures[host].exception() is None:
            # `up` prints each process's url or libvirt: a daemon's is its URI
            outcome.report.append((f"{host}/libvirtd",
                                   "already running" if was_running else "started",
                                   dict(records[host], libvirt=daemon.uri)))
    up["daemons"] = sorted(records.values(), key=lambda d: table.natural_key(d["host"]))
    _save_up(state_dir, up)
    for host in hosts:
        if futures[host].exception() is not None:
            raise futures[host].exception()
    uris = {host: daemon.uri for host, (daemon, _) in daemons.items()}
    # The VMs' "default" network: one bridge with DHCP inside the namespace.
    from engine.hypervisor.localnet import ensure_local_network
    ensure_local_network([uris[host] for host in sorted(uris, key=table.natural_key)])
    return uris


def _start_peer(state_dir: str, url: str, cluster: str, host: str, asked: str,
                libvirt: str, ttl) -> dict:
    """``asked`` is what ``up`` was given (a URI, or :data:`QEMU`), ``libvirt``
    the URI the peer uses."""
    cmd = [sys.executable, PEERCTL, "--etcd", url, "--cluster", cluster, "peer",
           "--host", host, "--libvirt", libvirt, "--ttl", str(ttl),
           "--state-dir", os.path.join(state_dir, host)]
    log_path = os.path.join(state_dir, f"{host}.log")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=ROOT,
                                   start_new_session=True)
    # ``cmd`` is what /proc shows for it: the interpreter path as exec'd
    record = {"host": host, "pid": process.pid, "cmd": cmd, "libvirt": asked,
              "log": log_path}
    if libvirt != asked:
        record["libvirt_uri"] = libvirt
    return record


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
    """Stop the peers (in parallel: each hands over what it leads), then the
    private daemons, then etcd; ``[{name, pid, what}]`` with what = stopped,
    killed or not running (a daemon's virtlogd: ``kept`` while its guests
    run); None when nothing was ever started here.  The network namespace
    ``up`` made goes once nothing runs in it (``up.json`` says which:
    ``netns.deleted``).  ``up.json`` and the data stay, for the next
    ``start``."""
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
    if up.get("daemons"):
        stopped += _stop_daemons(state_dir, up)
    if up.get("etcd"):
        stopped.append({"name": "etcd", "pid": up["etcd"]["pid"],
                        "what": _stop_process(up["etcd"]) if is_ours(up["etcd"])
                        else "not running"})
    return stopped


def _stop_daemons(state_dir: str, up: dict) -> list[dict]:
    """Each private daemon stopped by its recorded PIDs (their guest network
    first when no guest runs), then the namespace deleted if ``up`` made it
    and nothing runs in it."""
    from engine.hypervisor.daemons import PrivateLibvirtd, delete_netns
    from engine.hypervisor.localnet import stop_local_network
    daemons = [PrivateLibvirtd.from_record(record) for record in up["daemons"]]
    running = [daemon for daemon in daemons if daemon.running()]
    if not any(daemon.guests() for daemon in running):
        # No guest needs it: its DHCP server would keep the namespace alive.
        stop_local_network([daemon.uri for daemon in running])
    stopped = []
    for record in up["daemons"]:
        outcome = PrivateLibvirtd.from_record(record).stop()
        pids = {"libvirtd": record.get("pid"),
                "virtlogd": (record.get("virtlogd") or {}).get("pid")}
        for what, pid in pids.items():
            stopped.append({"name": f"{record['host']}/{what}", "pid": pid or 0,
                            "what": outcome[what]})
    netns = up.get("netns") or {}
    if netns.get("created"):
        netns["deleted"] = delete_netns(netns["name"])
        _save_up(state_dir, up)
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
