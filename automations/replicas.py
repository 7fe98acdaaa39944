"""A VM's replication: one automation per replicated VM that sleeps on a
durable timer until its next update is due, makes it, and sleeps again.

Each update (``replica_plan`` says one is due, its VM's host is alive, and
another host can keep the replica):

1. ``lock_vm`` (kind ``replica``): no move, destroy or backup meanwhile.
   Those wait for the update to end (``lock_vm``); an HA restart of a VM
   whose host died takes the lock over.  A VM busy with something else is
   not updated this round.
2. ``move_describe`` (the disks' sizes) on the VM's host, ``replica_store``
   on the first candidate with room: the replica's host comes first, so
   that the update can be incremental.
3. ``replica_take`` on the VM's host: a backup job since the replica's
   checkpoint, copied to the replica's host (:mod:`engine.hypervisor.data.replicas`).
   When it cannot be incremental but the replica's host keeps a copy (the
   plan's ``base``: the previous replica, or the disks a stale copy left
   aside there after an HA restart), ``replica_base_map`` there and
   ``replica_take_delta`` on the VM's host send only the blocks that differ
   from it (:mod:`engine.hypervisor.data.replica_delta`: the base's block
   map is a volume there, which the VM's host reads through libvirt; only
   its name goes through the steps); a whole copy if that fails.
4. ``replica_apply`` on the replica's host: checksummed, recorded, written
   into the replica's disks.  The replica is whole before and after.
5. ``replica_prune`` on the VM's host (only the new checkpoint stays);
   ``replica_drop`` on a former replica host, once a new replica elsewhere
   is recorded.
6. ``unlock_vm``, and ``replica_noted`` records the attempt.

A step that fails, or whose peer stays lost, ends the update with
``replica_discard`` on both hosts; the recorded replica is untouched.

The automation ends when its record is gone or carried by another one;
when the VM is destroyed or the operator stops it, it first deletes the
replica (``replica_drop``) and the record.  After
:data:`UPDATES_PER_AUTOMATION` updates it carries on in a new automation,
so that no log grows without end.
"""
from engine.core.registry import automation
from engine.backups.replicas import replica_id
from engine.core.replay import Request

from automations._steps import disk_copy_deadline, first_willing, needed, resend

STEP_DEADLINE = 120.0
UPDATES_PER_AUTOMATION = 30


def _step(request, uuid, **args):
    return (yield from needed(Request(request, {"uuid": uuid, **args},
                                      deadline=STEP_DEADLINE, label=uuid),
                              f"replication of {uuid}"))


def update_once(ctx, plan):
    """One update (steps 1-6); the attempt ``{time, seq, kind, bytes,
    host, error}`` to record."""
    vm, seq = plan["vm"], plan["seq"]
    started = ctx.now()

    def step(request, args, target=None, deadline=STEP_DEADLINE):
        # the update's id in every step: the hosts' sweeps spare what it names
        return Request(request, {"uuid": vm["uuid"], "name": vm["name"], "seq": seq,
                                 "id": replica_id(vm["uuid"], seq), **args},
                       target=target, deadline=deadline, label=vm["name"])

    def attempt(error=None, taken=None, where=None):
        taken = taken or {}
        return {"time": started, "seq": seq, "kind": taken.get("kind"),
                "bytes": taken.get("bytes"), "host": where, "error": error,
                "reason": taken.get("reason")}

    locked = yield from resend(step("lock_vm", {
        "host": vm["host"], "owner": ctx.automation_id, "kind": "replica",
        "why": "its replica is being updated"}))
    if not locked.ok:
        return attempt(f"not updated: {locked.error or locked.status}")
    error, taken, store = None, None, None
    described = yield from resend(step("move_describe", {}, vm["host"]))
    if not described.ok:
        error = f"{vm['host']}: {described.error or described.status}"
    else:
        disks = described.value.get("disks") or []
        needed = sum(d.get("capacity", 0) for d in disks)
        store, refused = yield from first_willing(
            plan["candidates"], lambda candidate: step("replica_store", {"needed": needed},
                                                       candidate))
        if store is None:
            error = "no host could keep it: " + refused
        else:
            error, taken = yield from _update(step, vm, plan, store, disks)
    if error and store is not None:
        for where in (vm["host"], store["host"]):
            yield from resend(step("replica_discard", {}, where))
    yield from resend(step("unlock_vm", {"owner": ctx.automation_id}))
    return attempt(error, taken, store and store["host"])


