"""A backup schedule's life: one automation that sleeps on a durable timer
until the next run is due, runs it, applies retention, and sleeps again.

Each run (``schedule_due`` at the schedule's ``next`` time):

1. the VMs matching the schedule's pattern now are backed up, each by the
   ``backup`` automation's worker (:func:`automations.backups.backup_one`:
   locked, verified, recorded); a VM whose chain has grown to
   :data:`~requests.backup_schedules.FULL_EVERY` backups gets a full one,
   so that chains end and retention can free them;
2. retention (``schedule_prune``, :mod:`engine.backups.retention`, with
   the ``keep`` the run started with: a schedule deleted meanwhile still
   finishes its run whole) names the backups to delete, children first;
   each is deleted on its target;
3. ``schedule_ran`` records when it ran and sets the next run one interval
   after this one started.

The timer is durable: an initiator that dies while it sleeps is replaced by
another member, which wakes at the same time.  A run missed because no
member was alive happens once, when one is back (the timer fires once, and
the next run counts from that one), never once per missed interval.

After :data:`RUNS_PER_AUTOMATION` runs the schedule carries on in a new
automation (``schedule_continue``, which swaps the record's automation in
the same transaction that creates the new one), so that no log grows
without end.  The automation ends when its schedule is deleted, or carried
by another automation.
"""
from engine.core.registry import automation
from engine.core.replay import Request

from automations._steps import needed, resend
from automations.backups import backup_one

STEP_DEADLINE = 120.0
RUNS_PER_AUTOMATION = 50


def _step(request, schedule, **args):
    return (yield from needed(Request(request, {"schedule": schedule, **args},
                                      deadline=STEP_DEADLINE, label=schedule),
                              f"backup schedule {schedule}"))


def _run(ctx, schedule, record, run):
    """One run: back up, prune; a summary for the record."""
    due = yield from _step("schedule_due", schedule)
    vms = due["vms"]
    results = (yield ctx.all([ctx.worker(backup_one, vm, record.get("to"), vm["full"], run,
                                         label=vm["name"]) for vm in vms])) if vms else []
    plan = yield from _step("schedule_prune", schedule, uuids=[vm["uuid"] for vm in vms],
                            keep=record.get("keep") or {})
    deleted, errors = [], [f"{r['name']}: {r['error']}" for r in results if r.get("error")]
    errors += [f"{s['name']}: its host {s['host']} is down" for s in due["skipped"]]
    for entry in plan["drop"]:
        done = yield from resend(Request("backup_delete", {"id": entry["id"]},
                                         target=entry["target"], deadline=STEP_DEADLINE,
                                         label=entry["vm"]))
        if done.ok:
            deleted.append(entry["id"])
        else:
            errors.append(f"deleting backup {entry['id']}: {done.error or done.status}")
    return {"backups": [r["backup"] for r in results if r.get("backup")],
            "deleted": deleted, "errors": errors[:20]}


@automation("backup_schedule", version=1)
def backup_schedule(ctx, schedule):
    runs = 0
    while True:
        record = (yield from _step("schedule_read", schedule))["record"]
        if record is None or record.get("automation") != ctx.automation_id or ctx.aborted:
            return {"schedule": schedule, "runs": runs,
                    "state": "deleted" if record is None else "ended"}
        if ctx.now() < record["next"]:
            yield ctx.sleep_until(record["next"], label=schedule)
            continue
        started = ctx.now()
        summary = yield from _run(ctx, schedule, record, runs)
        runs += 1
        yield from _step("schedule_ran", schedule, at=started, now=ctx.now(), summary=summary)
        if runs >= RUNS_PER_AUTOMATION:
            carried = yield from _step("schedule_continue", schedule, owner=ctx.automation_id)
            return {"schedule": schedule, "runs": runs, "state": "continued",
                    "next_automation": carried.get("automation")}
