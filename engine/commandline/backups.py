"""Backups: backup PATTERN..., backup list, backup delete, backup schedule,
and restore.

``backup`` takes a verb or patterns: its first word names a verb (``list``,
``delete``, ``protect``, ``unprotect``, ``schedule``) or, as any other word, is the first PATTERN of
``backup PATTERN...`` (a VM named like a verb is ``'*/list'``).  The options
of taking a backup may come before the patterns or after them.  ``backup
schedule`` reads its first word the same way: ``list``, ``delete``, or the
PATTERN of a schedule."""
from __future__ import annotations

import argparse
import functools

from engine.errors import Failed, UsageError
from engine.leases.times import human_span
from engine.operations import backups as ops

from . import backup_schedules, table, through
from .confirm import confirm
from .follow import act, vm_outcome
from .listing import listing
from .options import detach_option, dry_run_option, listing_options
from .verb_or_patterns import add_patterns, told_choices, verbs_or_patterns

C = table.Column


def age(seconds) -> str:
    return f"{human_span(seconds)} ago"


BACKUP_COLUMNS = [C("id", "Id"), C("vm", "VM"), C("uuid", "UUID"), C("host", "Host"),
                  C("target", "Target"), C("time", "Time"), C("age_s", "Age", age, True),
                  C("kind", "Kind"), C("parent", "Parent"),
                  C("bytes", "Bytes", table.human_bytes, True),
                  C("consistency", "Consistency"), C("reason", "Reason"),
                  C("newest", "Newest", lambda n: "*" if n else ""),
                  C("schedule", "Schedule", lambda s: s or "-"),
                  C("protected", "Protected", lambda p: "yes" if p else ""),
                  C("lost", "Lost", lambda lost: f"with {lost['host']}" if lost else "")]
BACKUP_DEFAULT = ["id", "vm", "host", "target", "age_s", "kind", "bytes", "consistency",
                  "schedule", "protected", "newest"]
BACKUP_JSON = ops.LISTED
BACKUP_FIELDS = ["name", "uuid", "host", "state", "backup", "kind", "bytes", "consistency",
                 "target", "reason", "error"]
BACKUP_RESULT_COLUMNS = [C("name", "Name"), C("host", "Host"), C("target", "Target"),
                         C("kind", "Kind"), C("bytes", "Bytes", table.human_bytes, True),
                         C("consistency", "Consistency"), C("backup", "Backup")]
RESTORE_FIELDS = ["name", "uuid", "host", "state", "restored_from", "error"]
RESTORE_COLUMNS = [C("name", "Name"), C("host", "Host"), C("state", "State"),
                   C("uuid", "UUID"), C("restored_from", "From backup")]
DELETE_COLUMNS = [C("id", "Id"), C("vm", "VM"), C("target", "Target"), C("state", "State")]
PLANNED_DELETE_COLUMNS = [C("id", "Id"), C("vm", "VM"), C("target", "Target"),
                          C("kind", "Kind"), C("time", "Time")]


# -- backup PATTERN... ------------------------------------------------------------

def backed_up(ctx, automation: str, task: dict) -> int:
    rows = (task.get("result") or {}).get("vms") or []
    columns = BACKUP_RESULT_COLUMNS + ([C("reason", "Reason")]
                                       if any(row.get("reason") for row in rows) else [])
    return vm_outcome(ctx, automation, task, BACKUP_FIELDS, columns, "backed up")


def cmd_backup(ctx) -> int:
    args = ctx.args
    protect = getattr(args, "protect", False)
    body = {"patterns": args.patterns, "to": args.to, "full": args.full, "protect": protect}
    plan = through.planned(ctx, lambda: ops.plan_backup(ctx, args.patterns, args.to,
                                                        full=args.full, protect=protect),
                           "/v1/backups", {k: v for k, v in body.items() if v is not None},
                           "backup")
    to = plan.args.get("to", args.to)
    where = f" to a host matching {to!r}" if to else " to another host"
    return act(ctx, plan, backed_up, "backup", dry_text=where, would="would back up")


# -- backup list, backup delete ---------------------------------------------------

def not_of(args, verb: str, flags) -> None:
    """Options of ``backup PATTERN...`` given before ``verb`` that it does
    not take are refused, never ignored."""
    given = [flag for flag in flags if getattr(args, flag, None) not in (None, False)]
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} is not an option of backup {verb}")


