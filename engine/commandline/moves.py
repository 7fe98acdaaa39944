"""Moving VMs: migrate, drain, undrain, evacuate (docs/moves.md)."""
from __future__ import annotations

import argparse

from engine.errors import UsageError
from engine.operations import moves as ops

from . import table, through
from .confirm import confirm
from .follow import act, vm_outcome
from .options import detach_option, dry_run_option, positive, yes_option

C = table.Column
MOVE_COLUMNS = [C("name", "Name"), C("from", "From"), C("host", "Host"), C("mode", "Mode"),
                C("state", "State"), C("downtime_ms", "Downtime (ms)", right=True)]
MOVE_FIELDS = ["name", "uuid", "from", "host", "state", "mode", "downtime_ms", "bytes",
               "disk_bytes", "via_replica", "error"]
VIA_COLUMN = C("via_replica", "Disks", lambda v: "since replica" if v and v.get("used")
               else "whole")
# migrate and evacuate --dry-run: where each VM would go (the same choice its move's
# claim makes), or why no host can take it (and the dry run exits 1)
LANDING_COLUMNS = [C("name", "Name"), C("from", "From"), C("host", "To"), C("state", "State"),
                   C("error", "Why not")]


def move_outcome(ctx, automation: str, task: dict) -> int:
    """A move's result: ``{automation, state, vms: [{name, uuid, from, host,
    state, mode, downtime_ms, bytes, disk_bytes, via_replica, error}]}``
    (``via_replica``: ``{used, seq, data_as_of, bytes, paused_ms}`` when the
    move went to the VM's replica's host, ``{used: false, why}`` when it
    could not use it, else null); exit 1 unless every VM moved."""
    rows = (task.get("result") or {}).get("vms") or []
    columns = MOVE_COLUMNS + ([VIA_COLUMN] if any(r.get("via_replica") for r in rows) else [])
    return vm_outcome(ctx, automation, task, MOVE_FIELDS, columns, "moved")


