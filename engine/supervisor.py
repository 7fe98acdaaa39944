"""The embedded local cluster: one etcd and N peers on this machine, all
detached, what ``peerctl up`` starts and ``peerctl down`` stops.

Everything it knows lives in the state directory: ``up.json`` (the PID and
command line of each process, etcd's ports and data directory), etcd's data,
each peer's state and every process's log.

``--libvirt qemu`` (:data:`QEMU`, a keyword, not a URI) makes a rack in a
box (:mod:`engine.hypervisor.local.rack`): each host a machine of its own, a
network namespace (``peerctl-<cluster>-<host>``) with its own address on one
switch (``peerctl-<cluster>``) and a private libvirtd
(:mod:`engine.hypervisor.local.daemons`, in ``STATE_DIR/<host>/libvirtd``)
listening there on TLS with a certificate of the cluster's CA
(``STATE_DIR/tls``).  The host's peer drives its daemon through its UNIX
socket and publishes the TLS URI (``--libvirt-remote``), by which the other
hosts migrate to it and copy to and from it, as between machines.  A peer's
record keeps ``libvirt: qemu`` (what was asked) and the daemon's URI as
``libvirt_uri``; the daemons are recorded under ``daemons``, the rack under
``netns`` (the switch's name, the /24, the hosts).  The guests of all hosts
share one network, ``default`` (:mod:`engine.hypervisor.local.localnet`).

``up.json`` also keeps ``config``: the host count and the libvirt (a URI
or :data:`QEMU`) the directory was set up with (:func:`configuration`);
``up`` with no flags uses them, so it never adds a host, nor one of
another kind.

``down`` stops the peers, then etcd (from then on nothing can restart a VM
elsewhere), then each host's guard, then the embedded KVM hosts
(:mod:`engine.hypervisor.local.teardown`): their guests (an ACPI shutdown, then
powered off after a timeout; or kept, with what they need: their virtlogd,
the network's dnsmasq and the namespace), the network, the daemons and the
namespace.  With guests kept, the next ``up`` brings their daemons back,
which take them up again.

Promises:
- starting again starts only what is not running, on the ports recorded, so
  the cluster comes back with its data;
- the configuration is recorded before anything starts (failpoint
  ``up_configured``: just after);
- ``down`` leaves no process ``up`` started running, unless asked to keep
  the guests, and then lists exactly what it kept;
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

from engine.natural import natural_key
from engine.core import failpoints
from engine.errors import Failed

__all__ = ["Started", "start", "stop", "read_up", "running_up", "is_ours", "up_file", "api_urls",
           "etcd_members", "etcd_urls", "client_tls", "processes", "configuration",
           "PEERCTL", "QEMU", "netns_name", "live_peer"]

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
    """``up.json`` when an etcd member it records still runs, else None."""
    up = read_up(state_dir)
    return up if any(is_ours(member) for member in etcd_members(up)) else None


def etcd_members(up: dict) -> list[dict]:
    """The etcd members ``up.json`` records (one dict before ``--etcd-members``)."""
    etcd = up.get("etcd") or []
    return [etcd] if isinstance(etcd, dict) else [m for m in etcd if isinstance(m, dict)]


def etcd_urls(up: dict) -> str:
    """Every member's client URL, comma-separated, as clients are given them."""
    return ",".join(member["url"] for member in etcd_members(up) if member.get("url"))


def client_tls(up: dict, user: str = "operator") -> dict:
    """``{cacert, cert, key}`` of ``user`` when ``up`` runs etcd with TLS, else {}."""
    tls = up.get("tls") or {}
    if not tls.get("dir"):
        return {}
    directory = tls["dir"]
    return {"cacert": os.path.join(directory, "ca.pem"),
            "cert": os.path.join(directory, f"{user}.pem"),
            "key": os.path.join(directory, f"{user}-key.pem")}


