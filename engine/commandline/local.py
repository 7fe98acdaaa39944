"""The local cluster and the peer: up, down (engine/supervisor.py), and
peer, the process every host runs."""
from __future__ import annotations

import os

from engine.core.validate import parse_duration
from engine.errors import UsageError
from engine.operations.specs import check_name

from .context import configure_logging, me, say, short_path
from .options import positive, seconds
from .settings import DEFAULTS


def cmd_peer(ctx) -> int:
    args, settings = ctx.args, ctx.settings
    import faulthandler
    # a crash in native code (gRPC, OpenSSL, libvirt), or the watchdog's
    # SIGABRT, leaves every thread's stack on stderr: the log or the journal
    faulthandler.enable()
    from .peer_host import peer_host
    host = peer_host(args, settings)        # exit 2 before anything is made or runs
    args.host, args.libvirt = host.name, host.libvirt      # for the API too
    from engine.core.validate import endpoint_scheme
    if endpoint_scheme(settings["etcd"]) == "https":
        settings["credentials"].check_peer(host.name)     # exit 4 before anything runs
    from engine.releases import current
    current.exec_current(host.state_dir)    # the host's current release, if another tree
    configure_logging("DEBUG" if args.debug else "INFO", settings)
    if host.notice:
        import structlog
        structlog.get_logger("peerctl.peer").warning("old_state_dir", host=host.name,
                                                     message=host.notice)
    from engine import placement
    placement.configure(settings["placement_config"])
    from engine.peer import run_peer
    kwargs = {"ttl": args.ttl or int(settings["ttl"]), "hooks_dir": args.hooks,
              "workers": args.workers or int(settings["workers"]),
              "state_dir": host.state_dir, "retention": settings.get("retention"),
              "networks": args.networks if args.networks is not None else settings["networks"],
              "etcd_history": settings["etcd_history"],
              "ha_margin": args.ha_margin if args.ha_margin is not None
              else settings["ha_margin"],
              "backup_pool": args.backup_pool if args.backup_pool is not None
              else settings.get("backup_pool")}
    from engine.hypervisor.host.accounting import parse_reserved
    kwargs["reserved"] = (parse_reserved(args.reserved, "in --reserved")
                          if args.reserved is not None else
                          parse_reserved(settings["reserved"], settings["source"]["reserved"]))
    from engine.hypervisor.domain.networks import parse_offer
    parse_offer(kwargs["networks"], "in --networks" if args.networks is not None
                else "in the networks setting")
    address = args.api if args.api is not None else settings["api"]
    for name in ("api_cert", "api_key"):
        if getattr(args, name):
            settings[name] = getattr(args, name)
    api = _Api(settings, address, args)
    api.start()
    try:
        return int(run_peer(ctx.store(), host.name, host.libvirt, pause=api.stop,
                            resume=api.start, libvirt_remote=host.libvirt_remote,
                            migration=host.migration,
                            api_url=api.published(), **kwargs) or 0)
    finally:
        api.stop()


