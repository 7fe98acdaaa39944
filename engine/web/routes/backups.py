"""The API's backups: list, take, delete, protect, schedules, restore."""
from __future__ import annotations


from .core import Answer, BOOL, Call, CONFIRM, listed, obj, PATTERNS, route, started, STRING

@route("GET", "/v1/backups", "list backups", "backup list [PATTERN]",
       query=(("pattern", "string", "a VM pattern"),))
def list_backups(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer(listed(backups.list_backups(ctx, call.one("pattern")), backups.LISTED,
                          backups.ORDER))


BACKUP = obj({"patterns": PATTERNS, "to": STRING, "full": BOOL, "protect": BOOL, **CONFIRM},
              ["patterns"])


@route("POST", "/v1/backups", "back up VMs to another host", "backup PATTERN... --detach",
       write=True, body=BACKUP, automation=True)
def backup(ctx, call: Call) -> Answer:
    from engine.operations import backups
    b = call.body
    return started(ctx, backups.plan_backup(ctx, b["patterns"], b.get("to"),
                                             full=b.get("full", False),
                                             protect=b.get("protect", False)), b)


@route("DELETE", "/v1/backups/{id}", "delete a backup", "backup delete ID --yes --detach",
       write=True, automation=True)
def delete_backup(ctx, call: Call) -> Answer:
    from engine.operations import backups
    plan = backups.plan_delete(ctx, [call.path["id"]])
    return started(ctx, plan, {"yes": True})


@route("POST", "/v1/backups/{id}/protect", "keep a backup from every prune and delete",
       "backup protect ID", write=True)
def protect_backup(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer({"state": "protected",
                   "backups": backups.set_protected(ctx, [call.path["id"]], True)})


@route("POST", "/v1/backups/{id}/unprotect", "let prunes and delete remove a backup again",
       "backup unprotect ID", write=True)
def unprotect_backup(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer({"state": "unprotected",
                   "backups": backups.set_protected(ctx, [call.path["id"]], False)})


@route("GET", "/v1/backups/schedules", "list backup schedules", "backup schedule list")
def list_schedules(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer(listed(backups.list_schedules(ctx), backups.SCHEDULE_FIELDS, "pattern"))


KEEP = {"type": "integer", "minimum": 0}
SCHEDULE = obj({"pattern": STRING, "every": {"type": ["string", "number"]}, "keep_last": KEEP, "keep_daily": KEEP,
                 "keep_weekly": KEEP, "to": STRING}, ["pattern", "every"])


@route("POST", "/v1/backups/schedules", "back up VMs at every interval",
       "backup schedule PATTERN --every DURATION [--keep-* N] [--to HOSTGLOB]", write=True,
       body=SCHEDULE)
def set_schedule(ctx, call: Call) -> Answer:
    from engine.operations import backups
    b = call.body
    keep = {option: b.get(f"keep_{option}") for option in backups.KEEP_OPTIONS}
    return Answer(backups.set_schedule(ctx, b["pattern"], b["every"], keep, b.get("to")))


@route("DELETE", "/v1/backups/schedules/{id}", "delete a backup schedule (its backups stay)",
       "backup schedule delete ID", write=True)
def delete_schedule(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer({"state": "deleted",
                   "schedules": backups.delete_schedules(ctx, [call.path["id"]])})


RESTORE = obj({"backup": STRING, "as": STRING, "on": STRING, "dry_run": BOOL}, ["backup"])


@route("POST", "/v1/restores", "rebuild a VM from a backup",
       "restore BACKUP [--as NAME] [--on HOSTGLOB] --detach", write=True, body=RESTORE,
       automation=True)
def restore(ctx, call: Call) -> Answer:
    from engine.operations import backups
    b = call.body
    return started(ctx, backups.plan_restore(ctx, b["backup"], b.get("as"), b.get("on")), b)
