"""VM groups: group list, group show (docs/placement.md, "Groups").

A VM joins a group when it is booted into it (``boot --group NAME
--spread|--together``); a group exists while it has VMs."""
from __future__ import annotations

from engine.operations import groups as ops

from . import table, through
from .listing import listing
from .options import listing_options

C = table.Column
COLUMNS = [C("group", "Group"), C("rule", "Rule"), C("count", "VMs"), C("names", "Names"),
           C("violated", "Violated")]
DEFAULT = ["group", "rule", "count", "names", "violated"]
JSON_FIELDS = ["group", "rule", "vms", "violated"]      # the contract's {group, rule, vms}
MEMBER_COLUMNS = [C("name", "Name"), C("host", "Host"), C("leaving", "Leaving"),
                  C("violated", "Violated"), C("uuid", "UUID")]


def _listed(ctx) -> list[dict]:
    return [{**doc, "count": len(doc["vms"]), "names": [vm["name"] for vm in doc["vms"]]}
            for doc in through.read(ctx, lambda: ops.list_groups(ctx), "/v1/groups")]


def cmd_list(ctx) -> int:
    return listing(ctx, lambda: _listed(ctx), COLUMNS, DEFAULT, JSON_FIELDS, "group")


def cmd_show(ctx) -> int:
    doc = through.read(ctx, lambda: ops.show_group(ctx, ctx.args.name),
                       f"/v1/groups/{through.segment(ctx.args.name)}")
    broken = (f"; rule broken by {', '.join(doc['violated'])} (an HA restart had no other "
              "choice: balance puts it right)" if doc["violated"] else "")
    ctx.emit(doc, table.render(doc["vms"], MEMBER_COLUMNS)
             + f"\ngroup {doc['group']}: {doc['rule']}, {len(doc['vms'])} "
               f"VM{'s' if len(doc['vms']) != 1 else ''}{broken}")
    return 0


def register(commands) -> None:
    sub = commands.add(
        "group", "VM groups kept apart (--spread) or together: list, show",
        "python peerctl.py group list\n"
        "python peerctl.py group show web", None,
        "A group's rule is kept by every placement: boot, migrate, evacuate, HA restart, "
        "balance. spread: at most one of its VMs per host; together: all on one host. "
        "VMs join a group when booted with --group NAME --spread|--together; the group "
        "lasts while it has VMs.")
    what = commands.verbs(sub)
    p = what.add("list", "list groups: rule, VMs, any whose host breaks the rule",
                 "python peerctl.py group list", cmd_list,
                 "List every group with its rule and VMs. Violated names VMs whose host "
                 "breaks the rule (an HA restart that had no other choice).")
    listing_options(p, COLUMNS, "group")
    p = what.add("show", "one group's VMs and where they are",
                 "python peerctl.py group show web", cmd_show,
                 "Show group NAME: its rule and each VM's host (and the host it is "
                 "leaving during a move). A group without VMs does not exist: exit 1.")
    p.add_argument("name", metavar="NAME")
