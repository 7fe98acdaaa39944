"""The API's leases: list, one, create, extend, delete, the calendar.

``/v1/leases/calendar`` is the calendar, never a lease: aiohttp matches a
path without parameters before one with them, and no lease may be named
``calendar`` (:data:`engine.leases.model.RESERVED_NAMES`)."""
from __future__ import annotations

from engine.errors import UsageError

from .core import Answer, Call, label, listed, obj, POSITIVE, route, STRING, unconfirmed

@route("GET", "/v1/leases", "list leases", "lease list [PATTERN]",
       query=(("pattern", "string", "a glob on lease names"),))
def list_leases(ctx, call: Call) -> Answer:
    from engine.operations import lease_docs, leases
    return Answer(listed(leases.list_leases(ctx, call.one("pattern")),
                          lease_docs.LEASE_FIELDS, "start,lease"))


@route("GET", "/v1/leases/calendar", "who holds which host over the next days",
       "lease calendar [HOSTGLOB] [--days N] [--from T]",
       query=(("pattern", "string", "a glob on host names"),
              ("days", "string", "how far to look: N days, or a duration (default 7)"),
              ("from", "string", "where the timeline starts: now, +DURATION or ISO time "
                                 "(default now)")))
def calendar(ctx, call: Call) -> Answer:
    from engine.operations import leases
    doc, _ = leases.calendar(ctx, call.one("pattern"), call.one("from", "now"),
                             call.one("days", "7"))
    return Answer(doc)


@route("GET", "/v1/leases/{name}", "one lease", "lease show NAME")
def show_lease(ctx, call: Call) -> Answer:
    from engine.operations import leases
    return Answer(leases.show(ctx, call.path["name"]))


LEASE = obj({"name": STRING, "start": STRING, "end": STRING, "hosts": POSITIVE,
              "resources": STRING, "amount": POSITIVE, "required": STRING, "on": STRING,
              "on_end": {"enum": ["destroy", "stop", "keep"]}, "warn": STRING},
             ["name", "start", "end"])


@route("POST", "/v1/leases", "reserve hosts or capacity", "lease create NAME ...",
       write=True, body=LEASE)
def create_lease(ctx, call: Call) -> Answer:
    from engine.operations import leases
    b = call.body
    return Answer(leases.create(ctx, b["name"], b["start"], b["end"], hosts=b.get("hosts"),
                                resources=b.get("resources"), amount=b.get("amount"),
                                required=b.get("required"), on=b.get("on"),
                                on_end=b.get("on_end", "destroy"), warn=b.get("warn")), 201)


@route("POST", "/v1/leases/{name}/extend", "move a lease's end", "lease extend NAME --end T",
       write=True, body=obj({"end": STRING}, ["end"]))
def extend_lease(ctx, call: Call) -> Answer:
    from engine.operations import leases
    return Answer(leases.extend(ctx, call.path["name"], call.body["end"]))


@route("DELETE", "/v1/leases/{name}", "end a lease now and forget it",
       "lease delete NAME --yes", write=True, waits=True,
       query=(("yes", "boolean", "confirm when it destroys VMs"),
              ("dry_run", "boolean", "say what it would do"),
              ("timeout", "number", "seconds the lease's automation gets to end it before "
                                    "its capacity is freed here (default 120)")))
def delete_lease(ctx, call: Call) -> Answer:
    from engine.operations import leases
    timeout = _seconds(call.one("timeout", "120"))
    plan = leases.plan_delete(ctx, call.path["name"])
    if call.flag("dry_run"):
        return Answer(plan)
    if plan["destroys"] and not call.flag("yes"):
        raise unconfirmed(f"lease delete {call.path['name']} (destroying its VMs)",
                          [label(vm) for vm in plan["vms"]], "VMs", "?yes=true",
                          plan["vms"])
    return Answer(leases.delete(ctx, call.path["name"], timeout=timeout))


def _seconds(text: str) -> float:
    """``lease delete --timeout``'s check: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"bad timeout {text!r}: want seconds") from None
    if not 0 < value < float("inf"):
        raise UsageError(f"bad timeout {text!r}: want a positive, finite number of seconds")
    return value