def processes(up: dict) -> list[dict]:
    """``[{name, role, pid}]`` of every process ``up.json`` records."""
    listed = [{"name": m.get("name", "etcd"), "role": "etcd", "pid": m["pid"]}
              for m in etcd_members(up)]
    for daemon in up.get("daemons") or []:
        listed.append({"name": f"{daemon['host']}/libvirtd", "role": "libvirtd",
                       "pid": daemon.get("pid")})
        if (daemon.get("virtlogd") or {}).get("pid"):
            listed.append({"name": f"{daemon['host']}/virtlogd", "role": "virtlogd",
                           "pid": daemon["virtlogd"]["pid"]})
    listed += [{"name": p["host"], "role": "peer", "pid": p["pid"]} for p in up.get("peers") or []]
    return listed


def configuration(up: dict) -> dict:
    """``{hosts, libvirt}`` the state directory was set up with (None for
    what it does not say): ``up.json``'s ``config``, or for one written
    before it was kept, what its peers say (libvirt: when they all agree)."""
    config = up.get("config")
    if isinstance(config, dict):
        return {"hosts": config.get("hosts"), "libvirt": config.get("libvirt")}
    peers = [p for p in up.get("peers") or [] if isinstance(p, dict)]
    kinds = {p.get("libvirt") for p in peers}
    return {"hosts": len(peers) or None,
            "libvirt": kinds.pop() if len(kinds) == 1 else None}


def is_ours(record: dict) -> bool:
    """The recorded process is alive and still runs the recorded command."""
    pid = record.get("pid")
    return bool(pid) and _running(pid) == record.get("cmd")


def _running(pid: int) -> list[str]:
    """The command process ``pid`` runs, as ``up`` recorded it: a peer in its
    machine of the rack starts as ``ip netns exec NETNS`` + its command,
    which that execs a moment later under the same PID."""
    from engine.hypervisor.local.daemons import cmdline   # not on every command's path
    running = cmdline(pid)
    return running[4:] if running[:3] == ["ip", "netns", "exec"] else running


def live_peer(state_dir: str, peer: dict) -> dict | None:
    """The process serving as ``peer``'s host now, as a record like
    ``peer``: the one ``up`` started, also once it became the host's current
    release (same PID and arguments, another ``peerctl.py``), or the one an
    upgrade handed the host over to (the host's ``peer.json``, see
    :mod:`engine.releases.current`) if that runs the same arguments; None
    when none runs."""
    if is_ours(peer):
        return peer
    from engine.releases.current import read_peer_file
    recorded = peer.get("cmd") or []
    if len(recorded) < 3:
        return None

    def same(running) -> bool:
        return len(running) >= 3 and running[1].endswith("peerctl.py") \
            and running[2:] == recorded[2:]
    running = _running(peer["pid"]) if peer.get("pid") else []
    if same(running):
        return {**peer, "cmd": running}
    noted = read_peer_file(os.path.join(state_dir, peer.get("host") or ""))
    running = _running(noted["pid"]) if noted else []
    if same(running):
        return {**peer, "pid": noted["pid"], "cmd": running}
    return None


@dataclass
class Started:
    """What ``start`` did: ``up`` as now recorded, one ``(name, "started" or
    "already running", record)`` per process, the hosts started this time."""
    up: dict
    report: list = field(default_factory=list)
    started: list = field(default_factory=list)


