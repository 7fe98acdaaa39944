"""The API's hosts: list, usage, ping."""
from __future__ import annotations

from engine.operations import hosts

from .core import Answer, Call, HOSTGLOB, listed, obj, POSITIVE, route, started, STRING

@route("GET", "/v1/hosts", "list hosts", "hostlist [HOSTGLOB]", query=HOSTGLOB)
def list_hosts(ctx, call: Call) -> Answer:
    return Answer(listed(hosts.list_hosts(ctx, call.one("pattern")), hosts.LISTED,
                          hosts.ORDER))


@route("GET", "/v1/hoststats", "host usage", "hoststats [HOSTGLOB]", query=HOSTGLOB)
def host_stats(ctx, call: Call) -> Answer:
    return Answer(listed(hosts.list_hosts(ctx, call.one("pattern")), hosts.STATS,
                          hosts.ORDER))


PING = obj({"hosts": STRING, "rounds": POSITIVE})


@route("POST", "/v1/ping", "round trips to live hosts", "ping [HOSTGLOB] [--rounds N] --detach",
       write=True, body=PING, automation=True)
def ping(ctx, call: Call) -> Answer:
    return started(ctx, hosts.plan_ping(ctx, call.body.get("hosts"),
                                         call.body.get("rounds", 1)), call.body)
