"""The new machine's side of a join: ``peerctl join TOKEN``.

In order, each step only once the one before it held:

1. the token is parsed (:mod:`engine.core.join_tokens`) and the config file
   must not exist yet: a bad token or a machine that joined already is one
   line, and nothing is written anywhere;
2. a peer's API named in the token shows its CA (``GET /v1/join``), which
   must have the token's fingerprint; only then, over a connection checked
   against that CA, is the proof sent (``POST /v1/join``) and the sealed
   bundle received; the cluster deletes the token as it hands it over;
3. the bundle opens with the token's key; the TLS files (keys 0600) are
   written next to the config file, then the config file itself, last and
   whole (a rename): a machine with a config file has all its files;
4. etcd answers with the new identity, and the host is drained
   (``drained/<host>``) before its peer starts;
5. the peer starts (``systemctl enable --now peerctl`` when the config is
   the system's and systemd runs; else a detached ``peerctl peer --conf``),
   registers, ``cluster verify`` runs, and the host is undrained when no
   problem concerns it, or stays drained and says which.

A crash after step 2 leaves a used token and no config file: ``host add``
again prints a new token (the certificate and etcd user are reused), and
``join`` with it writes everything again.
"""
from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

from engine.core import failpoints, join_tokens, keys
from engine.core.files import write_whole
from engine.errors import Failed, UsageError

__all__ = ["join", "fetch_bundle", "write_files", "start_peer", "BLOCKING_CHECKS",
           "SYSTEM_CONF"]

SYSTEM_CONF = "/etc/peerctl/peerctl.conf"
# Problems of these checks concern every host, the new one too: they keep it drained.
BLOCKING_CHECKS = ("versions",)
_HTTP_TIMEOUT = 10.0


# -- 2. the bundle, through a peer's API pinned by the CA's fingerprint -----------------

def _ask(url: str, context: ssl.SSLContext, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + "/v1/join", data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context),
                                         urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=_HTTP_TIMEOUT) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        try:
            why = json.loads(exc.read())["error"]
        except (ValueError, KeyError, TypeError):
            why = f"HTTP {exc.code}"
        raise Failed(f"join refused by {url}: {why}") from None


def fetch_bundle(token: join_tokens.Token) -> dict:
    """The token's bundle, redeemed through the first of its peer APIs that
    answers; the token is used up once this returns."""
    unreachable = []
    for url in token.via:
        anyone = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anyone.check_hostname, anyone.verify_mode = False, ssl.CERT_NONE   # pinned below
        try:
            ca = _ask(url, anyone).get("ca", "")
            try:
                found = join_tokens.fingerprint(ca.encode())
            except ValueError:
                found = "none"
            if found != token.ca:
                raise Failed(f"{url} is not cluster {token.cluster}'s: its CA's fingerprint "
                             f"{found[:16]}... differs from the token's {token.ca[:16]}...")
            pinned = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            pinned.check_hostname = False           # the CA is the cluster's: that is the check
            pinned.load_verify_locations(cadata=ca)
            answer = _ask(url, pinned, {"id": token.id,
                                        "proof": join_tokens.proof_of(token)})
        except (urllib.error.URLError, OSError, ValueError) as exc:
            unreachable.append(f"{url} ({getattr(exc, 'reason', None) or exc})")
            continue
        try:
            bundle = join_tokens.unseal(token, answer.get("sealed", ""))
        except join_tokens.Unsealable:
            raise Failed(f"{url} answered a bundle this token does not open: "
                         "host add prints a new token") from None
        if bundle.get("cluster") != token.cluster:
            raise Failed(f"{url} answered a bundle of cluster {bundle.get('cluster')}, "
                         f"not {token.cluster}")
        return bundle
    raise Failed("no peer API of the token answered: " + "; ".join(unreachable))


# -- 3. the files ---------------------------------------------------------------------

def write_files(bundle: dict, conf: str, state_dir: str | None, libvirt: str,
                libvirt_remote: str | None = None) -> dict:
    """The TLS files in ``<conf's directory>/tls``, then ``conf``: the paths.
    ``libvirt_remote``: how the other hosts reach this libvirt, instead of
    the URI ``host add --address`` gave."""
    host = bundle["host"]
    tls = os.path.join(os.path.dirname(os.path.abspath(conf)), "tls")
    os.makedirs(tls, mode=0o700, exist_ok=True)
    files = {"cacert": os.path.join(tls, "ca.pem"),
             "cert": os.path.join(tls, f"peer-{host}.pem"),
             "key": os.path.join(tls, f"peer-{host}-key.pem")}
    write_whole(files["cacert"], bundle["ca"])
    write_whole(files["cert"], bundle["cert"])
    write_whole(files["key"], bundle["key"], private=True)
    if bundle.get("libvirt"):
        where = os.path.join(tls, "libvirt")
        os.makedirs(where, mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(where, "qemu"), mode=0o700, exist_ok=True)
        for name, text in bundle["libvirt"].items():
            write_whole(os.path.join(where, name), text, private="key" in name)
        files["libvirt"] = where
    lines = ["# written by peerctl join: this host's peer (docs/deploy.md)", "[peerctl]",
             f"etcd = {bundle['etcd']}", f"cluster = {bundle['cluster']}", f"host = {host}",
             f"libvirt = {libvirt}"]
    if libvirt_remote or bundle.get("libvirt_remote"):
        lines.append(f"libvirt_remote = {libvirt_remote or bundle['libvirt_remote']}")
    if state_dir:
        lines.append(f"state_dir = {os.path.abspath(state_dir)}")
    lines += [f"{name} = {files[name]}" for name in ("cacert", "cert", "key")]
    write_whole(conf, "\n".join(lines) + "\n")
    return files