def _update(step, vm, plan, store, disks):
    """``(error, taken)``: taken on the VM's host, applied on the replica's."""
    first = plan["candidates"][0]
    parent = plan["parent"] if store["host"] == first else None
    base = plan.get("base") if store["host"] == first else None
    why_full = plan.get("why_full") or (None if parent else
                                        f"the replica's host {first} could not take it")
    taken = None
    if parent is not None:
        taken = yield from resend(step("replica_take", {
            "store": store, "parent": parent, "why_full": why_full,
            **({"base": True} if base else {})},
            vm["host"], disk_copy_deadline(disks)), tries=2)
        if taken.ok and taken.value.get("wants_base"):
            why_full, taken = taken.value["wants_base"], None
    volumes = None
    if taken is None and base is not None:
        taken, volumes = yield from _delta(step, vm, store, disks, base, why_full)
        if taken is None:
            why_full = f"{why_full} (no delta: {volumes})"
    if taken is None:
        taken = yield from resend(step("replica_take", {
            "store": store, "parent": None, "why_full": why_full}, vm["host"],
            disk_copy_deadline(disks)), tries=2)
    if not taken.ok:
        return f"{vm['host']}: {taken.error or taken.status}", None
    if taken.value.get("unchanged"):
        return None, {"kind": "unchanged", "bytes": 0}
    applied = yield from resend(step("replica_apply", {
        "source": vm["host"], "expect": plan["expect"], "taken": taken.value,
        "base": volumes}, store["host"], disk_copy_deadline(disks)))
    if not applied.ok:
        return f"{store['host']}: {applied.error or applied.status}", None
    if taken.value.get("checkpoint"):
        yield from resend(step("replica_prune", {"keep": taken.value["checkpoint"]},
                               vm["host"]))
    for old in sorted({plan.get("old"), plan.get("frozen_on")} - {None, store["host"]}):
        yield from resend(step("replica_drop", {}, old))
    return None, taken.value


def _delta(step, vm, store, disks, base, why):
    """``(taken, base volumes)`` of an update that sends only the blocks
    differing from ``base``, kept on the replica's host; ``(None, why
    not)`` when it cannot be made (a whole copy is then sent)."""
    mapped = yield from resend(step("replica_base_map", {"base": base}, store["host"],
                                    disk_copy_deadline(disks)))
    if not mapped.ok:
        return None, f"{store['host']}: {mapped.error or mapped.status}"
    if not mapped.value.get("maps"):
        return None, "the base has no content to compare"
    taken = yield from resend(step("replica_take_delta", {
        "store": store, "maps": mapped.value["maps"], "why": why, "what": base.get("what")}, vm["host"], disk_copy_deadline(disks)), tries=2)
    if not taken.ok:
        return None, f"{vm['host']}: {taken.error or taken.status}"
    return taken, mapped.value["volumes"]


@automation("replicate", version=1)
def replicate(ctx, uuid):
    updates = 0
    while True:
        plan = yield from _step("replica_plan", uuid, owner=ctx.automation_id)
        state = plan["state"]
        if state in ("gone", "ended"):
            return {"uuid": uuid, "updates": updates, "state": state}
        if state == "stop" or ctx.aborted:
            replica = plan.get("replica")
            if replica:
                yield from resend(Request("replica_drop", {"uuid": uuid, "all": True},
                                          target=replica["host"], deadline=STEP_DEADLINE,
                                          label=uuid))
            yield from _step("replica_ended", uuid, owner=ctx.automation_id)
            return {"uuid": uuid, "updates": updates, "state": "stopped",
                    "why": plan.get("why") or "aborted"}
        if state == "wait":
            if plan.get("why"):
                yield from _step("replica_noted", uuid, owner=ctx.automation_id,
                                 attempt={"time": ctx.now(), "error": plan["why"]})
            yield ctx.sleep_until(plan["next"], label=uuid)
            continue
        done = yield from update_once(ctx, plan)
        updates += 1
        yield from _step("replica_noted", uuid, owner=ctx.automation_id, attempt=done)
        if updates >= UPDATES_PER_AUTOMATION:
            carried = yield from _step("replica_continue", uuid, owner=ctx.automation_id)
            return {"uuid": uuid, "updates": updates, "state": "continued",
                    "next_automation": carried.get("automation")}
