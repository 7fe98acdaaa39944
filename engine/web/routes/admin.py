"""The API's upkeep of a cluster: scrub (the keys in etcd nobody can read)
and cluster verify (what is wrong with the cluster).

``cluster verify`` exits 1 when it finds a problem; its route answers 200
all the same, the problems listed in its document (an empty list: none).
It asks every live host through an automation and records each host's
outcome, so it is a write, and waits for the hosts' answers."""
from __future__ import annotations

from .core import Answer, Call, obj, route, unconfirmed


def _unreadable(ctx) -> tuple[list, list[dict]]:
    from engine.operations import admin
    found = admin.unreadable_keys(ctx)
    return found, [{"key": bad.key, "why": bad.why} for bad in found]


@route("GET", "/v1/scrub", "list the keys in etcd nobody can read", "scrub")
def scrub(ctx, call: Call) -> Answer:
    _, rows = _unreadable(ctx)
    return Answer({"keys": rows, "deleted": []})


@route("DELETE", "/v1/scrub", "delete the keys in etcd nobody can read",
       "scrub --delete --yes", write=True,
       query=(("yes", "boolean", "confirm (needed when there is any)"),
              ("dry_run", "boolean", "only list the keys that would be deleted")))
def scrub_delete(ctx, call: Call) -> Answer:
    from engine.operations import admin
    found, rows = _unreadable(ctx)
    if not found or call.flag("dry_run"):
        return Answer({"keys": rows, "deleted": []})
    if not call.flag("yes"):
        raise unconfirmed("scrub --delete", [f"{row['key']}: {row['why']}" for row in rows],
                          "unreadable keys", "?yes=true", rows)
    return Answer({"keys": rows, "deleted": admin.delete_keys(ctx, found)})


@route("POST", "/v1/cluster/verify", "say what is wrong with the cluster (200 either way)",
       "cluster verify", write=True, body=obj({}), waits=True)
def verify(ctx, call: Call) -> Answer:
    from engine.operations.verify import verify as verify_cluster
    return Answer(verify_cluster(ctx))
