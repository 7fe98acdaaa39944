"""The API's disks kept aside after an HA restart: list them, delete them
(docs/ha.md).  They are chosen by patterns, so deleting them is a ``POST``
with ``{patterns, yes, dry_run}``, as ``POST /v1/vms/destroy`` is."""
from __future__ import annotations

from .core import Answer, Call, CONFIRM, HOSTGLOB, listed, obj, PATTERNS, route, started


@route("GET", "/v1/aside", "list disks kept aside, by host", "aside list [HOSTGLOB]",
       query=HOSTGLOB)
def list_aside(ctx, call: Call) -> Answer:
    from engine.operations import aside
    return Answer(listed(aside.list_aside(ctx, call.one("pattern")), aside.LISTED,
                         aside.ORDER))


@route("POST", "/v1/aside/delete", "delete disks kept aside, on their hosts",
       "aside delete PATTERN... --detach", write=True,
       body=obj({"patterns": PATTERNS, **CONFIRM}, ["patterns"]), automation=True)
def delete_aside(ctx, call: Call) -> Answer:
    from engine.operations import aside
    return started(ctx, aside.plan_delete(ctx, call.body["patterns"]), call.body)