def downtime_ms(text: str) -> int:
    """``--max-downtime``: whole milliseconds, within ops.MAX_DOWNTIME_RANGE_MS."""
    try:
        return ops.max_downtime(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _where(to) -> str:
    return f" to {'hosts matching ' + repr(to) if to else 'any other host'}"


def cmd_migrate(ctx) -> int:
    args = ctx.args
    body = {"patterns": args.patterns, "to": args.to, "offline": args.offline,
            "parallel": args.parallel, "bandwidth_mib": args.bandwidth,
            "postcopy": args.postcopy, "max_downtime_ms": args.max_downtime}
    plan = through.planned(
        ctx, lambda: ops.plan_migrate(ctx, args.patterns, args.to, offline=args.offline,
                                      parallel=args.parallel, bandwidth_mib=args.bandwidth,
                                      postcopy=args.postcopy,
                                      max_downtime_ms=args.max_downtime),
        "/v1/migrate", {k: v for k, v in body.items() if v is not None}, "migrate")
    return act(ctx, plan, move_outcome, dry_columns=LANDING_COLUMNS,
               dry_text=_where(plan.args.get("to", args.to)), would="would move")


def cmd_drain(ctx) -> int:
    """drain / undrain: two quick writes per host, no automation."""
    args = ctx.args
    drained = args.command == "drain"
    hosts = _drain_targets(ctx, args.hostglob)
    names = [h["host"] for h in hosts]
    if drained and getattr(args, "dry_run", False):
        ctx.emit({"hosts": [{"host": h, "drained": True} for h in names], "state": "dry-run"},
                 f"drain would drain {', '.join(names)}")
        return 0
    if drained and len(names) > 1 and not args.yes:
        confirm("drain", [f"{h['host']} ({h['vms']} VM{'s' if h['vms'] != 1 else ''})"
                          for h in hosts], "hosts", cancelled={"hosts": []})
    done = through.write(ctx, lambda: ops.set_drained(ctx, names, drained), "POST",
                         f"/v1/hosts/{through.segment(args.hostglob)}/{args.command}",
                         {"yes": True} if drained else {})
    done = done["hosts"] if ctx.api is not None else done
    staying = {h["host"]: h["vms"] for h in hosts}
    lines = []
    for row in done:
        line = f"{row['host']} {'drained' if row['drained'] else 'undrained'}"
        n = staying.get(row["host"]) if row["drained"] else 0
        if n:
            line += f" ({n} VM{'s' if n != 1 else ''} stay{'s' if n == 1 else ''} on it)"
        lines.append(line)
    ctx.emit({"hosts": done}, "\n".join(lines))
    return 0


def _drain_targets(ctx, pattern: str) -> list[dict]:
    """The hosts ``pattern`` matches, each with its count of ``vms``."""
    if ctx.api is None:
        return ops.plan_drain(ctx, pattern)
    named = ctx.api.call("POST", f"/v1/hosts/{through.segment(pattern)}/drain",
                         body={"dry_run": True})["hosts"]          # none: 404 naming it
    counts = {row["host"]: row.get("vms") or 0
              for row in ctx.api.call("GET", "/v1/hosts", query={"pattern": pattern})}
    return [{"host": row["host"], "vms": counts.get(row["host"], 0)} for row in named]


def cmd_evacuate(ctx) -> int:
    args = ctx.args
    if ctx.api is not None:
        return _evacuate_remotely(ctx)
    plan = ops.plan_evacuate(ctx, args.hostglob, args.to, args.parallel,
                             planned=args.dry_run)
    hosts = ", ".join(plan.args["hosts"])
    if args.dry_run:
        return act(ctx, plan, move_outcome, "evacuate", LANDING_COLUMNS,
                   _where(plan.args["to"]) + f", after draining {hosts}", "would move")
    if plan.ask and not args.yes:
        confirm("evacuate", [f"{row['from']}/{row['name']} ({row['state']})"
                             for row in plan.targets] or plan.args["hosts"],
                "VMs" if plan.targets else "hosts",
                cancelled={"automation": None, "state": "cancelled", "vms": []},
                question=None if plan.targets else f"Drain these {len(plan.args['hosts'])} hosts?")
    planned = ops.evacuate_after_drain(ctx, plan)
    if planned is None:
        ctx.emit({"automation": None, "state": "done", "vms": []},
                 f"{hosts} drained; no VMs to move")
        return 0
    planned.ask = False         # asked above
    return act(ctx, planned, move_outcome, "evacuate")


def _evacuate_remotely(ctx) -> int:
    """evacuate through the API: its route plans, drains and starts in one."""
    args = ctx.args
    path = f"/v1/hosts/{through.segment(args.hostglob)}/evacuate"
    body = {k: v for k, v in {"to": args.to, "parallel": args.parallel}.items()
            if v is not None}
    hosts = ", ".join(row["host"] for row in _drain_targets(ctx, args.hostglob))
    plan = through.planned(ctx, lambda: None, path, body, "evacuate")
    if args.dry_run:
        return act(ctx, plan, move_outcome, "evacuate", LANDING_COLUMNS,
                   _where(args.to) + f", after draining {hosts}", "would move")
    if plan.ask:
        vms = [row for row in plan.targets if isinstance(row, dict)]
        confirm("evacuate", [f"{row['from']}/{row['name']} ({row['state']})" for row in vms]
                or [str(row) for row in plan.targets],
                "VMs" if vms else "hosts",
                cancelled={"automation": None, "state": "cancelled", "vms": []},
                question=None if vms else f"Drain these {len(plan.targets)} hosts?")
        plan.ask = False
        doc = through.write(ctx, lambda: None, "POST", path, {**body, "yes": True})
        plan.automation, plan.answer = doc.get("automation"), doc
    if plan.automation is None:
        ctx.emit({"automation": None, "state": "done", "vms": []},
                 f"{hosts} drained; no VMs to move")
        return 0
    return act(ctx, plan, move_outcome, "evacuate")


def register(commands) -> None:
    sub = commands.add(
        "migrate", "move VMs to other hosts, live where they run",
        "python peerctl.py migrate db1 --to 'host2*'\n"
        "python peerctl.py migrate db1 --max-downtime 50\n"
        "python peerctl.py migrate 'host1/*web*' --yes --parallel 2\n"
        "python peerctl.py migrate 'host1/*' --dry-run", cmd_migrate,
        "Move every VM matching any PATTERN to another live, undrained host "
        "that fits it (placement picks; --to narrows the choice), all in one "
        "automation, N at a time (--parallel). Each VM's Mode says how it moved: "
        "'live' (it ran on, memory and disks copied), 'cold' (shut off, or "
        "stopped first with --offline: disks copied, left as it was), or "
        "'redefine' (libvirt's test driver: the domain is defined anew on the "
        "destination, no disk is copied). A live move pauses the guest once, "
        "for the switch-over: QEMU plans that pause to last at most --max-downtime "
        "(default 100 ms); each VM's Downtime column is the pause libvirt measured. "
        "A VM that could not move says why in "
        "the Error column and the command exits 1. On more than one "
        "VM it lists them and asks for --yes. A pattern matching nothing, or "
        "--to offering no host but the VM's own, exits 1 with nothing started. "
        "--dry-run shows where each VM would go, as its claim will choose, or why "
        "no host can take it (then it exits 1, as the move would fail).")
    sub.add_argument("patterns", nargs="+", metavar="PATTERN", help="HOSTGLOB/VMGLOB or VMGLOB")
    sub.add_argument("--to", metavar="HOSTGLOB", help="only move to hosts matching this")
    sub.add_argument("--offline", action="store_true",
                     help="stop a running VM, move it cold, start it again there")
    sub.add_argument("--parallel", type=positive, default=4, metavar="N",
                     help="VMs moved at the same time (default 4)")
    sub.add_argument("--bandwidth", type=positive, metavar="MIB",
                     help="cap each copy at MIB MiB/s (default: as fast as it goes)")
    sub.add_argument("--max-downtime", type=downtime_ms, metavar="MS",
                     help=f"longest pause a live move may plan for its switch-over, "
                          f"{ops.MAX_DOWNTIME_RANGE_MS[0]} to {ops.MAX_DOWNTIME_RANGE_MS[1]} "
                          f"ms (default {ops.DEFAULT_MAX_DOWNTIME_MS}; QEMU's own 300 in a "
                          f"cluster below feature level {ops.DOWNTIME_LEVEL})")
    sub.add_argument("--postcopy", action="store_true",
                     help="a live move that has not converged within its time (120 s per "
                          "GiB of RAM and disk) switches to post-copy instead of aborting")
    yes_option(sub)
    dry_run_option(sub, "only list the VMs that would move and where to, or why "
                        "nowhere; move nothing")
    detach_option(sub)

    sub = commands.add(
        "drain", "place no new VM on hosts; their VMs stay", "python peerctl.py drain 'host1*'",
        cmd_drain, "Drain every host matching HOSTGLOB, down ones too: no new VM is placed "
        "there (boot, migrate and evacuate skip it); the VMs on it stay. hostlist "
        "shows it drained. Two writes per host, no automation. More than one host "
        "asks for --yes.")
    sub.add_argument("hostglob", metavar="HOSTGLOB")
    yes_option(sub, "do not ask when several hosts match")
    dry_run_option(sub, "only list the hosts that would be drained")
    sub = commands.add(
        "undrain", "let hosts take new VMs again", "python peerctl.py undrain 'host1*'",
        cmd_drain, "Undrain every host matching HOSTGLOB: it takes new VMs again. No VM "
        "moves back.")
    sub.add_argument("hostglob", metavar="HOSTGLOB")

    sub = commands.add(
        "evacuate", "drain hosts and move every VM off them",
        "python peerctl.py evacuate host1 --yes\n"
        "python peerctl.py evacuate 'rack3-*' --to 'rack4-*' --parallel 8 --dry-run",
        cmd_evacuate,
        "Drain every host matching HOSTGLOB, then move all its VMs to other "
        "live, undrained hosts in one automation, N at a time (--parallel): live "
        "where running, cold where shut off ('redefine' on libvirt's test "
        "driver); see migrate. With more than one VM, or more than one host, it "
        "lists them and asks for --yes first (nothing is drained before that). "
        "With no VM, it only drains. A VM that could not move says why and the "
        "command exits 1; the hosts stay drained either way.")
    sub.add_argument("hostglob", metavar="HOSTGLOB")
    sub.add_argument("--to", metavar="HOSTGLOB", help="only move to hosts matching this")
    sub.add_argument("--parallel", type=positive, default=4, metavar="N",
                     help="VMs moved at the same time (default 4)")
    yes_option(sub, "do not ask when several VMs or hosts would move")
    dry_run_option(sub, "only list the VMs that would move; drain nothing")
    detach_option(sub)
