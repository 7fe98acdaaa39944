"""Leases: lease create, list, show, extend, delete, calendar (docs/leases.md)."""
from __future__ import annotations

from engine.operations import lease_docs, leases as ops

from . import table, through
from .confirm import confirm
from .context import say
from .lease_views import calendar_text, detail_text
from .listing import listing
from .options import listing_options, positive, seconds, yes_option

C = table.Column
LEASE_COLUMNS = [C("lease", "Lease"), C("state", "State"), C("kind", "Kind"),
                 C("start", "Start"), C("end", "End"),
                 C("hosts", "Hosts", lambda h: ",".join(h) or "-"),
                 C("resources", "Slot", lambda r: r or "-"), C("amount", "Amount", right=True),
                 C("used", "VMs", right=True)]


def cmd_create(ctx) -> int:
    a = ctx.args
    body = {"name": a.name, "start": a.start, "end": a.end, "hosts": a.hosts,
            "resources": a.resources, "amount": a.amount, "required": a.required, "on": a.on,
            "on_end": a.on_end, "warn": a.warn}
    doc = through.write(ctx, lambda: ops.create(
        ctx, a.name, a.start, a.end, hosts=a.hosts, resources=a.resources, amount=a.amount,
        required=a.required, on=a.on, on_end=a.on_end, warn=a.warn),
        "POST", "/v1/leases", {k: v for k, v in body.items() if v is not None})
    ctx.emit(doc, f"lease {doc['lease']} granted ({doc['state']}): "
             f"{', '.join(doc['hosts'])}, {doc['start']} .. {doc['end']}")
    return 0


def cmd_list(ctx) -> int:
    return listing(ctx, lambda: through.read(ctx, lambda: ops.list_leases(ctx, ctx.args.pattern),
                                             "/v1/leases", pattern=ctx.args.pattern),
                   LEASE_COLUMNS,
                   [c.field for c in LEASE_COLUMNS], lease_docs.LEASE_FIELDS, "start,lease")


def cmd_show(ctx) -> int:
    doc = through.read(ctx, lambda: ops.show(ctx, ctx.args.name),
                       f"/v1/leases/{through.segment(ctx.args.name)}")
    ctx.emit(doc, detail_text(doc))
    return 0


def cmd_extend(ctx) -> int:
    doc = through.write(ctx, lambda: ops.extend(ctx, ctx.args.name, ctx.args.end), "POST",
                        f"/v1/leases/{through.segment(ctx.args.name)}/extend", {"end": ctx.args.end})
    ctx.emit(doc, f"lease {doc['lease']} now ends at {doc['end']}")
    return 0


def cmd_delete(ctx) -> int:
    args = ctx.args
    path = f"/v1/leases/{through.segment(args.name)}"
    plan = through.read(ctx, lambda: ops.plan_delete(ctx, args.name), path, dry_run=True) \
        if ctx.api is None else ctx.api.call("DELETE", path, query={"dry_run": True})
    vms = [f"{vm['host']}/{vm['name']}" for vm in plan["vms"]]
    if args.dry_run:
        ctx.emit(plan, f"lease delete would end lease {args.name} ({plan['lease_state']}) and "
                 f"{plan['on_end']} its VMs: {', '.join(vms) or 'none'}")
        return 0
    if plan["destroys"] and not args.yes:
        confirm("lease delete", vms, "VMs", cancelled={"lease": args.name, "state": "cancelled"},
                question=f"End lease {args.name} and destroy these {len(vms)} VMs?")
    if not ctx.json:
        say(f"ending lease {args.name}...")
    doc = through.write(ctx, lambda: ops.delete(ctx, args.name, timeout=args.timeout),
                        "DELETE", path, yes=True)
    ctx.emit(doc, f"lease {args.name} deleted")
    return 0


def cmd_calendar(ctx) -> int:
    args = ctx.args
    if ctx.api is not None:
        from .lease_views import calendar_parts
        doc = ctx.api.call("GET", "/v1/leases/calendar", query={
            "pattern": args.hostglob, "from": args.since, "days": args.days})
        parts = calendar_parts(doc)
    else:
        doc, parts = ops.calendar(ctx, args.hostglob, args.since, args.days)
    ctx.emit(doc, calendar_text(**parts))
    return 0


