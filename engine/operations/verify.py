"""``cluster verify``: what is wrong with a cluster, seen from outside.

Each check reads what etcd and the hosts' records hold (and, for etcd itself,
asks every member; for the pairs of hosts and their clocks, asks every live
host through one automation: :mod:`engine.operations.verify_pairs`), and
says each problem in one line naming what to look at.  What it found is
recorded per host (``verified/<host>``: time, problem count, first lines,
the automation), which ``hostlist`` shows as ``verify``; nothing else is
written.  Each host's record is written whole (:data:`RECORD_BATCH` hosts a
transaction, etcd allowing 128 operations): a verify killed before it
leaves each host's previous outcome.

Checks (each problem is ``{check, host, problem}``, ``host`` None when the
problem is the cluster's, and ``peer``, the other host of a pair):
- ``etcd``: a member that does not answer, an alarm (``NOSPACE``), fewer
  than 3 members (losing the one or two there are stops the cluster);
- ``hosts``: a host the cluster knows that is down, or whose removal
  (``host remove``) was cut short;
- ``versions``: live hosts running different versions, or supporting
  different feature levels (an upgrade left half done);
- ``libvirt``: two hosts on different machines publishing the same
  ``libvirt_remote``, or one another machine's host could not reach
  (:mod:`engine.hypervisor.host.reachability`), or a host saying it cannot
  reach its own hypervisor;
- ``networks``: a network some live hosts offer and others do not (a VM
  using it can move to only some), or one a host's configuration names but
  libvirt does not have;
- ``disk``: a host whose state directory's file system has less than 10 %
  free (its VMs' thin disks grow there);
- ``certificates``: this command's etcd client certificate, and etcd's own,
  expiring within 30 days;
- ``reach``: a live host that cannot reach another's libvirt or migration
  port (skipped pairs, whose endpoint is no TCP one, are listed apart);
- ``clock``: a live host whose clock is more than 0.5 s off the hosts'
  median (see :mod:`engine.operations.verify_pairs` for how it is measured);
- ``pools``: a host whose storage pool has less free space than its VMs'
  thin disks may still grow into (``pool_free_gb``, ``vm_disk_growth_gb``
  of its record).

:func:`verify_host` is the same for one host (``join`` runs it): the checks
that concern it, its pairs both ways, its clock.
"""
from __future__ import annotations

import datetime
import socket
import ssl
import time
import urllib.parse

from engine.cluster import read_hosts
from engine.core import failpoints, keys
from engine.core.store import Put
from engine.hypervisor.host.reachability import reached_at, remote_conflict

from .verify_pairs import check_from_hosts

__all__ = ["verify", "verify_host", "CHECKS", "EXPIRY_WARNING_DAYS", "DISK_FREE_MIN",
           "RECORDED_LINES", "RECORD_BATCH"]

CHECKS = ("etcd", "hosts", "versions", "libvirt", "networks", "disk", "certificates",
          "reach", "clock", "pools")
EXPIRY_WARNING_DAYS = 30
DISK_FREE_MIN = 0.10
RECORDED_LINES = 3      # a host's first problems kept in its verify record
RECORD_BATCH = 100      # hosts' records per transaction (etcd allows 128 operations)
_MEMBER_TIMEOUT = 2.0
_ABOUT_EVERY_HOST = ("versions", "certificates")    # cluster-wide lines join shows too


def verify(ctx) -> dict:
    """``{problems: [{check, host, peer?, problem}], checked: [...], hosts: N,
    skipped: [{host, what, why}], clocks: [{host, offset_s, within_s}],
    clock_reference, automation, time}``; each host's outcome recorded."""
    return _verify(ctx, None)


def verify_host(ctx, name: str) -> list[dict]:
    """The problems ``cluster verify`` finds about host ``name``
    (``[{check, host, peer?, problem}]``, empty: none): its pairs with every
    other live host both ways, its clock, its libvirt, networks, disk and
    pool, the cluster's versions and certificates; recorded as its outcome."""
    return _verify(ctx, name)["problems"]


