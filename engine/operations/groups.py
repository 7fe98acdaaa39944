"""VM groups (``group list``, ``group show``) and where a boot would land.

A group exists while it has members (``groups/<name>/<uuid>``, see
:mod:`engine.placement.groups`); its rule is the one its VMs were booted with.
:func:`plan_landing` is the boot's plan: ``boot --dry-run`` shows it, and a
real boot asks each claim for its planned host first.
"""
from __future__ import annotations

from engine.errors import Failed, UsageError
from engine.wording import option, speaks_json, value

from .plans import failed_doc
from .select import NoMatch

__all__ = ["list_groups", "show_group", "group_for_boot", "plan_landing"]


def _rows(members: dict) -> list[dict]:
    from engine.natural import natural_key
    return sorted(({"name": m["name"], "uuid": m["uuid"], "host": m["host"],
                    "leaving": m.get("leaving"), "violated": bool(m.get("violated"))}
                   for m in members.values()), key=lambda row: natural_key(row["name"]))


def _doc(name: str, members: dict) -> dict:
    from engine.placement.groups import rule_of
    rows = _rows(members)
    return {"group": name, "rule": rule_of(members), "vms": rows,
            "violated": [row["name"] for row in rows if row["violated"]]}


def list_groups(ctx) -> list[dict]:
    """Every group: ``[{group, rule, vms, violated}]`` by name."""
    from engine.placement.groups import read_groups
    from engine.natural import natural_key
    groups = read_groups(ctx.store())
    return [_doc(name, groups[name]) for name in sorted(groups, key=natural_key)]


def show_group(ctx, name: str) -> dict:
    """``{group, rule, vms: [{name, uuid, host, leaving, violated}], violated}``."""
    from engine.placement.groups import check_name, read_group
    check_name(name)
    members, _ = read_group(ctx.store(), name)
    if not members:
        raise NoMatch(f"no group {name!r} (a group exists while it has VMs)")
    return _doc(name, members)


def group_for_boot(ctx, name: str, rule: str | None) -> dict:
    """``{name, rule}`` for VMs booted into group ``name``: a new group
    needs its rule, an existing one keeps its own (asking for the other is
    refused)."""
    from engine.placement.groups import check_name, check_rule, read_group, rule_of
    check_name(name)
    if rule is not None:
        check_rule(rule)
    have = rule_of(read_group(ctx.store(), name)[0])
    if have is None and rule is None:
        raise UsageError(f"group {value(name)} is new: say " + (
            f"{option('rule')}: \"spread\" or \"together\"" if speaks_json()
            else "--spread or --together"))
    if have is not None and rule is not None and rule != have:
        raise UsageError(f"group {value(name)} is {have}: its VMs cannot be booted " + (
            f"{option('rule')}: {value(rule)}" if speaks_json() else f"--{rule}"))
    return {"name": name, "rule": have or rule}


def plan_landing(ctx, vms: list[dict], on: str | None) -> list[dict]:
    """Where each of a boot's ``vms`` (the boot automation's VM specs)
    would land: ``[{name, host, alternates, error}]``, nothing claimed.  A
    VM booted into a lease is placed inside it at boot: no host here."""
    from engine.planning.model import Vm
    from engine.planning.placements import plan_boots
    from engine.planning.snapshot import read_hosts
    with ctx.placement() as placement:
        cluster = read_hosts(ctx.store(), placement)
    planned, rows = [], {}
    for vm in vms:
        if vm.get("reservation"):
            rows[vm["name"]] = {"name": vm["name"], "host": None, "alternates": [],
                                "error": None, "lease": vm["reservation"]}
            continue
        group = vm.get("group") or {}
        if group:
            cluster.rules.setdefault(group["name"], group["rule"])
        traits = [t for t in vm.get("required") or () if t]
        planned.append(Vm("boot/" + vm["name"], vm["name"], None, dict(vm["resources"]),
                          frozenset(t for t in traits if not t.startswith("!")),
                          frozenset(t[1:] for t in traits if t.startswith("!")),
                          group.get("name")))
    for row in plan_boots(cluster, planned, on=on):
        rows[row["name"]] = row
    return [rows[vm["name"]] for vm in vms]


def refuse_broken_rule(rows: list[dict]) -> None:
    """A boot whose plan finds no host for a VM because of its group is
    refused before it starts: one line naming the group."""
    broken = [row for row in rows if row.get("error") and row["error"].startswith("group ")]
    if broken:
        first = broken[0]
        more = f" (and {len(broken) - 1} more VMs)" if len(broken) > 1 else ""
        raise Failed(f"{first['name']}: {first['error']}{more}", result=failed_doc())
