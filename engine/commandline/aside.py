"""Disks kept aside after an HA restart: aside list, aside delete (docs/ha.md)."""
from __future__ import annotations

from engine.errors import Failed
from engine.operations import aside as ops

from . import table, through
from .follow import act
from .listing import listing
from .options import detach_option, dry_run_option, listing_options, yes_option

C = table.Column
ASIDE_COLUMNS = [C("host", "Host"), C("name", "Name"), C("uuid", "UUID"),
                 C("time", "Since"), C("bytes", "Size", table.human_bytes, True),
                 C("volumes", "Volumes", lambda v: ",".join(v)), C("reason", "Reason"),
                 C("id", "Id")]
ASIDE_DEFAULT = ["host", "name", "time", "bytes", "reason"]
ASIDE_JSON = ops.LISTED
DISK_COLUMNS = [C("host", "Host"), C("name", "Name"), C("state", "State"),
                C("error", "Error", lambda e: e or "-")]


def cmd_list(ctx) -> int:
    return listing(ctx, lambda: through.read(ctx, lambda: ops.list_aside(ctx, ctx.args.hostglob),
                                             "/v1/aside", pattern=ctx.args.hostglob),
                   ASIDE_COLUMNS,
                   ASIDE_DEFAULT, ASIDE_JSON, "host,name")


def deleted(ctx, automation: str, task: dict) -> int:
    done = (task.get("result") or {}).get("disks") or []
    doc = {"automation": automation, "state": task.get("state"), "disks": done}
    text = table.render(done, DISK_COLUMNS)
    ctx.emit(doc, (text + "\n" if text else "") + f"automation {automation} "
             f"{task.get('state')}")
    if task.get("state") != "done":
        raise Failed(f"aside_delete {automation} {task.get('state')}: "
                     f"{task.get('error') or ''}".rstrip(": "))
    return 0


def cmd_delete(ctx) -> int:
    plan = through.planned(ctx, lambda: ops.plan_delete(ctx, ctx.args.patterns),
                           "/v1/aside/delete", {"patterns": ctx.args.patterns}, "aside_delete",
                           "disk sets", "disks")
    return act(ctx, plan, deleted, "aside delete",
               [C("host", "Host"), C("name", "Name"), C("volumes", "Volumes", ",".join),
                C("id", "Id")])


def register(commands) -> None:
    sub = commands.add("aside", "disks of stale VM copies kept aside after an HA restart",
                       "python peerctl.py aside list\n"
                       "python peerctl.py aside delete 'host3/db1' --yes", None,
                       "When a host comes back after its HA VMs were restarted elsewhere, its "
                       "copies are stopped and undefined, and their disks kept aside: renamed "
                       "aside-UUID-TIME* in the host's pool, listed here until deleted on "
                       "purpose.")
    what = commands.verbs(sub)
    p = what.add("list", "list disks kept aside", "python peerctl.py aside list 'host3*'",
                 cmd_list, "List disks kept aside, by host.")
    p.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    listing_options(p, ASIDE_COLUMNS, "host,name")
    p = what.add("delete", "delete disks kept aside",
                 "python peerctl.py aside delete 'host3/db1' --dry-run", cmd_delete,
                 "Delete the disks kept aside matching a PATTERN, on their hosts (which "
                 "must be up). More than one asks for --yes.")
    p.add_argument("patterns", nargs="+", metavar="PATTERN",
                   help="HOSTGLOB/VMGLOB or VMGLOB (the VM's name or uuid)")
    yes_option(p, "do not ask when several match")
    dry_run_option(p, "only list the disks that would be deleted")
    detach_option(p)
