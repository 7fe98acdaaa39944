"""Leases: grant, list, show, extend and delete them, and the calendar of
who holds which host (docs/leases.md).  Times are given as ``now``,
``+DURATION`` or ISO date-times, and returned as ISO 8601 UTC."""
from __future__ import annotations

from engine.errors import NoSuch, UsageError
from engine.wording import option

from . import lease_docs
from .select import host_pattern
from .specs import parse_resources, parse_traits

__all__ = ["create", "list_leases", "show", "extend", "plan_delete", "delete", "calendar"]


def _time(text: str, what: str) -> float:
    from engine.leases.times import parse_time
    return parse_time(text, what)


def create(ctx, name: str, start: str, end: str, *, hosts: int | None = None,
           resources: str | None = None, amount: int | None = None,
           required: str | None = None, on: str | None = None, on_end: str = "destroy",
           warn: str | None = None) -> dict:
    """Grant lease ``name`` if it fits over its whole window: ``hosts``
    whole hosts, or ``amount`` slots of ``resources``."""
    from engine.leases import commands
    from engine.leases.model import check_new_name
    check_new_name(name)
    start_at, end_at = _time(start, option("start")), _time(end, option("end"))
    if (hosts is None) == (resources is None):
        raise UsageError(f"say what the lease holds: {option('hosts')} N, or "
                         f"{option('resources')} SPEC {option('amount')} K")
    slot = None
    if resources is not None:
        slot, traits = parse_resources(resources)
        if traits:
            raise UsageError(f"put a capacity lease's traits in {option('required')}")
        if amount is None:
            raise UsageError(f"a capacity lease needs {option('amount')} K "
                             "(how many slots of SPEC)")
    elif amount is not None:
        raise UsageError(f"{option('amount')} goes with {option('resources')}; a host lease "
                         f"counts {option('hosts')}")
    required = ",".join(parse_traits(required)) or None
    on = host_pattern(on) if on is not None else None
    from engine.leases.times import parse_span
    warn_s = parse_span(warn, option("warn")) if warn else None
    with ctx.placement() as placement:
        record = commands.create(ctx.store(), placement, name, start_at, end_at, count=hosts,
                                 resources=slot, amount=amount, required=required, on=on,
                                 on_end=on_end, warn=warn_s)
    return lease_docs.lease_doc(record)


def list_leases(ctx, pattern: str | None = None) -> list[dict]:
    """Leases matching ``pattern`` (a glob on names), soonest first; a
    pattern matching none: ``NoMatch``."""
    from engine.leases import records
    from .select import NoMatch, check_glob
    glob = check_glob(pattern, "lease pattern") if pattern is not None else "*"
    store = ctx.store()
    vms = records.vms_by_lease(store)
    rows = [lease_docs.lease_doc(r, vms.get(r["lease"], []))
            for r in records.all_leases(store, glob)]
    if not rows and pattern is not None:
        raise NoMatch(f"no lease matches {pattern!r}", result=[])
    return rows


def _read(ctx, name: str) -> dict:
    from engine.leases import records
    from engine.leases.model import check_name
    check_name(name)
    record = records.read(ctx.store(), name)
    if record is None:
        raise NoSuch(f"no lease {name!r}")
    return record


def show(ctx, name: str) -> dict:
    """One lease with its reservations, events and VMs."""
    from engine.leases import records
    record = _read(ctx, name)
    return lease_docs.lease_detail(record, records.lease_vms(ctx.store(), name))


def extend(ctx, name: str, end: str) -> dict:
    """Move the lease's end: later if it still fits, or earlier."""
    from engine.leases import commands, records
    from engine.leases.model import check_name
    check_name(name)
    end_at = _time(end, option("end"))
    with ctx.placement() as placement:
        record = commands.extend(ctx.store(), placement, name, end_at)
    return lease_docs.lease_doc(record, records.lease_vms(ctx.store(), name))


def plan_delete(ctx, name: str) -> dict:
    """What deleting lease ``name`` does: ``{lease, state: "dry-run",
    on_end, vms, destroys}``; ``destroys`` says whether its VMs go: its
    end still runs (an ended lease's has run; one in error left its VMs)."""
    from engine.leases import records
    record = _read(ctx, name)
    vms = records.lease_vms(ctx.store(), name)
    on_end = record.get("on_end", "destroy")
    return {"lease": name, "state": "dry-run", "lease_state": record["state"],
            "on_end": on_end, "vms": [{"name": vm["name"], "host": vm.get("host")}
                                      for vm in vms],
            "destroys": on_end == "destroy" and bool(vms)
            and record["state"] in ("active", "degraded", "ending")}


def delete(ctx, name: str, timeout: float = 120.0) -> dict:
    """End the lease now (its on-end policy applies) and forget it."""
    from engine.leases import commands
    from engine.leases.model import check_name
    check_name(name)
    with ctx.placement() as placement:
        return commands.delete(ctx.store(), placement, name, wait=timeout)


def calendar(ctx, pattern: str | None = None, since: str = "now",
             days: str = "7") -> tuple[dict, dict]:
    """Who holds which host from ``since`` over ``days``: the document,
    and what its text needs ``{entries, hosts, since, until, glob}``."""
    from engine.cluster import read_hosts
    from engine.leases import admission
    from engine.leases.times import parse_span
    glob = host_pattern(pattern)
    start = _time(since, "--from")
    until = start + parse_span(days + "d" if days.isdigit() else days, "--days")
    store = ctx.store()
    entries = admission.overlapping(store, start, until)
    hosts = [h["host"] for h in read_hosts(store)]
    parts = {"entries": entries, "hosts": hosts, "since": start, "until": until, "glob": glob}
    return lease_docs.calendar_doc(entries, hosts, start, until, glob), parts
