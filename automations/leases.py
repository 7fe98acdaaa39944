"""A lease's life: one automation from its grant to its end.

Every event is a logged step, so whichever member leads after a crash
carries on from the log, and each event runs exactly once:

1. **Until the start** the worker sleeps on a durable timer
   (``ctx.sleep_until``).  ``lease extend`` and ``lease delete`` nudge it;
   it reads the lease again (``lease_read``) whenever it wakes.
2. **Start** (``lease_start``): dead hosts are replaced, the reservation
   is held (traits, or the reservation consumer's allocation).  VMs that
   are not the lease's and still run on its hosts are migrated away (the
   moves automation's workers); what could not move is noted
   (``uncleared``).
3. **Active**: sleep until the warning (``--warn``; step ``lease_warn``,
   whose pre hook is the warning's hook), then until the end.  A nudge
   from the lease guard (a reserved host died) heals the lease
   (``lease_heal``: a replacement host, or ``degraded``).
4. **End** (``lease_end``): the ``on_end`` policy is applied to the VMs
   booted into the lease (destroy, stop or keep, under each VM's lock).
   Only once that is confirmed is the capacity released
   (``lease_release``).  An end that fails is noted (state ``error``,
   with why) and tried again every :data:`RETRY` seconds; ``lease delete``
   frees the capacity whatever happens.

``abort`` on the automation, or ``lease delete``, ends the lease now
(delete also forgets the record).
"""
from engine.core.registry import automation
from engine.core.replay import Request
from engine.errors import Failed

from automations._steps import resend
from automations.moves import _in_lanes
from automations.vms import locked_act_one, locked_destroy_one

RETRY = 30.0
WAIT_POLL = 1.0
STEP_DEADLINE = 120.0
CLEAR_PARALLEL = 4


EVENTS = ("lease_start", "lease_warn", "lease_end", "lease_release")


def _step(ctx, request, name, **args):
    """A step on whichever member leads; an event's answer is written at once,
    so that no crash of the leader makes it run twice."""
    reply = yield from resend(Request(request, {"name": name, **args},
                                      deadline=STEP_DEADLINE, label=name,
                                      write_at_once=request in EVENTS))
    if not reply.ok:
        raise Failed(f"lease {name}: {request}: {reply.error or reply.status}")
    return reply.value


def _read(ctx, name):
    return (yield from _step(ctx, "lease_read", name))["record"]


def _over(ctx, record) -> bool:
    """The lease must end now: deleted, aborted, or past its end."""
    return record is None or bool(record.get("deleting")) or ctx.aborted \
        or ctx.now() >= record["end"]


def _until_start(ctx, name, record):
    while record is not None and record["state"] == "pending" and not _over(ctx, record) \
            and ctx.now() < record["start"]:
        yield ctx.sleep_until(record["start"], label=name)
        record = yield from _read(ctx, name)
    return record


def _start(ctx, name):
    """Start once the leases before it have freed its hosts (back to back,
    the previous one's end may still be under way)."""
    while True:
        started = yield from _step(ctx, "lease_start", name)
        record = started["record"]
        if not started.get("wait"):
            break
        yield ctx.sleep_until(ctx.now() + WAIT_POLL, label=name)
        record = yield from _read(ctx, name)
        if _over(ctx, record):
            return record
    if started["foreign"]:
        moved = yield from _in_lanes(ctx, started["foreign"], None, False, CLEAR_PARALLEL)
        stuck = [{"name": m["name"], "host": m["from"], "error": m.get("error")}
                 for m in moved if m["state"] == "error" or m.get("error")]
        record = (yield from _step(ctx, "lease_note", name, uncleared=stuck))["record"]
    return record


def _until_end(ctx, name, record):
    while record is not None and record["state"] in ("active", "degraded") \
            and not _over(ctx, record):
        warn = record.get("warn")
        warn_at = record["end"] - warn if warn and not record.get("warned") else None
        if warn_at is not None and ctx.now() >= warn_at:
            record = (yield from _step(ctx, "lease_warn", name))["record"]
            continue
        woke = yield ctx.sleep_until(min(record["end"], warn_at or record["end"]), label=name)
        if woke.value.get("woke") == "nudge" and record["kind"] == "hosts":
            record = (yield from _step(ctx, "lease_heal", name))["record"]
        else:
            record = yield from _read(ctx, name)
    return record


def _apply_policy(ctx, vms, policy):
    """The lease's VMs destroyed, stopped or kept; the ones that failed."""
    if policy == "keep" or not vms:
        return []
    if policy == "destroy":
        workers = [ctx.worker(locked_destroy_one, vm, True, why="ended with its lease",
                              force=True, label=vm["name"]) for vm in vms]
    else:
        workers = [ctx.worker(locked_act_one, vm, "stop", True, False,
                              why="being stopped at its lease's end", label=vm["name"])
                   for vm in vms if vm["state"] != "shutoff"]
    results = yield ctx.all(workers)
    return [r for r in results if r["state"] == "error" or r.get("error")]


def _end(ctx, name, record):
    while True:
        ending = yield from _step(ctx, "lease_end", name)
        failed = yield from _apply_policy(ctx, ending["vms"], record.get("on_end", "destroy"))
        if not failed:
            break
        why = "; ".join(f"{r['name']}: {r['error']}" for r in failed[:5])
        yield from _step(ctx, "lease_note", name, state="error",
                         error=f"{len(failed)} VMs could not be handled at the end ({why}); "
                               f"trying again every {RETRY:.0f}s")
        yield ctx.sleep_until(ctx.now() + RETRY, label=name)
        record = yield from _read(ctx, name)
        if record is None or record.get("deleting") or ctx.aborted:
            break       # deleting frees the capacity whatever the VMs
    forget = record is None or bool(record.get("deleting"))
    released = yield from _step(ctx, "lease_release", name, forget=forget)
    return released["record"]


@automation("lease", version=1, cleans_up=True)
def lease(ctx, name):
    record = yield from _read(ctx, name)
    record = yield from _until_start(ctx, name, record)
    if record is not None and record["state"] == "pending" and not _over(ctx, record):
        record = yield from _start(ctx, name)
    record = yield from _until_end(ctx, name, record)
    if record is None:
        return {"lease": name, "state": "deleted"}
    if record["state"] == "ended":
        return {"lease": name, "state": "ended"}
    final = yield from _end(ctx, name, record)
    return {"lease": name, "state": "deleted" if (final or {}).get("deleted") else "ended"}
