"""Replicas: replicate PATTERN... --every DURATION [--to HOSTGLOB]
[--from-image-if-no-replica], and replicate PATTERN... --stop (docs/cli.md,
"Replicas"; vmlist -o +replica shows each VM's)."""
from __future__ import annotations

from engine.core.validate import parse_duration
from engine.errors import UsageError
from engine.operations import replicas as ops

from . import table, through
from .backup_schedules import span
from .confirm import confirm
from .options import dry_run_option, yes_option

C = table.Column
COLUMNS = [C("name", "Name"), C("host", "Host"),
           C("replica_host", "Replica", lambda h: h or "none yet"),
           C("every", "Every", span, True), C("state", "State")]


def cmd_replicate(ctx) -> int:
    args = ctx.args
    if args.stop:
        given = [flag for flag in ("every", "to", "from_image_if_no_replica")
                 if getattr(args, flag, None) not in (None, False)]
        if given:
            raise UsageError(f"--stop takes no --{given[0].replace('_', '-')}")
        return _stop(ctx)
    if args.every is None:
        raise UsageError("replicate needs --every DURATION (at least 10s), or --stop")
    every = ops.check_every(parse_duration(args.every, "--every"))
    body = {"patterns": args.patterns, "every": args.every, "to": args.to,
            "from_image_if_no_replica": args.from_image_if_no_replica or None,
            "dry_run": args.dry_run or None}
    doc = through.write(ctx, lambda: ops.replicate(
        ctx, args.patterns, every, args.to, "image" if args.from_image_if_no_replica else None,
        dry_run=args.dry_run), "POST", "/v1/replicas",
        {k: v for k, v in body.items() if v is not None})
    rows = doc["vms"]
    if args.dry_run:
        ctx.emit(doc, table.render(rows, COLUMNS)
                 + f"\nreplicate would replicate {len(rows)} VM{'s' if len(rows) != 1 else ''}"
                 f" every {span(every)}{' to hosts matching ' + repr(args.to) if args.to else ''}"
                 " (dry run, nothing written)")
        return 0
    started = sum(1 for row in rows if row["state"] == "started")
    ctx.emit(doc, table.render(rows, COLUMNS)
             + f"\n{len(rows)} VM{'s' if len(rows) != 1 else ''} replicated every "
             f"{span(every)}{' to hosts matching ' + repr(args.to) if args.to else ''}"
             f" ({started} new); the first replica is a full copy: vmlist -o +replica "
             "shows each one's age")
    return 0


def _stop(ctx) -> int:
    args = ctx.args
    if ctx.api is not None:
        vms = ctx.api.call("POST", "/v1/replicas/stop",
                           body={"patterns": args.patterns, "dry_run": True})["vms"]
    else:
        vms = ops.replicated(ctx, args.patterns)
    if args.dry_run:
        rows = vms if ctx.api is not None else [dict(ops.row_of(vm), state="would stop")
                                                 for vm in vms]
        ctx.emit({"state": "dry-run", "vms": rows}, table.render(rows, COLUMNS)
                 + f"\nreplicate --stop would stop replicating {len(rows)} "
                 f"VM{'s' if len(rows) != 1 else ''} and delete their replicas (dry run, "
                 "nothing written)")
        return 0
    if len(vms) > 1 and not args.yes:
        confirm("replicate --stop", [f"{vm['host']}/{vm['name']}" for vm in vms],
                cancelled={"state": "cancelled", "vms": []})
    doc = through.write(ctx, lambda: ops.stop(ctx, vms), "POST", "/v1/replicas/stop",
                        {"patterns": args.patterns, "yes": True})
    rows = doc["vms"]
    ctx.emit(doc, table.render(rows, COLUMNS)
             + f"\nreplication of {len(rows)} VM{'s' if len(rows) != 1 else ''} stopping: "
             "each replica is deleted, then its record")
    return 0


def register(commands) -> None:
    p = commands.add(
        "replicate", "keep a replica of VMs' disks on another host, for HA restarts",
        "python peerctl.py replicate 'db*' --every 10s\n"
        "python peerctl.py replicate db1 --stop", cmd_replicate,
        "Keep a replica of each matching VM's disks on one other host (a live, undrained "
        "host matching --to; never the VM's own), brought up to date every DURATION (at "
        "least 10s; 10s, 1m, 1h) with the blocks written since the last update. A replica "
        "is always whole: an update that fails or is cut short leaves the previous one. "
        "An HA restart (ha PATTERN restart) of a replicated VM starts it on its replica's "
        "host from its replica; with no usable replica it stays unknown unless "
        "--from-image-if-no-replica allows starting it from its image. Replicating a VM "
        "again changes its interval and --to. --stop ends replication and deletes the "
        "replicas (more than one VM asks for --yes).")
    p.add_argument("patterns", nargs="+", metavar="PATTERN",
                   help="HOSTGLOB/VMGLOB or VMGLOB")
    p.add_argument("--every", metavar="DURATION",
                   help="the interval between updates (required unless --stop)")
    p.add_argument("--to", metavar="HOSTGLOB",
                   help="only keep replicas on hosts matching this")
    p.add_argument("--from-image-if-no-replica", action="store_true",
                   help="an HA restart with no usable replica starts the VM from its image "
                        "(its data since boot is lost) instead of leaving it unknown")
    p.add_argument("--stop", action="store_true",
                   help="stop replicating the VMs and delete their replicas")
    yes_option(p, "do not ask when --stop matches several VMs")
    dry_run_option(p, "only list the VMs and what would change for each; write nothing")