def start(state_dir: str, cluster: str, libvirt: str, hosts: int, ttl,
          up: dict | None = None, *, members: int = 1, tls: bool = False,
          history: str = "3600s") -> Started:
    """Start etcd and peers ``host1..host<hosts>`` that are not running.  A
    state directory keeps the cluster name, its etcd's size and TLS, and each
    host's libvirt URI it was set up with; ``up`` is its ``up.json`` when the
    caller has read it.  ``history`` is how much history etcd's own
    auto-compaction keeps.  With ``tls``, etcd serves TLS with client
    certificates and RBAC (:mod:`engine.core.auth`): each peer gets a
    certificate of role ``peer``, and ``operator``, ``viewer`` and ``root``
    certificates are made for people."""
    up = read_up(state_dir) if up is None else up
    os.makedirs(state_dir, exist_ok=True)
    cluster = up.get("cluster") or cluster
    up["cluster"] = cluster
    if not isinstance(up.get("config"), dict):
        up["config"] = {"hosts": hosts, "libvirt": libvirt}
        _save_up(state_dir, up)
    failpoints.crash("up_configured")
    outcome = Started(up)
    tls = tls or bool((up.get("tls") or {}).get("dir"))
    if tls and not up.get("tls"):
        up["tls"] = {"dir": os.path.join(state_dir, "tls"), "auth": False}
    peers = {p["host"]: p for p in up.get("peers") or []}
    names = [f"host{i}" for i in range(1, max(hosts, len(peers)) + 1)]
    # what each host was set up with; a running peer or one asked for keeps
    # its private daemon running
    asked = {host: (peers.get(host) or {}).get("libvirt") or libvirt for host in names}
    wanted = [host for i, host in enumerate(names, 1)
              if asked[host] == QEMU
              and (i <= hosts or live_peer(state_dir, peers.get(host) or {}))]
    # the rack first: etcd listens on it too, for the peers in its machines
    rack = _rack(state_dir, cluster, up, wanted) if wanted else None
    gateway = rack.gateway if rack else None
    recorded = etcd_members(up)
    running = [member if is_ours(member) else None for member in recorded] or [None] * members
    issued = _certificates(up, gateway) if tls else None
    started = _start_etcd(state_dir, recorded, running, issued, history, gateway)
    for i, member in enumerate(started):
        outcome.report.append((member.get("name", "etcd"),
                               "already running" if running[i] else "started", member))
    up.update(state_dir=state_dir, cluster=cluster, etcd=started)
    _save_up(state_dir, up)
    urls = etcd_urls(up)
    if tls:
        _grant(up, cluster, urls, hosts)
        _save_up(state_dir, up)

    uris = _start_daemons(state_dir, cluster, up, rack, wanted, outcome) if wanted else {}
    for i, host in enumerate(names, 1):
        peer = peers.get(host)
        serving = live_peer(state_dir, peer) if peer else None
        if serving:
            peers[host] = serving
            outcome.report.append((host, "already running", serving))
            continue
        if i > hosts:
            continue
        local, remote = uris.get(host, (asked[host], None))
        machine = (rack.netns(host), rack.address(host)) if host in uris else None
        peers[host] = _start_peer(state_dir, urls.replace("127.0.0.1", gateway)
                                  if machine else urls, cluster, host, asked[host],
                                  local, remote, ttl, client_tls(up, f"peer-{host}"),
                                  API_PORTS if machine else _api_port(peer, i),
                                  (up.get("tls") or {}).get("dir"), machine)
        outcome.started.append(host)
        outcome.report.append((host, "started", peers[host]))
    up["peers"] = sorted(peers.values(), key=lambda p: natural_key(p["host"]))
    _save_up(state_dir, up)
    if outcome.started:
        _wait_hosts(up, cluster, peers, outcome.started)
    return outcome


def _certificates(up: dict, gateway: str | None = None):
    """The cluster's authority, etcd's certificate (naming ``gateway`` too,
    this machine's address in the rack, when there is one) and the people's
    (made once, in ``up``'s tls directory); etcd's
    :class:`~engine.core.certs.Issued`."""
    from engine.core import certs
    directory = up["tls"]["dir"]
    certs.authority(directory, up.get("cluster") or "default")
    for user in ("root", "operator", "viewer"):
        certs.issue(directory, user, user)
    return certs.issue_server(directory, [gateway] if gateway else [])


def _grant(up: dict, cluster: str, urls: str, hosts: int) -> None:
    """Roles on the cluster's keys, a user per certificate (people, and a
    peer per host up to ``hosts``), authentication on: as etcd's root."""
    from engine.core import auth, certs
    from engine.core.credentials import Credentials
    from engine.core.store import Store, StoreUnavailable
    directory = up["tls"]["dir"]
    peers = [f"peer-host{i}" for i in range(1, hosts + 1)]
    granted = set(up["tls"].get("users") or [])
    if up["tls"].get("auth") and all(p in granted for p in peers):
        return
    for user in peers:
        certs.issue(directory, user, "peer")
    users = {"root": "root", "operator": "operator", "viewer": "viewer",
             **{user: "peer" for user in peers}}
    store = Store(urls, cluster, timeout=5.0,
                  credentials=Credentials(**client_tls(up, "root")))
    try:
        auth.setup(store, users)
    except StoreUnavailable as exc:
        raise Failed(f"could not set up etcd's roles: {exc}") from None
    finally:
        store.close()
    up["tls"].update(auth=True, users=sorted(set(users) | granted, key=natural_key))


