"""A live move to the host that keeps the VM's replica copies only what
changed since the replica (:mod:`engine.hypervisor.moves.handoff`); the steps
``automations/moves.py`` sends instead of ``move_prepare`` when it can.

:func:`prepared_from_replica`, after ``claim_move`` picked the destination:

1. ``replica_of``: the VM's replica is complete, on the destination, with
   a checkpoint to start from; otherwise nothing is done (a whole copy);
2. ``replica_store`` there, ``handoff_take`` on the source (the last update
   and the split of the disk, the guest paused for a moment),
   ``replica_apply`` there;
3. ``move_describe`` again (the source's disks are now their top images)
   and ``handoff_prepare`` there: the replica becomes the VM's disk under
   an empty overlay, and the migration that follows is incremental.

A failure in 2 discards the update on both hosts and the move copies the
disks whole; the answer says why.  A failure in 3 leaves the replica
consumed (its record says so) and the move copies the disks whole.
"""
from engine.backups.replicas import replica_id

from automations._steps import resend

COPY_DEADLINE = 600.0


def prepared_from_replica(move, described):
    """``(prepared, via)``: ``move_prepare``'s answer and ``{seq,
    data_as_of, bytes, paused_ms}``; or ``(None, why)`` when the move must
    copy the disks whole."""
    known = yield from resend(move.step("replica_of", {}))
    replica = (known.value or {}).get("replica") if known.ok else None
    if not known.ok or not known.value.get("usable") or replica["host"] != move.dest:
        return None, None
    if not replica.get("checkpoint"):
        return None, "its replica has no checkpoint to start from"
    seq = known.value["next_seq"]

    def step(request, args, target):
        return move.step(request, {"seq": seq, "id": replica_id(move.uuid, seq), **args},
                         target, COPY_DEADLINE)

    needed = sum(d.get("capacity", 0) for d in described.get("disks") or ())
    store = yield from resend(step("replica_store", {"needed": needed}, move.dest))
    taken = None
    if store.ok:
        taken = yield from resend(step("handoff_take", {
            "store": store.value, "parent": {"id": replica_id(move.uuid, replica["seq"]),
                                             "checkpoint": replica["checkpoint"]}},
            move.source), tries=1)
    applied = None
    if taken is not None and taken.ok:
        applied = yield from resend(step("replica_apply", {
            "source": move.source, "expect": {"host": replica["host"], "seq": replica["seq"]},
            "taken": taken.value}, move.dest))
    if applied is None or not applied.ok:
        failed = applied if applied is not None else taken if taken is not None else store
        for where in (move.source, move.dest):
            yield from resend(step("replica_discard", {}, where))
        return None, f"the replica could not take the last update: {failed.error or failed.status}"
    again = yield from resend(move.step("move_describe", {}, move.source))
    if not again.ok:
        return None, f"{move.source}: {again.error or again.status}"
    prepared = yield from resend(step("handoff_prepare", {
        "owner": move.ctx.automation_id, "describe": again.value,
        "tops": taken.value["tops"]}, move.dest))
    if not prepared.ok:
        return None, f"{move.dest}: {prepared.error or prepared.status}"
    return prepared.value, {"seq": seq, "data_as_of": taken.value["time"],
                            "bytes": taken.value["bytes"],
                            "paused_ms": taken.value["paused_ms"]}