def register(commands) -> None:
    sub = commands.add(
        "lease", "reserve whole hosts or capacity over a time window",
        "python peerctl.py lease create maint --start +1h --end +1d --hosts 2\n"
        "python peerctl.py lease create ci --start now --end +8h "
        "--resources VCPU:2,MEMORY_MB:2048,DISK_GB:10 --amount 4\n"
        "python peerctl.py boot ci1 --resources VCPU:2,MEMORY_MB:2048,DISK_GB:10 "
        "--reservation ci\n"
        "python peerctl.py lease calendar 'host*' --days 3", None,
        "Leases reserve, from a start to an end, whole hosts (no "
        "other VM is placed there) or slots of capacity (held in placement). "
        "A lease is granted only if it fits over its whole window, atomically; "
        "VMs boot into it with boot --reservation, and at its end its VMs are "
        "destroyed, stopped or kept (--on-end). T is now, +DURATION (+2h, +1d) or "
        "an ISO date-time (UTC unless it says otherwise).")
    what = commands.verbs(sub)
    p = what.add("create", "grant a lease if it fits over its whole window",
                 "python peerctl.py lease create maint --start +1h --end +1d --hosts 2 "
                 "--required CUSTOM_SSD --warn 30m", cmd_create)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--start", required=True, metavar="T", help="now, +DURATION or ISO time")
    p.add_argument("--end", required=True, metavar="T", help="+DURATION (from now) or ISO time")
    p.add_argument("--hosts", type=positive, metavar="N", help="reserve N whole hosts")
    p.add_argument("--resources", metavar="SPEC", help="one slot: VCPU:2,MEMORY_MB:2048,...")
    p.add_argument("--amount", type=positive, metavar="K", help="how many slots of SPEC")
    p.add_argument("--required", metavar="TRAITS", help="traits the hosts must have")
    p.add_argument("--on", metavar="HOSTGLOB", help="only hosts matching this (host leases)")
    p.add_argument("--on-end", default="destroy", choices=("destroy", "stop", "keep"),
                   help="what happens to the lease's VMs at its end (default destroy)")
    p.add_argument("--warn", metavar="DURATION",
                   help="run the lease_warn step (its hook warns people) this long before "
                        "the end")
    p = what.add("list", "list leases, soonest first", "python peerctl.py lease list 'ci*'",
                 cmd_list)
    p.add_argument("pattern", nargs="?", metavar="GLOB")
    listing_options(p, LEASE_COLUMNS, "start,lease")
    p = what.add("show", "one lease with its reservations, events and VMs",
                 "python peerctl.py lease show maint", cmd_show)
    p.add_argument("name", metavar="NAME")
    p = what.add("extend", "move a lease's end (later if it still fits, or earlier)",
                 "python peerctl.py lease extend maint --end +2d", cmd_extend)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--end", required=True, metavar="T",
                   help="the new end: +DURATION (from now) or ISO time")
    p = what.add("delete", "end a lease now (its --on-end policy applies) and forget it",
                 "python peerctl.py lease delete maint --dry-run", cmd_delete,
                 "End a lease now and forget it: its --on-end policy applies to its VMs. "
                 "When that destroys VMs it lists them and asks for --yes.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--timeout", type=seconds, default=120.0, metavar="SECONDS",
                   help="how long the lease's automation gets to end it before this "
                        "command frees its capacity itself (default 120)")
    yes_option(p, "do not ask when the lease's VMs will be destroyed")
    p.add_argument("--dry-run", action="store_true",
                   help="only say what ending the lease would do to its VMs")
    p = what.add("calendar", "who holds which host over the next days, as a timeline",
                 "python peerctl.py lease calendar 'host1*' --days 3", cmd_calendar)
    p.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    p.add_argument("--days", default="7", metavar="N", help="how far to look (default 7)")
    p.add_argument("--from", dest="since", default="now", metavar="T",
                   help="where the timeline starts (default now)")