# -- 5. the peer ----------------------------------------------------------------------

def start_peer(conf: str, log_dir: str, state_dir: str | None = None) -> dict:
    """The peer started: ``{how: systemd, unit}`` under systemd for the
    system's config file (the unit reads that one), else ``{how: detached,
    pid, log}`` (:mod:`engine.detached_peer`)."""
    if os.path.abspath(conf) == SYSTEM_CONF and os.path.isdir("/run/systemd/system"):
        done = subprocess.run(["systemctl", "enable", "--now", "peerctl"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise Failed("systemctl enable --now peerctl failed: "
                         + ((done.stderr or done.stdout).strip().splitlines() or ["?"])[-1])
        return {"how": "systemd", "unit": "peerctl"}
    from engine.detached_peer import start
    return start(conf, log_dir, state_dir)


def _registered(store, host: str, started: dict, deadline: float, progress) -> None:
    from engine.core.values import readable
    begun = time.monotonic()
    said = 0
    while readable(store.get(keys.host(host))) is None:
        process = started.get("process")
        if process is not None and process.poll() is not None:
            raise Failed(f"the peer exited ({process.returncode}) before {host} registered: "
                         f"see {started['log']}")
        waited = time.monotonic() - begun
        if time.monotonic() > deadline:
            raise Failed(f"{host} did not register within {waited:.0f} s: see "
                         f"{started.get('log') or 'journalctl -u peerctl'}")
        if waited >= said + 5:
            said = int(waited)
            progress(f"waiting for {host} to register ({said} s)")
        time.sleep(0.2)


# -- the whole ------------------------------------------------------------------------

def join(text: str, *, conf: str = SYSTEM_CONF, state_dir: str | None = None,
         libvirt: str = "qemu:///system", start: bool = True, wait: float = 120.0,
         progress=lambda line: None, libvirt_remote: str | None = None) -> dict:
    """Redeem ``text`` and become a host: ``{host, cluster, etcd, verified,
    state, problems, notes, conf, peer}``."""
    token = join_tokens.parse(text)
    if os.path.lexists(conf):
        raise UsageError(f"{conf} exists: this machine is configured already (move it "
                         "away to join again)")
    parent = os.path.dirname(os.path.abspath(conf))
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write {conf}: {parent} is not writable (run as root?)")
    progress(f"redeeming the token at {', '.join(token.via)}")
    bundle = fetch_bundle(token)
    failpoints.crash("join redeemed")
    host = bundle["host"]
    files = write_files(bundle, conf, state_dir, libvirt, libvirt_remote)
    from engine.core.credentials import Credentials
    from . import Context
    ctx = Context(bundle["etcd"], bundle["cluster"],
                  Credentials(files["cacert"], files["cert"], files["key"]))
    try:
        store = ctx.store()
        store.get(keys.host(host))
    except Exception as exc:
        raise Failed(f"{conf} written, but etcd at {bundle['etcd']} does not answer "
                     f"{host}'s new identity: {str(exc).splitlines()[0]}") from None
    from .moves import set_drained
    set_drained(ctx, [host], True, by="join")
    doc = {"host": host, "cluster": bundle["cluster"], "etcd": bundle["etcd"],
           "conf": os.path.abspath(conf), "files": files, "verified": [], "state": "drained",
           "problems": [], "notes": [], "peer": None}
    if not start:
        return doc
    started = start_peer(conf, state_dir or parent, state_dir)
    doc["peer"] = {k: v for k, v in started.items() if k != "process"}
    progress(f"peer started ({'pid ' + str(started['pid']) if 'pid' in started else 'systemd'})"
             f": waiting for {host} to register")
    try:
        _registered(store, host, started, time.monotonic() + wait, progress)
    except Failed as exc:
        raise Failed(str(exc), result=doc) from None
    from .verify import verify
    found = verify(ctx)
    doc["verified"] = found["checked"]
    for problem in found["problems"]:
        mine = host in (problem["host"], problem.get("peer")) \
            or problem["check"] in BLOCKING_CHECKS
        doc["problems" if mine else "notes"].append(problem["problem"])
    if not doc["problems"]:
        set_drained(ctx, [host], False, by="join")
        doc["state"] = "serving"
    return doc