def _start_etcd(state_dir: str, recorded: list[dict], running: list, tls,
                history: str, also_on: str | None = None) -> list[dict]:
    """Every etcd member running: those in ``running`` as they are, the
    others started on their recorded ports when free (2379/2380 the first
    time for a single member), else on free ones, serving clients on
    ``also_on`` too (this machine's address in the rack); their records for
    ``up.json``."""
    from engine.core.etcd_server import EtcdServer, free_port, initial_cluster
    size = len(running)
    ports = []
    for i in range(size):
        record = recorded[i] if i < len(recorded) else {}
        first = size == 1 and not record
        client = record.get("client_port") or (2379 if first and _port_free(2379) else 0)
        peer = record.get("peer_port") or (2380 if first and _port_free(2380) else 0)
        if running[i] is None:
            client = client if client and _port_free(client) else free_port()
            peer = peer if peer and _port_free(peer) else free_port()
        ports.append((client, peer))
    names = ["peerctl"] if size == 1 else [f"m{i}" for i in range(1, size + 1)]
    initial = initial_cluster({name: peer for name, (_, peer) in zip(names, ports)}, tls)
    servers = []
    for i, name in enumerate(names):
        suffix = "" if size == 1 else f"-{name}"
        server = EtcdServer(os.path.join(state_dir, f"etcd-data{suffix}"), *ports[i],
                            log_path=os.path.join(state_dir, f"etcd{suffix}.log"), name=name,
                            tls=tls, initial_cluster=initial, also_on=also_on,
                            compaction=None if history in ("", "0s") else history)
        servers.append(server)
        if running[i] is None:
            try:
                server.launch()
            except OSError as exc:
                raise Failed(f"etcd did not start: {exc}") from None
    try:
        for i, server in enumerate(servers):
            if running[i] is None:
                server.wait_healthy(20.0)
    except (OSError, RuntimeError, TimeoutError) as exc:
        raise Failed(f"etcd did not start: {exc}") from None
    return [running[i] or {"name": "etcd" if size == 1 else f"etcd-{server.name}",
                           "pid": server.process.pid, "cmd": server.command(),
                           "url": server.url, "client_port": server.client_port,
                           "peer_port": server.peer_port, "data_dir": server.data_dir,
                           "log": server.log_path}
            for i, server in enumerate(servers)]


def _rack(state_dir: str, cluster: str, up: dict, hosts: list[str]):
    """The cluster's rack (:class:`~engine.hypervisor.local.rack.Rack`) with
    a machine for each of ``hosts`` (and those it had), recorded in
    ``up.json`` as ``netns`` before anything runs in it."""
    from engine.hypervisor.local.daemons import netns_exists
    from engine.hypervisor.local.rack import Rack
    recorded_ns = up.get("netns") or {}
    name = recorded_ns.get("name") or netns_name(cluster)
    existed = netns_exists(name)
    rack = Rack.from_record({"name": name, **recorded_ns}) if recorded_ns.get("subnet") \
        else Rack(name)
    known = list(rack.hosts)
    try:
        rack.build(known + [host for host in hosts if host not in known])
    finally:
        # made by an earlier `up` and kept by `down` (guests ran in it): still ours
        ours = not existed or (recorded_ns.get("name") == name
                               and recorded_ns.get("created", False))
        if rack.subnet:
            up["netns"] = {**rack.record(), "created": ours}
            _save_up(state_dir, up)
    return rack


