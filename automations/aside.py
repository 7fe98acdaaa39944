"""``aside_delete``: delete disks kept aside after an HA restart
(``peerctl aside delete``), each on its host (``aside_delete`` request)."""
from engine.core.registry import automation
from engine.core.replay import Request

from automations._steps import resend

ACTION_DEADLINE = 300.0


def _delete_one(ctx, disk):
    done = yield from resend(Request("aside_delete", {"id": disk["id"]}, target=disk["host"],
                                     deadline=ACTION_DEADLINE, label=disk["name"]))
    return {**disk, "state": "deleted" if done.ok else "error",
            "error": None if done.ok else done.error or done.status}


@automation("aside_delete", version=1)
def aside_delete(ctx, disks):
    """``disks``: ``[{host, id, name, uuid}]`` as ``aside`` lists them."""
    results = yield ctx.all([ctx.worker(_delete_one, disk, label=disk["name"])
                             for disk in disks])
    failed = [r for r in results if r["error"]]
    if failed:
        from engine.errors import Failed
        raise Failed(f"{len(failed)} of {len(results)} could not be deleted: "
                     + "; ".join(f"{r['host']}/{r['name']}: {r['error']}" for r in failed[:5]),
                     {"disks": results})
    return {"disks": results}