def cmd_list(ctx) -> int:
    not_of(ctx.args, "list", ("to", "full", "protect", "yes", "dry_run", "detach"))
    return listing(ctx, lambda: through.read(ctx, lambda: ops.list_backups(ctx, ctx.args.pattern),
                                             "/v1/backups", pattern=ctx.args.pattern),
                   BACKUP_COLUMNS,
                   BACKUP_DEFAULT, BACKUP_JSON, "vm,time")


def deleted(ctx, automation: str, task: dict) -> int:
    """``{automation, state, backups: [{id, vm, target, state, error}]}``."""
    rows = [{f: row.get(f) for f in ("id", "vm", "target", "state", "error")}
            for row in (task.get("result") or {}).get("backups") or []]
    doc = {"automation": automation, "state": task.get("state"), "backups": rows}
    failed = [row for row in rows if row["error"] or row["state"] == "error"]
    columns = DELETE_COLUMNS + ([C("error", "Error")] if failed else [])
    text = table.render(rows, columns)
    ctx.emit(doc, (text + "\n" if text else "") + f"automation {automation} "
             f"{task.get('state')}: {len(rows) - len(failed)} of {len(rows)} backups deleted")
    if task.get("state") != "done" or failed:
        why = task.get("error") or ", ".join(f"{row['id']}: {row['error'] or 'error'}"
                                             for row in failed)
        raise Failed(f"backup_delete {automation} {task.get('state')}"
                     + (f": {why}" if why else ""))
    return 0


def cmd_delete(ctx) -> int:
    args = ctx.args
    not_of(args, "delete", ("to", "full", "protect"))
    if ctx.api is not None:
        return _delete_remotely(ctx)
    lost = ops.delete_lost(ctx, args.ids, dry_run=True)
    if lost is not None:
        return _delete_lost(ctx, lost)
    plan = ops.plan_delete(ctx, args.ids)
    if plan.ask and not args.yes and not args.dry_run:
        confirm("backup delete", [f"{row['id']} ({row['vm']}, {row['kind']}, on "
                                  f"{row['target']})" for row in plan.targets], plan.what,
                cancelled={"automation": None, "state": "cancelled", "backups": []})
        plan.ask = False        # asked above
    return act(ctx, plan, deleted, "backup delete", PLANNED_DELETE_COLUMNS)


def _delete_lost(ctx, rows: list[dict]) -> int:
    """Backups lost with their removed host: only their records go, no automation."""
    args = ctx.args
    if not args.dry_run:
        if len(rows) > 1 and not args.yes:
            confirm("backup delete", [f"{row['id']} ({row['vm']}, lost with {row['target']})"
                                      for row in rows], "backups",
                    cancelled={"automation": None, "state": "cancelled", "backups": []})
        rows = ops.delete_lost(ctx, [row["id"] for row in rows]) or []
    _lost_deleted(ctx, {"automation": None, "state": "dry-run" if args.dry_run else "done",
                        "backups": rows})
    return 0


def _lost_deleted(ctx, doc: dict) -> None:
    rows = doc["backups"]
    ctx.emit(doc, table.render(rows, DELETE_COLUMNS) + f"\n{len(rows)} backup records "
             + ("would be " if doc["state"] == "dry-run" else "") + "deleted (their data "
             "went with their removed host)")


def _delete_remotely(ctx) -> int:
    """backup delete through the API: ``DELETE /v1/backups?id=...``, which
    deletes the records of backups lost with their host at once (200) and
    starts an automation for the others (202)."""
    args = ctx.args
    plan = through.planned(ctx, lambda: None, "/v1/backups", {"id": args.ids},
                           "backup_delete", "backups", "backups", method="DELETE")
    answered = plan.dry if plan.dry is not None else plan.answer
    rows = answered["backups"] if answered is not None else plan.targets
    if rows and all(row.get("lost") for row in rows):
        if answered is None:            # several: asked here, then sent with yes
            if not args.yes:
                confirm("backup delete", [f"{row['id']} ({row['vm']}, lost with "
                                          f"{row['target']})" for row in rows], "backups",
                        cancelled={"automation": None, "state": "cancelled", "backups": []})
            answered = ctx.api.call("DELETE", "/v1/backups", query={"id": args.ids,
                                                                    "yes": True})
        _lost_deleted(ctx, answered)
        return 0
    if plan.ask and not args.yes and not args.dry_run:
        confirm("backup delete", [f"{row['id']} ({row['vm']}, {row['kind']}, on "
                                  f"{row['target']})" for row in plan.targets], plan.what,
                cancelled={"automation": None, "state": "cancelled", "backups": []})
        plan.ask = False
    return act(ctx, plan, deleted, "backup delete", PLANNED_DELETE_COLUMNS)


