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
   finishes its run whole) names the backups to delete, children first:
   only backups this schedule made, never a protected one or one a running
   restore reads; each is deleted on its target (which refuses a backup
   protected or held meanwhile: that VM's older ones wait for a later run);
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


def _run(ctx, schedule, record, run, tagged=True):
    """One run: back up, prune; a summary for the record.  ``tagged``: the
    backups record the schedule that made them (version 2)."""
    due = yield from _step("schedule_due", schedule)
    vms = due["vms"]
    mark = {"schedule": schedule} if tagged else {}
    results = (yield ctx.all([ctx.worker(backup_one, vm, record.get("to"), vm["full"], run,
                                         label=vm["name"], **mark) for vm in vms])) if vms else []
    plan = yield from _step("schedule_prune", schedule, uuids=[vm["uuid"] for vm in vms],
                            keep=record.get("keep") or {})
    deleted, errors = [], [f"{r['name']}: {r['error']}" for r in results if r.get("error")]
    errors += [f"{s['name']}: its host {s['host']} is down" for s in due["skipped"]]
    failed_vms = set()
    for entry in plan["drop"]:
        if tagged and entry["uuid"] in failed_vms:
            continue        # its parents wait: a chain is never cut in the middle
        done = yield from resend(Request("backup_delete", {"id": entry["id"]},
                                         target=entry["target"], deadline=STEP_DEADLINE,
                                         label=entry["vm"]))
        if done.ok:
            deleted.append(entry["id"])
        else:
            failed_vms.add(entry["uuid"])
            errors.append(f"deleting backup {entry['id']}: {done.error or done.status}")
    return {"backups": [r["backup"] for r in results if r.get("backup")],
            "deleted": deleted, "errors": errors[:20]}


@automation("backup_schedule", version=2, feature_level=4)
def backup_schedule(ctx, schedule):
    """Since version 2 each backup records ``schedule``: a run prunes only
    what this schedule made."""
    return (yield from _carry(ctx, schedule, True))


@automation("backup_schedule", version=1)
def backup_schedule_v1(ctx, schedule):
    """Untagged backups (never pruned since version 2): kept so that
    schedules started before version 2 replay; their next automation is a
    version 2 one."""
    return (yield from _carry(ctx, schedule, False))


def _carry(ctx, schedule, tagged):
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
        summary = yield from _run(ctx, schedule, record, runs, tagged)
        runs += 1
        yield from _step("schedule_ran", schedule, at=started, now=ctx.now(), summary=summary)
        if runs >= RUNS_PER_AUTOMATION:
            carried = yield from _step("schedule_continue", schedule, owner=ctx.automation_id)
            return {"schedule": schedule, "runs": runs, "state": "continued",
                    "next_automation": carried.get("automation")}
