"""Snapshots: ``snapshot_create`` snapshots VMs on their hosts,
``snapshot_revert`` brings a VM back to one, ``snapshot_delete`` deletes
them.  One worker per VM, all in parallel, each a runbook:

1. ``lock_vm`` (kind ``snapshot``): no move, destroy, backup or second
   snapshot operation of the VM meanwhile; each is refused with a line
   naming this one.
2. ``snapshot_create`` / ``snapshot_revert`` / ``snapshot_delete`` on the
   VM's host (:mod:`engine.hypervisor.data.snapshots`), sent again while its
   outcome is unknown: each is idempotent by (uuid, snapshot name).  The
   host writes or deletes the record ``snapshots/<uuid>/<name>`` after
   libvirt acted.
3. ``unlock_vm``.

Result ``{vms: [{name, uuid, host, state, snapshots: [{name, time,
memory}], dropped, error}]}`` (``state``: the VM's, after; ``dropped``:
the checkpoints the VM lost, so that its next backup or replica update is
full); the automation fails, keeping it, when any VM has an error.
"""
from engine.core.registry import automation
from engine.core.replay import Request

from automations._steps import finish, resend

STEP_DEADLINE = 120.0
SAVE_DEADLINE = 900.0       # a memory snapshot writes the guest's RAM into its disk


def _row(vm, error=None, state=None, snapshots=(), dropped=()):
    return {"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"],
            "state": "error" if error else (state or vm.get("state")),
            "snapshots": list(snapshots), "dropped": list(dropped), "error": error}


def _brief(value: dict) -> dict:
    return {"name": value.get("name") or value.get("snapshot"), "time": value.get("time"),
            "memory": value.get("memory")}


def _locked(ctx, vm, requests, why, deadline=STEP_DEADLINE):
    """Lock the VM, send ``requests`` (``[(request, args)]``) to its host one
    after the other, unlock: ``(replies, error)``; the first error stops."""
    def step(name, more, target=None, limit=STEP_DEADLINE):
        return Request(name, {"uuid": vm["uuid"], "name": vm["name"], **more},
                       target=target, deadline=limit, label=vm["name"])
    locked = yield from resend(step("lock_vm", {
        "host": vm["host"], "owner": ctx.automation_id, "kind": "snapshot", "why": why}))
    if not locked.ok:
        return [], locked.error or locked.status
    replies, error = [], None
    for request, args in requests:
        reply = yield from resend(step(request, args, vm["host"], deadline), tries=2)
        if not reply.ok:
            error = f"{reply.status}: {reply.error}" if reply.error else reply.status
            break
        replies.append(reply.value)
    yield from resend(step("unlock_vm", {"owner": ctx.automation_id}))
    return replies, error


def create_one(ctx, vm, snapshot, memory):
    replies, error = yield from _locked(
        ctx, vm, [("snapshot_create", {"snapshot": snapshot, "memory": bool(memory),
                                       "owner": ctx.automation_id})],
        "being snapshotted", SAVE_DEADLINE if memory else STEP_DEADLINE)
    if error:
        return _row(vm, error)
    (made,) = replies
    return _row(vm, state=made.get("state"), snapshots=[_brief(made)],
                dropped=made.get("dropped") or ())


def revert_one(ctx, vm, snapshot):
    replies, error = yield from _locked(ctx, vm, [("snapshot_revert", {"snapshot": snapshot})],
                                        "being reverted to a snapshot", SAVE_DEADLINE)
    if error:
        return _row(vm, error)
    (reverted,) = replies
    return _row(vm, state=reverted.get("state"),
                snapshots=[{"name": snapshot, "time": vm.get("time"),
                            "memory": reverted.get("memory")}],
                dropped=reverted.get("dropped") or ())


def delete_one(ctx, vm, snapshots):
    replies, error = yield from _locked(
        ctx, vm, [("snapshot_delete", {"snapshot": name}) for name in snapshots],
        "deleting its snapshots")
    gone = [{"name": r["snapshot"], "time": None, "memory": None} for r in replies]
    if error:
        return _row(vm, f"snapshot {snapshots[len(replies)]!r}: {error}", snapshots=gone)
    return _row(vm, state=replies[-1].get("state") if replies else None, snapshots=gone)


@automation("snapshot_create", version=1)
def snapshot_create(ctx, vms, snapshot, memory=False):
    """Snapshot each of ``vms`` (``[{name, uuid, host, state}]``) as
    ``snapshot``; ``memory``: with the guest's RAM."""
    results = yield ctx.all([ctx.worker(create_one, vm, snapshot, memory, label=vm["name"])
                             for vm in vms])
    return finish(results, "snapshotted")


@automation("snapshot_revert", version=1)
def snapshot_revert(ctx, vms, snapshot):
    """Revert each of ``vms`` (one, as the command line asks) to ``snapshot``."""
    results = yield ctx.all([ctx.worker(revert_one, vm, snapshot, label=vm["name"])
                             for vm in vms])
    return finish(results, "reverted")


@automation("snapshot_delete", version=1)
def snapshot_delete(ctx, vms):
    """Delete, for each of ``vms`` (``[{name, uuid, host, state,
    snapshots: [NAME...]}]``), its snapshots, one after the other."""
    results = yield ctx.all([ctx.worker(delete_one, vm, vm["snapshots"], label=vm["name"])
                             for vm in vms])
    return finish(results, "cleared of those snapshots")
