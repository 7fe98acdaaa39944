"""The API's snapshots: create, list, revert, delete (docs/snapshots.md).

A revert always needs ``"yes": true`` (what the VM wrote since is lost), as
``snapshot revert`` always asks; a delete of several snapshots needs
``?yes=true``, as ``snapshot delete`` asks for several.  A snapshot is
named by its VM and its name, so its delete is a ``DELETE`` whose
confirmation is in the query, as ``DELETE /v1/leases/{name}``'s is."""
from __future__ import annotations

from engine.errors import UsageError
from engine.natural import sort_rows

from .core import (Answer, BOOL, Call, CONFIRM, obj, PATTERNS, route, started, STRING,
                   unconfirmed)

LIST_FIELDS = ["vm", "uuid", "host", "name", "time", "age_s", "memory", "state"]


@route("GET", "/v1/snapshots", "list snapshots, grouped by VM (from etcd only)",
       "snapshot list [PATTERN]",
       query=(("pattern", "string", "HOSTGLOB/VMGLOB or VMGLOB, on the VM's name or uuid"),))
def list_snapshots(ctx, call: Call) -> Answer:
    from engine.operations import snapshots
    rows = snapshots.list_snapshots(ctx, call.one("pattern"))
    return Answer(snapshots.grouped(sort_rows(rows, "vm,time", LIST_FIELDS)))


CREATE = obj({"patterns": PATTERNS, "name": STRING, "memory": BOOL, **CONFIRM}, ["patterns"])


@route("POST", "/v1/snapshots", "snapshot the VMs matching the patterns",
       "snapshot create PATTERN... [--name NAME] [--memory] --detach", write=True,
       body=CREATE, automation=True)
def create(ctx, call: Call) -> Answer:
    from engine.operations import snapshots
    b = call.body
    plan = snapshots.plan_create(ctx, b["patterns"], b.get("name"), memory=b.get("memory", False))
    return started(ctx, plan, b)


@route("POST", "/v1/vms/{name}/snapshots/{snapshot}/revert",
       "bring a VM back to one of its snapshots (always confirmed)",
       "snapshot revert VM NAME --yes --detach", write=True, body=obj(dict(CONFIRM)),
       automation=True)
def revert(ctx, call: Call) -> Answer:
    from engine.operations import snapshots
    plan = snapshots.plan_revert(ctx, call.path["name"], call.path["snapshot"])
    if call.body.get("dry_run"):
        return Answer(plan.dry_run())
    if not call.body.get("yes"):
        (row,) = plan.targets
        raise unconfirmed("snapshot revert (what the VM wrote since is lost)",
                          [f"{row['host']}/{row['name']} to {row['snapshot']}"], "VMs",
                          targets=plan.targets)
    return started(ctx, plan, {"yes": True})


@route("DELETE", "/v1/vms/{name}/snapshots", "delete snapshots of a VM",
       "snapshot delete VM NAME... --yes --detach", write=True, automation=True,
       query=(("snapshot", "string[]", "a snapshot's name, repeatable (one at least)"),
              ("yes", "boolean", "confirm deleting several"),
              ("dry_run", "boolean", "say what it would delete")))
def delete(ctx, call: Call) -> Answer:
    from engine.operations import snapshots
    names = call.query.get("snapshot") or []
    if not names:
        raise UsageError("query parameter snapshot is required (a snapshot's name, "
                         "repeatable)")
    plan = snapshots.plan_delete(ctx, call.path["name"], names)
    if call.flag("dry_run"):
        return Answer(plan.dry_run())
    if plan.ask and not call.flag("yes"):
        raise unconfirmed("snapshot delete", [f"{row['host']}/{row['name']} {row['snapshot']}"
                                              for row in plan.targets], plan.what, "?yes=true",
                          plan.targets)
    plan.ask = False
    return started(ctx, plan, {})