def _start_daemons(state_dir: str, cluster: str, up: dict, rack, hosts: list[str],
                   outcome: Started) -> dict:
    """The private libvirtd of each of ``hosts`` running (started in
    parallel: a daemon that must probe QEMU takes seconds), each in its
    machine of ``rack``, listening on TLS at its address with a certificate
    of the cluster's CA (``STATE_DIR/tls``); ``{host: (uri, remote_uri)}``.
    ``up.json`` records every daemon that runs before a failure is raised,
    so ``down`` finds it."""
    from concurrent.futures import ThreadPoolExecutor
    from engine.core import certs
    from engine.hypervisor.local.daemons import PrivateLibvirtd
    tls_dir = os.path.join(state_dir, "tls")
    certs.authority(tls_dir, cluster)
    records = {d["host"]: d for d in up.get("daemons") or []}
    daemons = {}
    for host in hosts:
        daemon = rack.libvirtd(host, os.path.join(state_dir, host), "libvirtd", tls_dir)
        if host in records:
            daemon = PrivateLibvirtd.from_record(records[host])
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
    up["daemons"] = sorted(records.values(), key=lambda d: natural_key(d["host"]))
    _save_up(state_dir, up)
    for host in hosts:
        if futures[host].exception() is not None:
            raise futures[host].exception()
    # The VMs' "default" network: one layer 2 across the rack, with DHCP.
    from engine.hypervisor.local.localnet import ensure_rack_network
    ordered = sorted(daemons, key=natural_key)
    ensure_rack_network(rack, {host: daemons[host][0].uri for host in ordered})
    return {host: (daemon.uri, daemon.tls_uri(daemon.tls[0]))
            for host, (daemon, _) in daemons.items()}


API_PORTS = 8080         # host N's API on 127.0.0.1:8080+N when free


def _api_port(peer: dict | None, index: int) -> int:
    """The port a host's API listens on: the one recorded, else 8080+N if
    free, else any free one.  With ``$PEERCTL_PORTS`` (a range of ports this
    process may take: the test suite gives each parallel worker its own),
    never 8080+N, which every worker would find free at once."""
    from engine.core.etcd_server import PORTS_ENV, free_port
    recorded = (peer or {}).get("api_port")
    conventional = None if os.environ.get(PORTS_ENV) else API_PORTS + index
    for port in (recorded, conventional):
        if port and _port_free(port):
            return port
    return free_port()


def api_urls(up: dict) -> list[str]:
    """The URL of each running peer's HTTP API."""
    return [p["api"].rstrip("/") for p in up.get("peers") or []
            if p.get("api") and live_peer(up.get("state_dir") or "", p)]


def _start_peer(state_dir: str, url: str, cluster: str, host: str, asked: str,
                libvirt: str, remote: str | None, ttl, tls: dict, api_port: int,
                tls_dir: str | None, machine: tuple[str, str] | None = None) -> dict:
    """``asked`` is what ``up`` was given (a URI, or :data:`QEMU`), ``libvirt``
    the URI the peer uses, ``remote`` the one other hosts reach its libvirt
    by (None: ``libvirt``), ``tls`` its ``{cacert, cert, key}`` (or {});
    ``machine``: ``(netns, address)`` of its machine in the rack, where it
    runs (``url`` then the rack's way to etcd), its API over HTTPS at that
    address with the host's certificate (``tls certs --libvirt``); else its
    API on loopback at ``api_port``, HTTPS with etcd's certificate and the
    roles' certificates under TLS."""
    address = machine[1] if machine else "127.0.0.1"
    api = ["--api", f"{address}:{api_port}"]
    if tls_dir:
        api += ["--api-roles", tls_dir]
    if machine:
        rack_tls = os.path.join(state_dir, "tls")
        api += ["--api-cert", os.path.join(rack_tls, f"libvirt-{host}.pem"),
                "--api-key", os.path.join(rack_tls, f"libvirt-{host}-key.pem")]
    elif tls_dir:
        api += ["--api-cert", os.path.join(tls_dir, "etcd.pem"),
                "--api-key", os.path.join(tls_dir, "etcd-key.pem")]
    cmd = [sys.executable, PEERCTL, "--etcd", url, "--cluster", cluster,
           *[arg for name, path in tls.items() for arg in (f"--{name}", path)], "peer",
           "--host", host, "--libvirt", libvirt,
           *(["--libvirt-remote", remote] if remote else []), "--ttl", str(ttl),
           "--state-dir", os.path.join(state_dir, host), *api]
    log_path = os.path.join(state_dir, f"{host}.log")
    inside = ["ip", "netns", "exec", machine[0]] if machine else []   # it execs: same PID
    with open(log_path, "ab") as log:
        process = subprocess.Popen(inside + cmd, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=ROOT,
                                   start_new_session=True)
    # ``cmd`` is what /proc shows for it: the interpreter path as exec'd
    record = {"host": host, "pid": process.pid, "cmd": cmd, "libvirt": asked,
              "log": log_path, "api_port": api_port,
              "api": f"{'https' if tls_dir or machine else 'http'}://{address}:{api_port}"}
    if machine:
        record["netns"] = machine[0]
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


