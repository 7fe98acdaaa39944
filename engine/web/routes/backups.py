"""The API's backups: list, take, delete, protect, schedules, restore."""
from __future__ import annotations


from engine.errors import UsageError

from .core import (Answer, BOOL, Call, CONFIRM, listed, obj, PATTERNS, route, started, STRING,
                   unconfirmed)

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


@route("DELETE", "/v1/backups", "delete backups", "backup delete ID... --yes --detach",
       write=True, automation=True,
       query=(("id", "string[]", "a backup's id as backup list shows it, repeatable"),
              ("yes", "boolean", "confirm deleting several"),
              ("dry_run", "boolean", "only list the backups that would be deleted")))
def delete_backups(ctx, call: Call) -> Answer:
    ids = call.query.get("id") or []
    if not ids:
        raise UsageError("query parameter id is required (a backup's id, repeatable)")
    return _delete(ctx, ids, call.flag("yes"), call.flag("dry_run"))


@route("DELETE", "/v1/backups/{id}", "delete a backup", "backup delete ID --yes --detach",
       write=True, automation=True,
       query=(("dry_run", "boolean", "only list the backup that would be deleted"),))
def delete_backup(ctx, call: Call) -> Answer:
    return _delete(ctx, [call.path["id"]], True, call.flag("dry_run"))


def _delete(ctx, ids: list[str], yes: bool, dry_run: bool) -> Answer:
    """``backup delete``: backups lost with their removed host lose their
    records here and now (no automation); the others are deleted on their
    hosts by an automation (202)."""
    from engine.operations import backups
    lost = backups.delete_lost(ctx, ids, dry_run=True)
    if lost is not None:
        if not dry_run:
            if len(lost) > 1 and not yes:
                raise unconfirmed("backup delete", [f"{row['id']} ({row['vm']}, lost with "
                                                    f"{row['target']})" for row in lost],
                                  "backups", "?yes=true", lost)
            lost = backups.delete_lost(ctx, [row["id"] for row in lost]) or []
        return Answer({"automation": None, "state": "dry-run" if dry_run else "done",
                       "backups": lost})
    plan = backups.plan_delete(ctx, ids)
    if plan.ask and not yes and not dry_run:
        raise unconfirmed("backup delete", [f"{row['id']} ({row['vm']}, {row['kind']}, on "
                                            f"{row['target']})" for row in plan.targets],
                          plan.what, "?yes=true", plan.targets)
    return started(ctx, plan, {"yes": True, "dry_run": dry_run})


IDS = obj({"ids": {"type": "array", "items": STRING, "minItems": 1}}, ["ids"])


@route("POST", "/v1/backups/protect", "keep backups from every prune and delete",
       "backup protect ID...", write=True, body=IDS)
def protect_backups(ctx, call: Call) -> Answer:
    return _protecting(ctx, call.body["ids"], True)


@route("POST", "/v1/backups/unprotect", "let prunes and delete remove backups again",
       "backup unprotect ID...", write=True, body=IDS)
def unprotect_backups(ctx, call: Call) -> Answer:
    return _protecting(ctx, call.body["ids"], False)


@route("POST", "/v1/backups/{id}/protect", "keep a backup from every prune and delete",
       "backup protect ID", write=True)
def protect_backup(ctx, call: Call) -> Answer:
    return _protecting(ctx, [call.path["id"]], True)


@route("POST", "/v1/backups/{id}/unprotect", "let prunes and delete remove a backup again",
       "backup unprotect ID", write=True)
def unprotect_backup(ctx, call: Call) -> Answer:
    return _protecting(ctx, [call.path["id"]], False)


def _protecting(ctx, ids: list[str], protected: bool) -> Answer:
    """What ``backup protect``/``unprotect ID...`` prints."""
    from engine.operations import backups
    return Answer({"state": "protected" if protected else "unprotected",
                   "backups": backups.set_protected(ctx, ids, protected)})


@route("GET", "/v1/backups/schedules", "list backup schedules", "backup schedule list")
def list_schedules(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer(listed(backups.list_schedules(ctx), backups.SCHEDULE_FIELDS, "pattern"))


KEEP = {"type": "integer", "minimum": 0}
SCHEDULE = obj({"pattern": STRING, "every": {"type": ["string", "number"]}, "keep_last": KEEP,
                "keep_daily": KEEP, "keep_weekly": KEEP, "to": STRING, "dry_run": BOOL},
               ["pattern", "every"])


@route("POST", "/v1/backups/schedules", "back up VMs at every interval",
       "backup schedule PATTERN --every DURATION [--keep-* N] [--to HOSTGLOB] [--dry-run]",
       write=True, body=SCHEDULE)
def set_schedule(ctx, call: Call) -> Answer:
    from engine.operations import backups
    b = call.body
    keep = {option: b.get(f"keep_{option}") for option in backups.KEEP_OPTIONS}
    return Answer(backups.set_schedule(ctx, b["pattern"], b["every"], keep, b.get("to"),
                                       dry_run=b.get("dry_run", False)))


@route("DELETE", "/v1/backups/schedules", "delete backup schedules (their backups stay)",
       "backup schedule delete ID|PATTERN... --yes", write=True,
       query=(("which", "string[]", "a schedule's id or the pattern it was made with, "
                                    "repeatable"),
              ("yes", "boolean", "confirm deleting several")))
def delete_schedules(ctx, call: Call) -> Answer:
    from engine.operations import backups
    which = call.query.get("which") or []
    if not which:
        raise UsageError("query parameter which is required (a schedule's id or pattern, "
                         "repeatable)")
    chosen = backups.find_schedules(ctx, which)
    if len(chosen) > 1 and not call.flag("yes"):
        raise unconfirmed("backup schedule delete", [f"{doc['schedule']} ({doc['pattern']})"
                                                     for doc in chosen], "schedules",
                          "?yes=true", chosen)
    return Answer({"state": "deleted",
                   "schedules": backups.delete_schedules(ctx, [d["schedule"] for d in chosen])})


@route("DELETE", "/v1/backups/schedules/{id}", "delete a backup schedule (its backups stay)",
       "backup schedule delete ID", write=True)
def delete_schedule(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer({"state": "deleted",
                   "schedules": backups.delete_schedules(ctx, [call.path["id"]])})


RESTORE = obj({"backup": STRING, "as": STRING, "on": STRING, "dry_run": BOOL}, ["backup"])


@route("POST", "/v1/restores", "rebuild a VM from a backup",
       "restore BACKUP [--as NAME] [--on HOSTGLOB] [--dry-run] --detach", write=True, body=RESTORE,
       automation=True)
def restore(ctx, call: Call) -> Answer:
    from engine.operations import backups
    b = call.body
    return started(ctx, backups.plan_restore(ctx, b["backup"], b.get("as"), b.get("on")), b)