# -- backup protect, backup unprotect ----------------------------------------------

def protecting(protected: bool):
    verb = "protect" if protected else "unprotect"

    def cmd(ctx) -> int:
        not_of(ctx.args, verb, ("to", "full", "protect", "yes", "dry_run", "detach"))
        if ctx.api is None:
            rows = ops.set_protected(ctx, ctx.args.ids, protected)
        else:
            rows = ctx.api.call("POST", f"/v1/backups/{verb}",
                                body={"ids": ctx.args.ids})["backups"]
        shown = table.select(BACKUP_COLUMNS, "id,vm,target,kind,schedule,protected",
                             BACKUP_DEFAULT)
        ctx.emit({"state": f"{verb}ed", "backups": rows}, table.render(rows, shown)
                 + f"\n{len(rows)} backup{'s' if len(rows) != 1 else ''} {verb}ed"
                 + ("; no prune deletes them and backup delete refuses them"
                    if protected else ""))
        return 0
    return cmd


# -- restore ----------------------------------------------------------------------

RESTORE_DRY_COLUMNS = [C("name", "Name"), C("uuid", "UUID", lambda u: u or "(new)"),
                       C("restored_from", "From backup")]


def cmd_restore(ctx) -> int:
    args = ctx.args
    body = {"backup": args.backup, "as": args.as_name, "on": args.on}
    plan = through.planned(ctx, lambda: ops.plan_restore(ctx, args.backup, as_name=args.as_name,
                                                         on=args.on),
                           "/v1/restores", {k: v for k, v in body.items() if v is not None},
                           "restore")
    outcome = functools.partial(vm_outcome, fields=RESTORE_FIELDS, columns=RESTORE_COLUMNS,
                                verb="restored")
    where = f" on a host matching {args.on!r}" if args.on else ""
    return act(ctx, plan, outcome, dry_columns=RESTORE_DRY_COLUMNS,
               dry_text=f" from backup {args.backup}{where}", would="would restore")


# -- the parser -------------------------------------------------------------------

def taking_options(sub, default=None) -> None:
    """What ``backup PATTERN...`` takes, before its patterns or after them:
    on the ``backup`` parser with their defaults, on its patterns' parser
    with none (``argparse.SUPPRESS``), so that neither undoes the other."""
    absent = {} if default is None else {"default": default}
    sub.add_argument("--to", metavar="HOSTGLOB", **absent,
                     help="only back up to hosts matching this (default: any live, "
                          "undrained host other than the VM's own)")
    sub.add_argument("--full", action="store_true", **absent,
                     help="a full backup, even where an incremental one could be taken")
    sub.add_argument("--protect", action="store_true", **absent,
                     help="protect the new backups: no prune deletes them, backup delete "
                          "refuses them (until backup unprotect)")
    sub.add_argument("--yes", "-y", action="store_true", **absent,
                     help="do not ask when several VMs match")
    sub.add_argument("--dry-run", action="store_true", **absent,
                     help="only list the VMs that would be backed up")
    sub.add_argument("--detach", action="store_true", **absent,
                     help="print the automation id and return at once")