def _verify(ctx, only: str | None) -> dict:
    store = ctx.store()
    hosts = read_hosts(store)
    live = [h for h in hosts if h.get("alive")]
    problems: list[dict] = []

    def say(check: str, host: str | None, problem: str, peer: str | None = None) -> None:
        if only is None or only in (host, peer) or (host is None and
                                                   check in _ABOUT_EVERY_HOST):
            problems.append({"check": check, "host": host, "problem": problem,
                             **({"peer": peer} if peer else {})})

    if only is None:
        _etcd(ctx, say)
    elif only not in {h["host"] for h in hosts}:
        say("hosts", only, f"host {only} has no record in this cluster: its peer never "
                           "registered")
    removing = _removing(store)
    for host in hosts:
        if host["host"] in removing:
            say("hosts", host["host"], f"host {host['host']}'s removal did not finish: "
                                       f"host remove {host['host']} finishes it")
        elif not host.get("alive"):
            say("hosts", host["host"], f"host {host['host']} is down (its peer holds no "
                                       "lease): its VMs are not served")
    _versions(live, say)
    _libvirt(live, say)
    _networks(live, say)
    _disk(live, say)
    _pools(live, say)
    _certificates(ctx, say)
    pairs = check_from_hosts(ctx, live, say, only)
    found = {"problems": problems, "checked": list(CHECKS), "hosts": len(hosts),
             "skipped": pairs["skipped"], "clocks": pairs["clocks"],
             "clock_reference": pairs["reference"], "automation": pairs["automation"],
             "time": time.time()}
    found["recorded"] = _record(store, [h["host"] for h in hosts if only in (None, h["host"])],
                                found)
    return found


def _record(store, names: list[str], found: dict) -> bool:
    """Each host's outcome (see the module's docstring); False when etcd
    refuses it (a viewer's verify still answers)."""
    from engine.errors import PermissionDenied, StoreRefused
    if not names:
        return False
    failpoints.crash("verify record")
    puts = []
    for name in names:
        mine = [p["problem"] for p in found["problems"] if name in (p["host"], p.get("peer"))]
        puts.append(Put(keys.verified(name), {"time": found["time"], "problems": len(mine),
                                              "lines": mine[:RECORDED_LINES],
                                              "automation": found["automation"]}))
    try:
        for start in range(0, len(puts), RECORD_BATCH):
            store.txn([], puts[start:start + RECORD_BATCH])
    except (PermissionDenied, StoreRefused):      # a viewer, or a full etcd
        return False
    return True


def _removing(store) -> set[str]:
    """Hosts whose ``host remove`` was cut short (their tombstone says removing)."""
    from engine.core import keys
    from engine.core.values import readable
    return {keys.suffix(kv.key, keys.removed()) for kv in store.range(keys.removed())[0]
            if (readable(kv) or {}).get("state") == "removing"}


def _etcd(ctx, say) -> None:
    from engine.core.store import Store
    store = ctx.store()
    try:
        members = store.members()
    except Exception as exc:            # no answer, or not allowed to list members
        say("etcd", None, f"etcd's members cannot be listed ({_first_line(exc)})")
        members = [{"name": url, "client_urls": [url]} for url in store.endpoints.split(",")]
    for member in members:
        urls = member["client_urls"]
        if not urls:
            say("etcd", None, f"etcd member {member.get('name') or member.get('id')} was added "
                              "but never started")
            continue
        probe = Store(",".join(urls), store.cluster, timeout=_MEMBER_TIMEOUT,
                      credentials=store.credentials)
        try:
            for alarm in probe.status()["alarms"]:
                say("etcd", None, f"etcd member {member['name']} raises alarm {alarm}")
        except Exception as exc:        # unreachable, refused: said either way
            say("etcd", None, f"etcd member {member['name']} ({urls[0]}) does not answer "
                              f"({_first_line(exc)})")
        finally:
            probe.close()
    if len(members) < 3:
        say("etcd", None, f"etcd has {len(members)} member{'s' if len(members) != 1 else ''}: "
                          "losing one stops the cluster (3 or 5 for a rack: docs/deploy.md)")


