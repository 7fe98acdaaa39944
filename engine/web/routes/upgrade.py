"""The API's rolling upgrade: ``upgrade --to VERSION``, ``upgrade
--rollback``, and the cluster's feature level."""
from __future__ import annotations

from engine.errors import UsageError
from engine.operations import tasks, upgrade
from engine.wording import option

from .core import Answer, BOOL, Call, CONFIRM, obj, POSITIVE, route, STRING, unconfirmed

UPGRADE = obj({"to": STRING, "rollback": BOOL, "hosts": STRING, "parallel": POSITIVE,
               "deadline": {"type": "number", "exclusiveMinimum": 0}, **CONFIRM})


@route("POST", "/v1/upgrade", "move hosts to another release, one at a time, or back",
       "upgrade --to VERSION | --rollback [HOSTGLOB] [--parallel N] [--deadline SECONDS] "
       "--yes --detach", write=True, body=UPGRADE, automation=True)
def start_upgrade(ctx, call: Call) -> Answer:
    body = call.body
    if bool(body.get("to")) == bool(body.get("rollback")):
        raise UsageError(f"upgrade needs {option('to')} or {option('rollback')} "
                         "(one of them)")
    options = {"parallel": body.get("parallel", 1), "deadline": body.get("deadline")}
    if body.get("rollback"):
        plan = upgrade.plan_rollback(ctx, body.get("hosts"), **options)
    else:
        plan = upgrade.plan_upgrade(ctx, body["to"], body.get("hosts"), **options)
    if body.get("dry_run"):
        return Answer(plan.dry_run())
    if not body.get("yes"):
        raise unconfirmed("upgrade", [f"{r['host']}: {r['from']} -> {r['to']}"
                                      for r in plan.targets], "hosts", targets=plan.targets)
    automation = tasks.start(ctx, plan)
    return Answer({"automation": automation}, 202, f"/v1/automations/{automation}")


@route("GET", "/v1/cluster/feature-level", "the cluster's feature level, and each live "
       "host's version and the highest level it supports", "cluster feature-level")
def feature_level(ctx, call: Call) -> Answer:
    return Answer(upgrade.feature_level(ctx))


@route("POST", "/v1/cluster/feature-level", "raise the cluster's feature level (refused "
       "while a live host does not support it; it never goes down)",
       "cluster feature-level N", write=True, body=obj({"level": POSITIVE}, ["level"]))
def raise_feature_level(ctx, call: Call) -> Answer:
    return Answer(upgrade.raise_feature_level(ctx, call.body["level"]))