def register(commands) -> None:
    sub = commands.add(
        "backup", "back up VMs' disks to another host; list, delete and schedule backups",
        "python peerctl.py backup web1 --to 'host2*'\n"
        "python peerctl.py backup 'host1/*' --full --yes\n"
        "python peerctl.py backup list\n"
        "python peerctl.py backup delete ID --dry-run\n"
        "python peerctl.py backup protect ID\n"
        "python peerctl.py backup schedule 'web*' --every 1d --keep-last 7", None,
        "backup PATTERN... backs up, live, the disks of every VM matching a PATTERN "
        "(HOSTGLOB/VMGLOB or VMGLOB) to a backup pool on another live, undrained host "
        "(--to narrows the choice), in one automation. The first backup of a VM is "
        "full; later ones are incremental (only the blocks written since), unless "
        "--full, or the disk cannot carry a checkpoint (the result says why). A backup "
        "is listed once its data is complete on the target and verified. Crash-"
        "consistent, or filesystem-frozen when the guest agent answers. On more than "
        "one VM it lists them and asks for --yes. backup schedule takes backups on a "
        "schedule. --protect keeps the new backups from every prune (backup protect and "
        "backup unprotect change that later). A word that is a verb (list, delete, "
        "protect, unprotect, schedule) is not a pattern: a VM named so is '*/list'.")
    taking_options(sub)
    what = verbs_or_patterns(commands, sub)
    p = add_patterns(
        what, sub.prog, "back up the VMs matching the patterns (any first word but a verb)",
        "python peerctl.py backup db1 --to host2 --dry-run",
        "Back up the disks of every VM matching a PATTERN, each to another live, undrained "
        "host (matching --to), in one automation. A pattern matching nothing, a VM whose "
        "host is down, or no other host to back up to exits 1 with nothing started.")
    p.add_argument("patterns", nargs="+", metavar="PATTERN",
                   help="HOSTGLOB/VMGLOB or VMGLOB")
    taking_options(p, default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_backup)

    p = what.add("list", "list backups, each VM's newest marked",
                 "python peerctl.py backup list 'web*' --sort -time", cmd_list,
                 "List the backups of the VMs matching PATTERN (HOSTGLOB/VMGLOB or VMGLOB, "
                 "on the VM's name or uuid and the host it was on), or of every VM; the "
                 "newest backup of each VM is marked '*'. Age is counted from now.")
    p.add_argument("pattern", nargs="?", metavar="PATTERN")
    listing_options(p, BACKUP_COLUMNS, "vm,time")

    p = what.add("delete", "delete backups",
                 "python peerctl.py backup delete ID1 ID2 --yes", cmd_delete,
                 "Delete the backups ID... (as backup list shows them) on their target "
                 "hosts, which must be up. A backup that another one, kept, builds on "
                 "(its parent) is refused: delete both. More than one asks for --yes.")
    p.add_argument("ids", nargs="+", metavar="ID")
    # before the verb or after it, alike: neither's default undoes the other
    p.add_argument("--yes", "-y", action="store_true", default=argparse.SUPPRESS,
                   help="do not ask when several backups are deleted")
    p.add_argument("--dry-run", action="store_true", default=argparse.SUPPRESS,
                   help="only list the backups that would be deleted")
    p.add_argument("--detach", action="store_true", default=argparse.SUPPRESS,
                   help="print the automation id and return at once")

    for protected, verb in ((True, "protect"), (False, "unprotect")):
        p = what.add(
            verb, "keep backups from every prune and from backup delete" if protected
            else "let prunes and backup delete remove backups again",
            f"python peerctl.py backup {verb} ID", protecting(protected),
            "Protect the backups ID... (as backup list shows them): no schedule's "
            "retention prunes them and backup delete refuses them, until backup "
            "unprotect (Proxmox's protected flag). An unknown ID exits 1, nothing changed."
            if protected else
            "Unprotect the backups ID...: the schedule that made one may prune it again, "
            "and backup delete removes it. An unknown ID exits 1, nothing changed.")
        p.add_argument("ids", nargs="+", metavar="ID")
    backup_schedules.register(commands, what)
    told_choices(what)

    sub = commands.add(
        "restore", "rebuild a VM from a backup",
        "python peerctl.py restore ID\npython peerctl.py restore ID --as web1-copy "
        "--on 'host3*'", cmd_restore,
        "Rebuild a VM from backup BACKUP (an ID as backup list shows it) and the "
        "backups it builds on: a destroyed VM comes back under its old name and "
        "uuid; with --as NAME a new VM is made. It is placed where its size fits "
        "(--on narrows), its disks are copied from the backup's host and their "
        "checksums verified before it starts. A VM that still exists needs --as; a "
        "name in use, an unknown backup or one whose host is down exits 1 with "
        "nothing started.")
    sub.add_argument("backup", metavar="BACKUP")
    sub.add_argument("--as", dest="as_name", metavar="NAME",
                     help="restore as a new VM of this name (and a new uuid)")
    sub.add_argument("--on", metavar="HOSTGLOB", help="only place on hosts matching this")
    dry_run_option(sub, "only say what would be restored, and as what")
    detach_option(sub)
