"""Backup schedules: backup schedule PATTERN --every DURATION [--keep-*],
backup schedule list, backup schedule delete (docs/cli.md, "Backups").

``schedule`` is a verb of ``backup`` (registered by ``backups.py``), and its
own first word is a verb (``list``, ``delete``) or the PATTERN of a
schedule, as ``backup``'s is.  The options of setting a schedule may come
before its pattern or after it."""
from __future__ import annotations

import argparse
import time

from engine.errors import UsageError
from engine.leases.times import human_span, parse_time
from engine.operations import backups as ops

from . import table, through
from .confirm import confirm
from .context import say
from .listing import listing
from .options import listing_options, yes_option
from .verb_or_patterns import add_patterns, told_choices, verbs_or_patterns

C = table.Column


def span(seconds) -> str:
    """An interval as ``--every`` takes it: ``90s``, ``30m``, ``12h``, ``7d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:g}{unit}"
    return f"{seconds:g}s"


def _from_now(text: str, shown) -> str:
    """An ISO time as ``shown(its seconds from now)``; not a time: as it is."""
    try:
        return shown(parse_time(text, "time") - time.time())
    except UsageError:
        return text


def coming(text: str) -> str:
    return _from_now(text, lambda s: f"in {human_span(s)}" if s > 0.5 else "due")


def ran(text: str) -> str:
    return _from_now(text, lambda s: f"{human_span(-s)} ago")


def kept(keep: dict) -> str:
    return ",".join(f"{option}={count}" for option, count in keep.items()) or "all"


COLUMNS = [C("schedule", "Id"), C("pattern", "Pattern"), C("every", "Every", span, True),
           C("keep", "Keep", kept), C("to", "To"), C("next", "Next", coming),
           C("last", "Last", ran), C("runs", "Runs", right=True),
           C("automation", "Automation")]
DEFAULT = ["schedule", "pattern", "every", "keep", "next", "last", "runs"]
JSON = ops.SCHEDULE_FIELDS
KEEPS = {"last": "the N newest backups", "daily": "the newest backup of each of N days",
         "weekly": "the newest backup of each of N ISO weeks"}


def not_taking(args, flags=("full", "protect", "dry_run", "detach")) -> None:
    """The options of taking a backup, given before a schedule verb that
    does not take them, are refused instead of ignored."""
    given = [flag for flag in flags if getattr(args, flag, False)]
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} is an option of backup "
                         "PATTERN..., not of backup schedule")


def cmd_schedule(ctx) -> int:
    args = ctx.args
    not_taking(args, ("full", "protect", "detach"))
    if getattr(args, "every", None) is None:
        raise UsageError("backup schedule PATTERN needs --every DURATION (see "
                         "backup schedule --help)")
    keep = {option: getattr(args, f"keep_{option}", None) for option in ops.KEEP_OPTIONS}
    dry = bool(getattr(args, "dry_run", False))
    to = getattr(args, "to", None)
    body = {"pattern": args.pattern, "every": args.every, "to": to, "dry_run": dry or None,
            **{f"keep_{option}": int(value) if isinstance(value, str) and value.isdigit()
               else value for option, value in keep.items()}}
    doc = through.write(ctx, lambda: ops.set_schedule(ctx, args.pattern, args.every, keep, to,
                                                      dry_run=dry),
                        "POST", "/v1/backups/schedules",
                        {k: v for k, v in body.items() if v is not None})
    where = f" to hosts matching {doc['to']!r}" if doc["to"] else ""
    state = f"would be {doc['would']}d (dry run, nothing written)" if dry else doc["state"]
    names = [vm["name"] for vm in doc["matching"]]
    now = (f"; it matches {len(names)} VM{'s' if len(names) != 1 else ''} now: "
           + ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")) if names else ""
    ctx.emit(doc, table.render([doc], table.select(COLUMNS, None, DEFAULT))
             + f"\nbackup schedule {doc['schedule']} {state}: {doc['pattern']} every "
             f"{span(doc['every'])}{where}, keeping {kept(doc['keep'])}{now}")
    if not names:
        say(f"peerctl: warning: {doc['pattern']!r} matches no VM now: the schedule backs up "
            "the VMs that match it at each run (backup schedule delete removes it)")
    return 0


def cmd_list(ctx) -> int:
    not_taking(ctx.args)
    return listing(ctx, lambda: through.read(ctx, lambda: ops.list_schedules(ctx),
                                             "/v1/backups/schedules"),
                   COLUMNS, DEFAULT, JSON, "pattern")


def _named(ctx, which: list[str]) -> list[dict]:
    """Through the API: the schedules ``which`` names, by id or pattern,
    from the listing (as :func:`ops.find_schedules` finds them in etcd)."""
    from engine.errors import NoSuch
    listed = ctx.api.call("GET", "/v1/backups/schedules")
    found = {}
    for word in which:
        doc = next((d for d in listed if word in (d["schedule"], d["pattern"])), None)
        if doc is None:
            raise NoSuch(f"no backup schedule {word!r} (see backup schedule list)",
                         result={"state": "failed", "schedules": []})
        found[doc["schedule"]] = doc
    return list(found.values())


def cmd_delete(ctx) -> int:
    args = ctx.args
    not_taking(args)
    chosen = ops.find_schedules(ctx, args.which) if ctx.api is None else _named(ctx, args.which)
    if len(chosen) > 1 and not args.yes:
        confirm("backup schedule delete", [f"{doc['schedule']} ({doc['pattern']}, every "
                                           f"{span(doc['every'])})" for doc in chosen],
                "schedules", cancelled={"state": "cancelled", "schedules": []})
    ids = [doc["schedule"] for doc in chosen]
    gone = ops.delete_schedules(ctx, ids) if ctx.api is None else [
        row for one in ids for row in ctx.api.call(
            "DELETE", f"/v1/backups/schedules/{one}")["schedules"]]
    shown = table.select(COLUMNS, "schedule,pattern,every,keep", DEFAULT)
    ctx.emit({"state": "deleted", "schedules": gone}, table.render(gone, shown)
             + f"\n{len(gone)} backup schedule{'s' if len(gone) != 1 else ''} deleted; "
             "the backups they took are kept (backup list shows them, backup delete "
             "removes them)")
    return 0


def setting_options(sub) -> None:
    """What ``backup schedule PATTERN`` takes, before its pattern or after it:
    on both parsers, with no default, so that neither undoes the other."""
    absent = argparse.SUPPRESS
    sub.add_argument("--every", metavar="DURATION", default=absent,
                     help="the interval between runs (required): seconds, or 30m, 12h, 7d")
    for option, what in KEEPS.items():
        sub.add_argument(f"--keep-{option}", metavar="N", default=absent, help=f"keep {what}")
    sub.add_argument("--to", metavar="HOSTGLOB", default=absent,
                     help="only back up to hosts matching this")
    sub.add_argument("--dry-run", action="store_true", default=absent,
                     help="only show the schedule and the VMs it matches now; write nothing")


def register(commands, backup_verbs) -> None:
    """``backup schedule`` and its verbs, among ``backup_verbs``."""
    sub = backup_verbs.add(
        "schedule", "back up VMs on a schedule, keeping what retention says",
        "python peerctl.py backup schedule 'web*' --every 1d --keep-last 3 --keep-weekly 4\n"
        "python peerctl.py backup schedule list", None,
        "backup schedule PATTERN --every DURATION backs up the VMs matching PATTERN (as "
        "they are at each run) every DURATION, then deletes what the --keep-* options do "
        "not keep (Proxmox's prune semantics, in the order last, daily, weekly; none: "
        "keep all; a backup a kept one builds on is kept). Scheduling the same PATTERN "
        "again changes its schedule. Runs are on durable timers: a run missed while no "
        "peer was up happens once when one is. A word that is a verb (list, delete) is "
        "not a pattern: a VM named so is '*/list'.")
    setting_options(sub)
    verbs = verbs_or_patterns(commands, sub, dest="schedule_what")
    p = add_patterns(
        verbs, sub.prog, "schedule backups of the VMs matching PATTERN (any first word "
        "but a verb)",
        "python peerctl.py backup schedule 'host1/db*' --every 12h --keep-daily 7",
        "Back up the VMs matching PATTERN every DURATION (at least 1s; 90s, 30m, 12h, 7d), "
        "keeping what --keep-* says; it prunes only the backups it made, never a "
        "protected one or one a restore reads. A bad pattern, interval or count exits 2 with "
        "nothing written. A pattern that matches no VM now is accepted, with a warning "
        "line: the schedule backs up what matches at each run. --dry-run shows the "
        "schedule and the VMs it matches now, writing nothing. A VM destroyed meanwhile is no longer backed up nor pruned: "
        "its backups stay until backup delete removes them.")
    p.add_argument("pattern", metavar="PATTERN", help="HOSTGLOB/VMGLOB or VMGLOB")
    setting_options(p)
    p.set_defaults(func=cmd_schedule)

    p = verbs.add("list", "list backup schedules", "python peerctl.py backup schedule list",
                  cmd_list,
                  "List the backup schedules: each one's pattern, interval, retention, "
                  "when it runs next and last ran, and how many runs it made. An "
                  "unreadable record is skipped with one warning line.")
    listing_options(p, COLUMNS, "pattern")

    p = verbs.add("delete", "delete backup schedules, keeping their backups",
                  "python peerctl.py backup schedule delete 'web*'", cmd_delete,
                  "Delete the schedules named, each by its ID (as backup schedule list "
                  "shows it) or the PATTERN it was made with; they take no backup from "
                  "then on. The backups they took are kept: backup delete removes them. "
                  "More than one asks for --yes; an unknown one exits 1, nothing deleted.")
    p.add_argument("which", nargs="+", metavar="ID|PATTERN")
    yes_option(p, "do not ask when several schedules are deleted")
    told_choices(verbs)
