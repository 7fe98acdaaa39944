"""The API's graphs: a host's, or a VM's, CPU, memory, disk and network over
the last hour or day, from the ring buffers its host's peer keeps in memory
(engine/hypervisor/host/graphs.py; docs/page.md, "Graphs").

A peer answers for its own host (and the VMs on it) from its buffers; for
another host it asks that host's peer, at the ``api`` its host record
publishes, as the caller (:mod:`engine.web.relay`).  A host that is down,
whose peer serves no API or does not answer: ``503`` and one line.  A
caller known by a client certificate cannot be passed on: ``421`` naming
the API to ask (``api`` beside ``error``)."""
from __future__ import annotations

import time

from engine.core import keys
from engine.core.hosts import is_live_record
from engine.errors import Failed, NoSuch, Unavailable, UsageError
from engine.operations import vms
from engine.operations.select import NoMatch
from engine.operations.specs import check_name

from .core import Answer, Call, Refusal, route

SPANS = ("hour", "day")
SPAN = (("span", "string", "hour (the default: a point every 10 s) or day (every 5 min)"),)


def _span(call: Call) -> str:
    span = call.one("span", "hour")
    if span not in SPANS:
        raise UsageError(f"bad span {span!r} (want hour or day)")
    return span


@route("GET", "/v1/hosts/{name}/graphs", "a host's CPU, memory, disk and network over the "
       "last hour or day", "", query=SPAN)
def host_graphs(ctx, call: Call) -> Answer:
    name, span = check_name(call.path["name"], "host name"), _span(call)
    local = getattr(ctx, "graphs", None)     # this peer's own host's, or None
    if local is not None and local.host == name:
        return Answer({"host": name, **local.host_series(span, time.time())})
    return Answer(_from_its_peer(ctx, call, name, f"/v1/hosts/{name}/graphs", span))


@route("GET", "/v1/vms/{name}/graphs", "a VM's CPU, memory, disk and network over the "
       "last hour or day", "", query=SPAN)
def vm_graphs(ctx, call: Call) -> Answer:
    name, span = check_name(call.path["name"]), _span(call)
    try:
        rows = [row for row in vms.list_vms(ctx, [name], joined=()) if row["name"] == name]
    except NoMatch:
        rows = []
    if not rows:
        raise NoSuch(f"no VM {name!r}")
    host = rows[0].get("host")
    if not host:
        raise Failed(f"VM {name} is on no host yet: nothing measures it")
    local = getattr(ctx, "graphs", None)     # this peer's own host's, or None
    if local is not None and local.host == host:
        return Answer({"vm": name, "host": host,
                       **local.vm_series(rows[0]["uuid"], span, time.time())})
    return Answer(_from_its_peer(ctx, call, host, f"/v1/vms/{name}/graphs", span))


def _from_its_peer(ctx, call: Call, host: str, path: str, span: str) -> dict:
    """What ``host``'s own peer answers to ``path``, asked as the caller."""
    if call.relayed:
        raise Unavailable(f"this peer does not keep the graphs of host {host}, and was asked "
                          "by another peer already: the host records disagree")
    store = ctx.store()
    if store.get(keys.host_config(host)) is None:
        raise NoSuch(f"no host {host!r}")
    kv = store.get(keys.host(host))
    if kv is None or not is_live_record(kv):
        raise Unavailable(f"host {host} is down: its graphs were kept by its peer")
    url = kv.value.get("api")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise Unavailable(f"the peer of host {host} serves no API (peer --api): "
                          "its graphs cannot be reached")
    if not call.passed:
        raise Refusal(421, f"the graphs of host {host} are kept by its peer, at {url}: a "
                      "client certificate cannot be passed on to it, ask it there", {"api": url})
    from engine.web.relay import relayed    # it imports the routes' package: not at the top
    return relayed(url, path, {"span": span}, call.passed, getattr(ctx, "api_cacert", None),
                   host)