def _versions(live: list[dict], say) -> None:
    versions = {h["host"]: h.get("version") for h in live}
    if len(set(versions.values())) > 1:
        say("versions", None, "live hosts run different versions: " + ", ".join(
            f"{host} {version}" for host, version in sorted(versions.items())))
    levels = {h["host"]: h.get("feature_level") for h in live}
    if len(set(levels.values())) > 1:
        say("versions", None, "live hosts support different feature levels: " + ", ".join(
            f"{host} {level}" for host, level in sorted(levels.items())))


def _libvirt(live: list[dict], say) -> None:
    for host in live:
        remote = reached_at(host)
        if remote and host.get("machine"):
            why = remote_conflict(host["host"], remote, host["machine"], live)
            if why is not None:
                say("libvirt", host["host"], f"host {host['host']}: {why}")
        if host.get("error"):
            say("libvirt", host["host"], f"host {host['host']} cannot reach its hypervisor: "
                                         f"{host['error']}")


def _networks(live: list[dict], say) -> None:
    offered = {h["host"]: set(h.get("networks") or ()) for h in live}
    every = set().union(*offered.values()) if offered else set()
    for host, networks in sorted(offered.items()):
        missing = sorted(every - networks)
        if missing:
            others = sorted(h for h, n in offered.items() if set(missing) & n)
            say("networks", host, f"host {host} does not offer network"
                                  f"{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                                  f"that {', '.join(others)} offer: VMs using "
                                  f"{'them' if len(missing) > 1 else 'it'} cannot move there")
    for host in live:
        for name in host.get("networks_missing") or ():
            say("networks", host["host"], f"host {host['host']}'s configuration names network "
                                          f"{name}, which its libvirt does not have")


def _disk(live: list[dict], say) -> None:
    for host in live:
        total, free = host.get("disk_gb"), host.get("free_disk_gb")
        if isinstance(total, (int, float)) and isinstance(free, (int, float)) and total > 0 \
                and free / total < DISK_FREE_MIN:
            say("disk", host["host"], f"host {host['host']}: {free:g} GiB free of {total:g} GiB "
                                      f"where its VMs' disks grow (under "
                                      f"{DISK_FREE_MIN:.0%})")


def _pools(live: list[dict], say) -> None:
    for host in live:
        growth, free = host.get("vm_disk_growth_gb"), host.get("pool_free_gb")
        if isinstance(growth, (int, float)) and isinstance(free, (int, float)) and growth > free:
            say("pools", host["host"], f"host {host['host']}: its VMs' thin disks may still "
                                       f"grow by {growth:g} GiB and its storage pool has "
                                       f"{free:g} GiB free")


def _certificates(ctx, say) -> None:
    from engine.core.certs import describe
    store = ctx.store()
    soon = time.time() + EXPIRY_WARNING_DAYS * 86400
    cert = getattr(store.credentials, "cert", None)
    if cert:
        found = describe(cert)
        if found and found.get("expires") and found["expires"] < soon:
            say("certificates", None, f"this command's etcd certificate {cert} expires "
                                      f"{_day(found['expires'])}")
    for url in [u for u in store.endpoints.split(",") if u.startswith("https://")]:
        expires = _server_expiry(url, getattr(store.credentials, "cacert", None))
        if expires is not None and expires < soon:
            say("certificates", None, f"etcd's certificate at {url} expires {_day(expires)}")


def _server_expiry(url: str, cacert: str | None) -> float | None:
    """When the certificate a TLS server at ``url`` shows expires (epoch
    seconds), or None when it cannot be read (etcd's own check says so)."""
    from cryptography import x509
    parsed = urllib.parse.urlsplit(url)
    context = ssl.create_default_context(cafile=cacert) if cacert else ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE         # read it, whoever signed it
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 2379),
                                      timeout=_MEMBER_TIMEOUT) as raw:
            with context.wrap_socket(raw, server_hostname=parsed.hostname) as tls:
                der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    if not der:
        return None
    cert = x509.load_der_x509_certificate(der)
    not_after = getattr(cert, "not_valid_after_utc", None)     # cryptography 42 on
    if not_after is None:
        not_after = cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)
    return not_after.timestamp()


def _day(epoch: float) -> str:
    return time.strftime("on %Y-%m-%d", time.gmtime(epoch))


def _first_line(exc: Exception) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]