def _wait_hosts(up: dict, cluster: str, peers: dict, hosts: list[str],
                timeout: float = 60.0) -> None:
    """Until every host in ``hosts`` is registered and can take a VM (see
    :func:`engine.cluster.ready_hosts`: `up && boot` must work)."""
    from engine.cluster import ready_hosts
    from engine.core.credentials import Credentials
    from engine.core.store import Store, StoreUnavailable
    store = Store(etcd_urls(up), cluster, timeout=2.0,
                  credentials=Credentials(**client_tls(up, "viewer")))
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
            dead = [h for h in missing if not live_peer(up.get("state_dir") or "", peers[h])]
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


def stop(state_dir: str, *, keep_guests: bool = False, guest_timeout: float | None = None,
         say=lambda message: None) -> list[dict] | None:
    """Stop everything ``up`` started here, by recorded PID: the peers (in
    parallel: each hands over what it leads), etcd, each host's guard, then
    the embedded KVM hosts (:func:`engine.hypervisor.local.teardown.take_down`:
    guests shut down unless ``keep_guests``, powered off after
    ``guest_timeout`` s).  ``[{name, role, pid, what}]``, what = stopped,
    killed, not running, kept, ...; None when nothing was ever started
    here.  ``say`` gets progress lines.  ``up.json`` and the data stay, for
    the next ``start`` (``netns.deleted`` says whether the namespace went)."""
    up = read_up(state_dir)
    if not up:
        return None
    stopped = []
    peers = [live_peer(state_dir, p) or p for p in up.get("peers") or []]
    running = [p for p in peers if is_ours(p)]
    if running:
        say(f"stopping {len(running)} peer{'s' if len(running) != 1 else ''}")
    for peer in running:
        os.kill(peer["pid"], signal.SIGTERM)
    for peer in peers:
        what = _stop_process(peer) if peer in running else "not running"
        stopped.append({"name": peer["host"], "role": "peer", "pid": peer["pid"], "what": what})
    for member in etcd_members(up):
        stopped.append({"name": member.get("name", "etcd"), "role": "etcd", "pid": member["pid"],
                        "what": _stop_process(member) if is_ours(member) else "not running"})
    stopped += _stop_guards(state_dir, peers)
    if up.get("daemons"):
        from engine.hypervisor.local.teardown import GUEST_TIMEOUT, take_down
        netns = up.get("netns") or {}
        stopped += take_down(up["daemons"], netns, keep_guests=keep_guests, say=say,
                             guest_timeout=GUEST_TIMEOUT if guest_timeout is None
                             else guest_timeout)
        if netns:
            up["netns"] = netns
            _save_up(state_dir, up)
    return stopped


def _stop_guards(state_dir: str, peers: list[dict]) -> list[dict]:
    """The guard of each host that has one (a hypervisor whose VMs outlive
    the peer).  Called once etcd is stopped: no VM can be restarted
    elsewhere any more, so no HA VM needs fencing."""
    from engine.hypervisor.ha.guard import stop_guard
    stopped = []
    for peer in peers:
        directory = os.path.join(state_dir, peer["host"])
        if not os.path.exists(os.path.join(directory, "guard", "pid")):
            continue
        pid, what = stop_guard(directory)
        stopped.append({"name": f"{peer['host']}/guard", "role": "guard", "pid": pid,
                        "what": what})
    return stopped


def _stop_process(record: dict, grace: float = 15.0) -> str:
    from engine.hypervisor.local.daemons import terminate     # not on every command's path
    if not is_ours(record):
        return "stopped"
    return terminate(record["pid"], lambda: is_ours(record), grace)
