"""The API's moves: balance, migrate, drain, undrain, evacuate, host removal."""
from __future__ import annotations

from engine.operations import balance
from engine.operations.moves import MAX_DOWNTIME_RANGE_MS

from .core import (Answer, BOOL, Call, CONFIRM, obj, PATTERNS, POSITIVE, route, started, STRING,
                   unconfirmed)

BALANCE = obj({"hosts": STRING, "max_moves": POSITIVE, "parallel": POSITIVE, **CONFIRM})


@route("POST", "/v1/balance", "even out hosts with live migrations",
       "balance [HOSTGLOB] [--max-moves N] [--parallel N] --detach", write=True, body=BALANCE,
       automation=True)
def start_balance(ctx, call: Call) -> Answer:
    body = call.body
    plan = balance.plan_balance(ctx, body.get("hosts"), max_moves=body.get("max_moves"),
                                parallel=body.get("parallel", 4))
    if not plan.targets and not body.get("dry_run"):
        return Answer({**plan.dry_run(), "state": "done"})      # nothing to move: nothing started
    return started(ctx, plan, body)


MIGRATE = obj({"patterns": PATTERNS, "to": STRING, "offline": BOOL, "parallel": POSITIVE,
                "bandwidth_mib": POSITIVE, "postcopy": BOOL,
                "max_downtime_ms": {"type": "integer", "minimum": MAX_DOWNTIME_RANGE_MS[0],
                                    "maximum": MAX_DOWNTIME_RANGE_MS[1]},
                **CONFIRM}, ["patterns"])


@route("POST", "/v1/migrate", "move VMs to other hosts", "migrate PATTERN... --detach",
       write=True, body=MIGRATE, automation=True)
def migrate(ctx, call: Call) -> Answer:
    from engine.operations import moves
    body = call.body
    plan = moves.plan_migrate(ctx, body["patterns"], body.get("to"),
                              offline=body.get("offline", False),
                              parallel=body.get("parallel", 4),
                              bandwidth_mib=body.get("bandwidth_mib"),
                              postcopy=body.get("postcopy", False),
                              max_downtime_ms=body.get("max_downtime_ms"))
    return started(ctx, plan, body)


@route("POST", "/v1/hosts/{pattern}/drain", "drain hosts: no new VMs land there",
       "drain HOSTGLOB --yes", write=True, body=obj(dict(CONFIRM)))
def drain(ctx, call: Call) -> Answer:
    return _drain(ctx, call, True)


@route("POST", "/v1/hosts/{pattern}/undrain", "undrain hosts", "undrain HOSTGLOB",
       write=True, body=obj({}))
def undrain(ctx, call: Call) -> Answer:
    return _drain(ctx, call, False)


def _drain(ctx, call: Call, drained: bool) -> Answer:
    from engine.operations import moves
    names = [h["host"] for h in moves.plan_drain(ctx, call.path["pattern"])]
    if drained and call.body.get("dry_run"):
        return Answer({"hosts": [{"host": h, "drained": True} for h in names],
                       "state": "dry-run"})
    if drained and len(names) > 1 and not call.body.get("yes"):
        raise unconfirmed("drain", names, "hosts")
    return Answer({"hosts": moves.set_drained(ctx, names, drained, by=call.user)})


EVACUATE = obj({"to": STRING, "parallel": POSITIVE, **CONFIRM})


@route("POST", "/v1/hosts/{pattern}/evacuate", "drain hosts and move every VM off them",
       "evacuate HOSTGLOB --yes --detach", write=True, body=EVACUATE, automation=True)
def evacuate(ctx, call: Call) -> Answer:
    from engine.operations import moves
    body = call.body
    plan = moves.plan_evacuate(ctx, call.path["pattern"], body.get("to"),
                               body.get("parallel", 4), planned=bool(body.get("dry_run")))
    if body.get("dry_run") or (plan.ask and not body.get("yes")):
        return started(ctx, plan, body)
    planned = moves.evacuate_after_drain(ctx, plan, by=call.user)
    if planned is None:
        return Answer({"automation": None, "state": "done", "vms": []})
    planned.ask = False
    return started(ctx, planned, body)


@route("POST", "/v1/hosts/{name}/remove", "take a host out of the cluster for good",
       "host remove NAME --yes", write=True, body=obj(CONFIRM))
def remove_host(ctx, call: Call) -> Answer:
    """No evacuation here (``POST /v1/hosts/{name}/evacuate`` first): a host
    with VMs is refused, as the command line refuses it without --evacuate."""
    from engine.operations import host_removal
    removal = host_removal.plan_removal(ctx, call.path["name"])
    if removal.done:
        return Answer({**host_removal.dry_run(removal, []), "state": "done"})
    host_removal.refuse_what_blocks(removal, evacuate=False)
    if call.body.get("dry_run"):
        return Answer(host_removal.dry_run(removal, []))
    if not call.body.get("yes"):
        raise unconfirmed(f"host remove {removal.host}", removal.removed, "changes")
    return Answer(host_removal.remove_host(ctx, removal.host, by=call.user))
