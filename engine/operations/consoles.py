"""How ``console NAME`` reaches a VM's serial console: its host's libvirt
directly, or a peer's API websocket (``GET /v1/vms/{name}/console``), and
the short-lived token it mints for the API when it was given none
(docs/cli.md, "console").

The rule, ``via``:
- ``libvirt``: the host's libvirt, at the URI its record publishes (as
  before this rule existed; the machine running the command needs libvirt
  access to that host);
- ``api``: a peer's API: the ``api`` URLs given, else the VM's host's own
  (the ``api`` its record publishes), then every other live peer's;
- ``auto`` (the default): the ``api`` URLs when given; else libvirt when the
  VM's host is this machine (its URI names no other machine and its record's
  machine id is this machine's), where nothing stands between; else a
  peer's API when any publishes one; else libvirt.

Promises: :func:`console_route` reads etcd only when no API URL was given
(a workstation holding only an API token never opens etcd);
:func:`console_token` is deleted when its ``with`` block ends, and a
command killed outright leaves it valid for at most :data:`TOKEN_TTL`
seconds: it is bound to an etcd lease of that TTL that only the block
renews, and its record's ``expires`` moves with it.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

from engine.core import tokens
from engine.core.hosts import live_hosts
from engine.errors import PeerctlError, UsageError

from .vms import console_target

__all__ = ["VIA", "TOKEN_TTL", "Route", "console_route", "console_token", "api_urls"]

VIA = ("auto", "api", "libvirt")
TOKEN_TTL = 60                  # seconds a killed command's token outlives it, at most


@dataclass
class Route:
    """Where the console is reached: ``via`` ``libvirt`` (``uri``) or
    ``api`` (``apis``, tried in order); ``name`` is what the API is asked
    for; ``vm`` the VM's record when etcd was read (None otherwise)."""
    via: str
    name: str
    vm: dict | None = None
    uri: str | None = None
    apis: list[str] = field(default_factory=list)


def api_urls(text: str | None) -> list[str]:
    """``URL[,URL...]`` as a list; each must be http:// or https://."""
    urls = [url.strip().rstrip("/") for url in (text or "").split(",") if url.strip()]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"bad API URL {url!r} (want http://HOST:PORT or "
                             "https://HOST:PORT)")
    return urls


def console_route(ctx, pattern: str, via: str = "auto", api: str | None = None) -> Route:
    """The way to the console of the one VM ``pattern`` matches (``via``
    and ``api``, comma-separated URLs, as the module says)."""
    if via not in VIA:
        raise UsageError(f"bad --via {via!r} (want {', '.join(VIA)})")
    given = api_urls(api)
    if via == "libvirt" and given:
        raise UsageError("--api names an API: it goes with --via api or auto, not libvirt")
    if given:
        if "/" in pattern:
            raise UsageError(f"{pattern!r}: through --api name the VM by its name "
                             "(VMGLOB), not HOSTGLOB/VMGLOB")
        return Route("api", pattern, apis=given)
    vm, uri = console_target(ctx, pattern)
    if via == "libvirt":
        return Route("libvirt", vm["name"], vm, uri)
    records = live_hosts(ctx.store())
    apis = _published(records, vm["host"])
    if via == "api":
        if not apis:
            raise UsageError(f"no peer publishes an API (peer --api): nothing to reach the "
                             f"console of VM {vm['name']} through; name one with --api URL")
        return Route("api", vm["name"], vm, apis=apis)
    if _on_this_machine(records.get(vm["host"]) or {}, uri) or not apis:
        return Route("libvirt", vm["name"], vm, uri)
    return Route("api", vm["name"], vm, apis=apis)


def _published(records: dict, host: str) -> list[str]:
    """The API URLs live peers publish: ``host``'s first, then the others by name."""
    order = [host] + sorted(name for name in records if name != host)
    urls = []
    for name in order:
        url = (records.get(name) or {}).get("api")
        if isinstance(url, str) and url.startswith(("http://", "https://")) \
                and url.rstrip("/") not in urls:
            urls.append(url.rstrip("/"))
    return urls


def _on_this_machine(record: dict, uri: str) -> bool:
    from engine.hypervisor.host.reachability import machine_id, reaches_other_machines
    if reaches_other_machines(uri):
        return False
    machine = record.get("machine")
    return not machine or machine == machine_id()


@contextlib.contextmanager
def console_token(ctx):
    """The secret of an ``operator`` token for one console session, made
    with this command's etcd credentials, kept alive while the block runs
    and deleted when it ends (see the module)."""
    store = ctx.store()
    lease = store.grant(TOKEN_TTL)
    try:
        made = tokens.create(store, "operator", TOKEN_TTL, lease=lease)
        stop = threading.Event()
        renewer = threading.Thread(target=_renew, args=(store, lease, made["id"], stop),
                                   name="console-token", daemon=True)
        renewer.start()
        try:
            yield made["secret"]
        finally:
            stop.set()
            renewer.join(5)
    finally:
        with contextlib.suppress(PeerctlError):
            store.revoke(lease)         # its key goes with it


def _renew(store, lease: int, token_id: str, stop: threading.Event) -> None:
    """Every third of the TTL: the lease kept alive and the record's expiry
    moved on, until ``stop`` or the token is gone (deleted by someone)."""
    while not stop.wait(TOKEN_TTL / 3):
        try:
            if store.keepalive(lease) <= 0 or not tokens.renew(store, token_id, TOKEN_TTL):
                return
        except PeerctlError:
            pass                        # etcd away for now: the next turn tries again