class _Api:
    """The peer's HTTP face, stopped and started again around a hand-over
    to another release (the new process takes the port)."""
    def __init__(self, settings, address, args):
        self.settings, self.address, self.args = settings, address, args
        self.server = None

    def start(self) -> None:
        if not self.address or self.server is not None:
            return
        from engine.web.server import serve_cluster
        args = self.args
        self.server = serve_cluster(self.settings, self.address, host=args.host,
                                    libvirt_uri=args.libvirt,
                                    roles_dir=args.api_roles or self.settings["api_roles"] or None)
        import structlog
        structlog.get_logger("peerctl.api").info(
            "api_listening", url=self.server.url,
            security="TLS" if self.server.tls else "plain HTTP, loopback only")

    def stop(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()

    def published(self) -> str:
        """The URL the host record publishes (``console`` goes through it):
        the server's, a wildcard address (0.0.0.0, ::) replaced by this
        machine's name; "" when the peer serves no API."""
        if self.server is None:
            return ""
        url = self.server.url
        for wildcard in ("//0.0.0.0:", "//[::]:"):
            if wildcard in url:
                import socket
                url = url.replace(wildcard, f"//{socket.getfqdn()}:")
        return url


def cmd_up(ctx) -> int:
    from engine import supervisor
    args, settings = ctx.args, ctx.settings
    state_dir = os.path.abspath(args.state_dir or settings["state_dir"])
    recorded = supervisor.read_up(state_dir)
    _check_up_flags(ctx, state_dir, recorded)
    # a directory set up before keeps its host count and libvirt: flags may
    # only repeat them (checked above), the config file's defaults never apply
    config = supervisor.configuration(recorded)
    hosts = args.hosts or config["hosts"] or int(settings["hosts"])
    outcome = supervisor.start(
        state_dir, settings["cluster"], args.libvirt or config["libvirt"] or settings["libvirt"],
        hosts, settings["ttl"],
        up=recorded, members=args.etcd_members or 1, tls=args.tls,
        history=f"{int(parse_duration(settings['etcd_history']))}s")
    up = outcome.up
    cluster, urls = up["cluster"], supervisor.etcd_urls(up)
    running = [p for p in up["peers"] if supervisor.live_peer(up["state_dir"], p)]
    tls = supervisor.client_tls(up)
    doc = {"cluster": cluster, "etcd": urls.split(","),
           "processes": supervisor.processes(up),
           "state_dir": state_dir, "hosts": len(running),
           "peers": [dict(_public(p), started=p["host"] in outcome.started)
                     for p in up["peers"]],
           "tls": tls or None, "api": supervisor.api_urls(up)}
    if up.get("daemons"):
        doc.update(daemons=[_public(d) for d in up["daemons"]], netns=up.get("netns"))
    lines = []
    for name, what, record in outcome.report:
        where = record.get("url") or record.get("libvirt_uri") or record.get("libvirt")
        lines.append(f"{name:<14} {what:<16} pid {record['pid']:<8} {where}  "
                     f"log {short_path(record['log'])}")
    default_dir = state_dir == os.path.abspath(DEFAULTS["state_dir"])
    exports = f"  export PEERCTL_ETCD={urls} PEERCTL_CLUSTER={cluster}"
    if tls:
        exports += "".join(f" \\\n         PEERCTL_{name.upper()}={path}"
                           for name, path in tls.items())
    lines += ["", f"{len(running)} peer{'s' if len(running) != 1 else ''} up in cluster "
              f"{cluster!r}, etcd at {urls}" + (" (TLS, roles on)." if tls else "."),
              ("In this directory peerctl finds them by itself; elsewhere:" if default_dir
               else "Use them with:"),
              exports,
              "Then for instance:",
              f"  {me()} hostlist",
              f"  {me()} boot vm1 --resources VCPU:1,MEMORY_MB:256,DISK_GB:1",
              f"  {me()} vmlist",
              "The HTTP API and the web page: " + " ".join(supervisor.api_urls(up))
              + f" (a token for them: {me()} token create --role operator)",
              f"Stop everything with: {me()} down"
              + ("" if default_dir else f" --state-dir {short_path(state_dir)}")]
    ctx.emit(doc, "\n".join(lines))
    return 0


def _check_up_flags(ctx, state_dir: str, up: dict) -> None:
    """A cluster name, libvirt URI, host count, etcd size or TLS asked for
    explicitly must be what the state directory was set up with: `up` never
    silently keeps the recorded one, and switching a set-up directory over is
    not clean (etcd data, peer state and VMs belong to the old one), so it is
    a usage error naming both ways out, before anything starts."""
    from engine import supervisor
    args = ctx.args
    where = short_path(state_dir)
    redo = (f"run '{me()} down' and remove {where} first"
            + ("" if state_dir == os.path.abspath(DEFAULTS["state_dir"])
               else " (or use another --state-dir)"))
    if args.cluster is not None:
        asked = f"--cluster {args.cluster}"
    elif os.environ.get("PEERCTL_CLUSTER"):
        asked = f"PEERCTL_CLUSTER={os.environ['PEERCTL_CLUSTER']}"
    else:
        asked = None
    members = len(supervisor.etcd_members(up))
    if args.etcd_members and members and args.etcd_members != members:
        raise UsageError(f"{where} was set up with {members} etcd member"
                         f"{'s' if members != 1 else ''}, not {args.etcd_members}: "
                         f"to change that, {redo}")
    if args.tls and up.get("etcd") and not up.get("tls"):
        raise UsageError(f"{where} was set up without TLS: to use --tls, {redo}")
    recorded = up.get("cluster")
    if asked and recorded and ctx.settings["cluster"] != recorded:
        raise UsageError(f"{where} was set up for cluster {recorded!r}, not "
                         f"{ctx.settings['cluster']!r} ({asked}): to use that, {redo}; "
                         f"or ask for --cluster {recorded}")
    config = supervisor.configuration(up)
    if args.libvirt is not None:
        if config.get("libvirt") and config["libvirt"] != args.libvirt:
            raise UsageError(f"{where} was set up with --libvirt {config['libvirt']}, not "
                             f"{args.libvirt}: to use that, {redo}; or ask for --libvirt "
                             f"{config['libvirt']}, or for nothing")
        for peer in up.get("peers") or []:
            if peer.get("libvirt") and peer["libvirt"] != args.libvirt:
                raise UsageError(f"{peer['host']} in {where} was set up with --libvirt "
                                 f"{peer['libvirt']}, not {args.libvirt}: to use that, "
                                 f"{redo}; or ask for --libvirt {peer['libvirt']}")
    if args.hosts is not None and config.get("hosts") and args.hosts != config["hosts"]:
        raise UsageError(f"{where} was set up with {config['hosts']} host"
                         f"{'s' if config['hosts'] != 1 else ''}, not {args.hosts}: to change "
                         f"that, {redo}; or ask for --hosts {config['hosts']}, or for nothing")


def _public(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "cmd"}


def cmd_down(ctx) -> int:
    from engine import supervisor
    args = ctx.args
    state_dir = os.path.abspath(args.state_dir or ctx.settings["state_dir"])
    stopped = supervisor.stop(state_dir, keep_guests=args.keep_guests,
                              guest_timeout=args.guest_timeout, say=say)
    if stopped is None:
        ctx.emit({"state_dir": state_dir, "stopped": [], "kept": []},
                 f"nothing to stop: no {short_path(supervisor.up_file(state_dir))}")
        return 0
    kept = [s for s in stopped if s["what"] == "kept"]
    width = max([len(s["name"]) for s in stopped] + [8])
    lines = [f"{s['name']:<{width}} {s['role']:<9} pid {s['pid'] or '-':<8} {s['what']}"
             + (f" ({', '.join(s['inside'])} in it)" if s.get("inside") else "")
             for s in stopped]
    if kept:
        lines.append("kept running: " + ", ".join(
            f"{s['name']}" + (f" (pid {s['pid']})" if s["pid"] else "") for s in kept)
            + f"; the next '{me()} up' takes them up again")
    # up.json stays: the next `up` reuses its ports with the data kept here
    lines.append(f"data kept in {short_path(state_dir)}")
    ctx.emit({"state_dir": state_dir, "stopped": stopped, "kept": kept}, "\n".join(lines))
    return 0



def register(commands) -> None:
    sub = commands.add("peer", "run this host's peer in the foreground",
                       "python peerctl.py peer\n"
                       "python peerctl.py peer --host host1 --libvirt qemu:///system --ttl 5",
                       cmd_peer, "Run the peer of one host: it registers the host, keeps its "
                       "records current, executes requests and leads automations. SIGTERM or "
                       "SIGINT stop it gracefully. With no flags it runs the host the config "
                       "file describes (/etc/peerctl/peerctl.conf on an installed host; "
                       "docs/install.md).")
    sub.add_argument("--host", metavar="NAME",
                     help="this host's name in the cluster (letters, digits, '.', '_', '-') "
                          "[$PEERCTL_HOST, the host setting, default this machine's short "
                          "host name]")
    sub.add_argument("--libvirt", metavar="URI",
                     help="the libvirt this peer drives: qemu:///system, or test:///default "
                          "for libvirt's test driver [$PEERCTL_LIBVIRT, the libvirt setting, "
                          "default test:///default]")
    sub.add_argument("--libvirt-remote", metavar="URI",
                     help="the URI other hosts reach this libvirt by, for migrations, "
                          "copies and consoles: qemu+tls://ADDR/system (docs/deploy.md) "
                          "[$PEERCTL_LIBVIRT_REMOTE, the libvirt_remote setting, default "
                          "--libvirt itself, which only this machine reaches]")
    sub.add_argument("--migration-network", metavar="CIDR",
                     help="the network QEMU's migration streams to this host use: its "
                          "address inside it (on one of this machine's interfaces) is "
                          "published as migration_address, which the other hosts migrate "
                          "to (docs/deploy.md) [$PEERCTL_MIGRATION_NETWORK, the "
                          "migration_network setting; an explicit migration_address wins; "
                          "default the host part of the libvirt remote URI]")
    sub.add_argument("--ttl", type=positive, metavar="SECONDS",
                     help="etcd lease TTL bounding failure detection (default 5)")
    sub.add_argument("--hooks", metavar="DIR", help="directory of R.pre / R.post hooks")
    sub.add_argument("--workers", type=positive, metavar="N",
                     help="requests executed in parallel (default 8)")
    sub.add_argument("--state-dir", metavar="DIR",
                     help="this host's state: disk pool, image cache, guard, releases "
                          "[$PEERCTL_STATE_DIR, the state_dir setting when absolute, default "
                          "/var/lib/peerctl/CLUSTER as root, else "
                          "~/.local/state/peerctl/CLUSTER/HOST]; only these two may name a "
                          "directory under /tmp")
    sub.add_argument("--networks", metavar="LIST",
                     help="networks this host offers VMs: NAME (a libvirt network) or "
                          "NAME=BRIDGE, comma-separated; 'none' for none (default: the "
                          "networks setting, 'default')")
    sub.add_argument("--backup-pool", metavar="POOL",
                     help="the libvirt storage pool backups of other hosts' VMs are kept in "
                          "(backup_pool setting; default a dir pool under the state "
                          "directory)")
    sub.add_argument("--reserved", metavar="SPEC",
                     help="what placement keeps back on this host on top of its foreign "
                          "domains, e.g. VCPU:2,MEMORY_MB:2048,DISK_GB:10 (reserved "
                          "setting, $PEERCTL_RESERVED; default none; docs/placement.md)")
    sub.add_argument("--api", metavar="ADDR:PORT",
                     help="also serve the HTTP API, the page and /metrics here (api "
                          "setting; default off; without api_cert/api_key only on "
                          "loopback; docs/api.md)")
    sub.add_argument("--api-roles", metavar="DIR",
                     help="viewer.pem/operator.pem (with -key.pem) for etcd: API requests "
                          "reach etcd as their role (api_roles setting)")
    sub.add_argument("--api-cert", metavar="FILE",
                     help="the API's HTTPS certificate (api_cert setting)")
    sub.add_argument("--api-key", metavar="FILE", help="its key (api_key setting)")
    sub.add_argument("--ha-margin", type=seconds, metavar="SECONDS",
                     help="after a host's lease expired, how long before its HA VMs are "
                          "restarted elsewhere (default: the ha_margin setting, 3s)")

    sub = commands.add("up", "start a local etcd and N peers on this machine",
                       "python peerctl.py up --hosts 3\npython peerctl.py up --libvirt qemu:///system",
                       cmd_up, "Start the embedded default: Debian's etcd with its data in the "
                       "state directory and N peers named host1..hostN (libvirt test driver "
                       "by default), all detached, with PIDs in STATE_DIR/up.json. Running it "
                       "again reports what is up and starts what is missing, with the host count "
                       "and libvirt the directory was set up with (other ones are refused).")
    sub.add_argument("--hosts", type=positive, metavar="N",
                     help="number of peers (default 3; on a directory already set up, "
                          "what it was set up with)")
    sub.add_argument("--libvirt", metavar="URI",
                     help="libvirt URI, or 'qemu': a private libvirtd per host inside a "
                          "network namespace for the cluster, so that VMs can migrate "
                          "between hosts (default test:///default; on a directory already "
                          "set up, what it was set up with; docs/local-kvm.md)")
    sub.add_argument("--state-dir", metavar="DIR", help="default ./state")
    sub.add_argument("--etcd-members", type=positive, metavar="N",
                     help="etcd members on loopback (default 1; 3 survives one's death); "
                          "fixed when the state directory is first set up")
    sub.add_argument("--tls", action="store_true",
                     help="etcd over TLS with client certificates and roles: a CA and "
                          "certificates in STATE_DIR/tls (peer per host, operator, viewer, "
                          "root); commands here use the operator's (docs/security.md)")

    sub = commands.add("down", "stop what `up` started, by PID",
                       "python peerctl.py down\npython peerctl.py down --keep-guests", cmd_down,
                       "Stop what `up` started (by recorded PID, only if the process still "
                       "runs the recorded command): the peers, etcd, each host's guard and, "
                       "with --libvirt qemu, the guests (ACPI shutdown, powered off after "
                       "--guest-timeout), the guests' network, the private libvirtd and "
                       "virtlogd and the network namespace. Data stays; on the test driver "
                       "the VMs lived in the peers and are gone.")
    sub.add_argument("--state-dir", metavar="DIR", help="default ./state")
    sub.add_argument("--keep-guests", action="store_true",
                     help="leave the QEMU guests running, with what they need (their "
                          "virtlogd, the network's dnsmasq, the namespace); listed as kept")
    sub.add_argument("--guest-timeout", type=seconds, default=None, metavar="SECONDS",
                     help="how long guests have to shut down before they are powered off "
                          "(default 30)")
