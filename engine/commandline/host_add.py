"""``host add NAME`` (an administrator, with the cluster's CA and etcd's
root) and ``join TOKEN`` (the new machine): the command line over
:mod:`engine.operations.admit` and :mod:`engine.operations.join`."""
from __future__ import annotations

import os
import time

from engine.errors import UsageError

from .context import say


def cmd_host_add(ctx) -> int:
    from engine.core.validate import parse_duration
    from engine.operations import admit
    args, settings = ctx.args, ctx.settings
    expires = parse_duration(args.expires, "--expires") if args.expires else admit.DEFAULT_EXPIRY
    ca_dir = args.ca_dir or (os.path.dirname(os.path.abspath(settings["cacert"]))
                             if settings.get("cacert") else "")
    if not ca_dir:
        raise UsageError("host add needs the cluster's CA directory (--ca-dir DIR, or "
                         "--cacert DIR/ca.pem with ca-key.pem beside it)")
    via = [url.rstrip("/") for url in args.api or []] or _published_apis(ctx) \
        or _running_apis(settings)
    done = admit.add_host(ctx, args.name, address=args.address, expires=expires,
                          ca_dir=ca_dir, via=via)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(done["expires"]))
    ctx.emit({"host": done["host"], "token": done["token"], "expires": done["expires"]},
             f"host {done['host']} may join until {when}"
             + (f" (its libvirt: {done['libvirt_remote']})" if done["libvirt_remote"] else "")
             + (" (its earlier token no longer works)" if done["replaced"] else "")
             + f"; on the new machine, once:\n\n  peerctl join {done['token']}\n\n"
             "The token is shown only this once: it is the new host's key to the cluster.")
    return 0


def _published_apis(ctx) -> list[str]:
    """The HTTPS APIs the live hosts publish (their records' ``api``)."""
    from engine.cluster import read_hosts
    return sorted(h["api"].rstrip("/") for h in read_hosts(ctx.store())
                  if h.get("alive") and str(h.get("api") or "").startswith("https://"))


def _running_apis(settings: dict) -> list[str]:
    """The HTTPS APIs of a running ``up`` in the state directory, if any."""
    from engine import supervisor
    up = supervisor.running_up(os.path.abspath(settings["state_dir"]))
    return [url for url in supervisor.api_urls(up) if url.startswith("https://")] if up else []


def cmd_join(ctx) -> int:
    from engine.operations.join import join
    args = ctx.args
    done = join(args.token, conf=args.join_conf, state_dir=args.state_dir,
                libvirt=args.libvirt, start=not args.no_start,
                libvirt_remote=args.libvirt_remote,
                wait=args.wait, progress=lambda line: None if ctx.json else say(line))
    peer = done["peer"] or {}
    lines = [f"joined cluster {done['cluster']} as {done['host']}: {done['conf']} and its "
             f"TLS files written"]
    if peer.get("how") == "detached":
        lines.append(f"peer running as pid {peer['pid']}, log {peer['log']}")
    elif peer.get("how") == "systemd":
        lines.append("peer running as the systemd unit peerctl")
    else:
        lines.append(f"{done['host']} is drained; start its peer: systemctl enable --now "
                     f"peerctl (or peerctl --conf {done['conf']} peer), then undrain "
                     f"{done['host']} once cluster verify is clean")
    if peer:
        lines.append(f"checked: {', '.join(done['verified'])}")
        lines += [f"problem: {line}" for line in done["problems"]]
        lines += [f"note (the cluster's, not {done['host']}'s): {line}"
                  for line in done["notes"]]
        lines.append(f"{done['host']} serves" if done["state"] == "serving" else
                     f"{done['host']} stays drained: fix the problems, then undrain "
                     f"{done['host']}")
    ctx.emit({key: done[key] for key in ("host", "cluster", "etcd", "verified", "state",
                                         "problems", "notes", "conf", "peer")},
             "\n".join(lines))
    return 0 if done["state"] == "serving" or not peer else 1


def register_add(what) -> None:
    """Register ``host add`` on the ``host`` noun's verbs."""
    part = what.add(
        "add", "admit a new host: print its one-time join token",
        "python peerctl.py host add h4 --address 10.0.0.14", cmd_host_add,
        "Run as etcd's root with the cluster's CA directory (ca.pem and ca-key.pem): "
        "make host NAME's etcd user peer-NAME (role peer) and its peer certificate "
        "(and, with --address, libvirt's certificates), and print a token the new "
        "machine redeems once with join, within --expires (default 1h). The cluster "
        "keeps only a hash of the token's proof and the bundle sealed with its key; "
        "a second host add of NAME replaces its earlier token. A name the cluster "
        "has already is refused (docs/deploy.md).")
    part.add_argument("name", metavar="NAME", help="the new host's name")
    part.add_argument("--address", metavar="ADDR",
                      help="the address other hosts reach it at: libvirt's certificates "
                           "and libvirt_remote qemu+tls://ADDR/system")
    part.add_argument("--expires", metavar="DURATION",
                      help="how long the token works (default 1h; 30m, 2h...)")
    part.add_argument("--api", action="append", metavar="URL",
                      help="a peer's HTTPS API the new machine redeems the token at "
                           "(repeatable; default: those the live hosts publish, else those "
                           "of a running up)")
    part.add_argument("--ca-dir", metavar="DIR",
                      help="the cluster's CA directory (default: that of --cacert)")


def register_join(commands) -> None:
    """Register the top-level ``join`` command."""
    sub = commands.add(
        "join", "on a new machine: redeem a join token and become a host",
        "python peerctl.py join pcj1_eyJjIjoi...", cmd_join,
        "Check the cluster by the CA fingerprint in TOKEN, redeem it once at a peer's "
        "API, write the config file and its TLS files (tls/ beside it, keys 0600), "
        "check etcd answers the new identity, drain the host, start its peer "
        "(systemctl enable --now peerctl for /etc/peerctl/peerctl.conf under systemd, "
        "else a detached peerctl peer --conf FILE), wait for it to register, run "
        "cluster verify and undrain it if no problem concerns it (else exit 1, "
        "drained, naming them). A bad, used, expired or forged token writes nothing.")
    sub.add_argument("token", metavar="TOKEN", help="what host add printed")
    sub.add_argument("--conf", dest="join_conf", metavar="FILE",
                     default="/etc/peerctl/peerctl.conf",
                     help="the config file to write (default /etc/peerctl/peerctl.conf; "
                          "must not exist)")
    sub.add_argument("--state-dir", metavar="DIR",
                     help="the peer's state directory (default /var/lib/peerctl/CLUSTER)")
    sub.add_argument("--libvirt", metavar="URI", default="qemu:///system",
                     help="the hypervisor the peer drives (default qemu:///system)")
    sub.add_argument("--libvirt-remote", metavar="URI",
                     help="how the other hosts reach that libvirt (default: "
                          "qemu+tls://ADDR/system from host add --address), e.g. "
                          "qemu+ssh://root@ADDR/system")
    sub.add_argument("--no-start", action="store_true",
                     help="only write the files (and drain the host): start nothing")
    sub.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                     help="how long to wait for the peer to register (default 120)")
