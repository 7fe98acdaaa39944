"""``host remove NAME [--evacuate] [--yes] [--dry-run]``: take a host out of
the cluster for good (the work is :mod:`engine.operations.host_removal`).

A host with VMs is refused unless ``--evacuate``, which first moves them off
exactly as ``evacuate NAME`` does, and removes the host only once every VM
moved.  The answer is ``{host, automation, state, moved, removed, kept}``."""
from __future__ import annotations

from engine.errors import Failed, UsageError
from engine.operations import host_removal as ops
from engine.operations import moves, tasks

from .confirm import confirm
from .follow import follow
from .options import dry_run_option, yes_option
from .through import segment


def _moving(rows: list[dict]) -> list[dict]:
    return [{"name": r.get("name"), "uuid": r.get("uuid"), "from": r.get("from"),
             "host": r.get("host"), **({"error": r["error"]} if r.get("error") else {})}
            for r in rows]


def _lines(doc: dict, would: bool) -> list[str]:
    move, remove = ("would move", "would remove") if would else ("moved", "removed")
    lines = []
    for row in doc["moved"]:
        lines.append(f"{move} {row['name']} to {row.get('host') or '?'}"
                     + (f" ({row['error']})" if row.get("error") else ""))
    lines += [f"{remove} {what}" for what in doc["removed"]]
    lines += [f"{'would keep' if would else 'kept'} {row['kind']} {row['id']}"
              f"{' of ' + row['vm'] if row.get('vm') else ''}: {row['state']} ({row['why']})"
              for row in doc["kept"]]
    return lines


def cmd_remove(ctx) -> int:
    args = ctx.args
    if ctx.api is not None:
        return _remove_remotely(ctx)
    removal = ops.plan_removal(ctx, args.host)
    if removal.done:
        ctx.emit(ops.dry_run(removal, []) | {"state": "done", "removed": [],
                                             "kept": removal.tombstone.get("kept") or []},
                 f"host {args.host} was removed already")
        return 0
    ops.refuse_what_blocks(removal, args.evacuate)
    plan = None
    if removal.vms:
        plan = moves.plan_evacuate(ctx, args.host, planned=args.dry_run)
    moving = _moving(plan.targets) if plan else []
    if args.dry_run:
        doc = ops.dry_run(removal, moving)
        fence = [f"would stop {args.host}'s peer (it serves now): it exits 2"] \
            if removal.alive else []
        ctx.emit(doc, "\n".join(_lines(doc, True) + fence
                                + [f"host remove {args.host}: dry run, nothing written"]))
        stuck = [row for row in moving if row.get("error")]
        if stuck:
            raise Failed(f"host remove would fail: {stuck[0]['name']}: {stuck[0]['error']}")
        return 0
    if not args.yes:
        confirm("host remove", _lines(ops.dry_run(removal, moving), True), "changes",
                cancelled={**ops.dry_run(removal, []), "state": "cancelled", "removed": []},
                question=f"Remove host {args.host} from the cluster for good?")
    moved, automation = [], None
    if plan is not None:
        moved, automation = _evacuate(ctx, plan)
    doc = ops.remove_host(ctx, args.host, by=moves.operator(), moved=moved,
                          automation=automation)
    ctx.emit(doc, "\n".join(_lines(doc, False) + [f"host {args.host} removed"]))
    return 0


def _remove_remotely(ctx) -> int:
    """host remove through the API: its route removes a host with no VMs;
    with --evacuate, the evacuate route moves them off first."""
    args = ctx.args
    name = segment(args.host)
    if args.evacuate and args.dry_run:
        raise UsageError("through the API, --evacuate has no dry run: evacuate HOST "
                         "--dry-run shows the moves, host remove HOST --dry-run the rest")
    doc = ctx.api.call("POST", f"/v1/hosts/{name}/remove", body={"dry_run": True}) \
        if not args.evacuate else None
    if doc is not None and doc.get("state") == "done":
        ctx.emit(doc, f"host {args.host} was removed already")
        return 0
    if args.dry_run:
        ctx.emit(doc, "\n".join(_lines(doc, True)
                                + [f"host remove {args.host}: dry run, nothing written"]))
        return 0
    if not args.yes:
        confirm("host remove", _lines(doc, True) if doc else [f"move every VM off {args.host}, "
                                                               "then remove it"],
                "changes", cancelled={"host": args.host, "state": "cancelled", "removed": []},
                question=f"Remove host {args.host} from the cluster for good?")
    moved, automation = [], None
    if args.evacuate:
        started = ctx.api.call("POST", f"/v1/hosts/{name}/evacuate", body={"yes": True})
        automation = started.get("automation")
        if automation:
            task = follow(ctx, automation) or {}
            result = tasks.vm_result(automation, task, ["name", "uuid", "from", "host",
                                                        "state", "error"])
            moved = _moving(result["vms"])
            if task.get("state") != "done" or tasks.failed_vms(result):
                raise Failed(f"host {args.host} not removed: evacuate {automation} "
                             f"{task.get('state')} (it stays drained; host remove "
                             f"{args.host} --evacuate tries again)",
                             result={"host": args.host, "automation": automation,
                                     "state": task.get("state") or "failed", "moved": moved,
                                     "removed": [], "kept": []})
    doc = ctx.api.call("POST", f"/v1/hosts/{name}/remove", body={"yes": True})
    doc["moved"], doc["automation"] = moved or doc.get("moved", []), automation
    ctx.emit(doc, "\n".join(_lines(doc, False) + [f"host {args.host} removed"]))
    return 0


def _evacuate(ctx, plan) -> tuple[list[dict], str | None]:
    """Move every VM off the host as ``evacuate`` does: ``(moved, automation)``;
    Failed, the host kept, unless every VM moved."""
    host = plan.args["hosts"][0]
    planned = moves.evacuate_after_drain(ctx, plan)
    if planned is None:
        return [], None
    automation = tasks.start(ctx, planned)
    task = follow(ctx, automation) or {}
    doc = tasks.vm_result(automation, task, ["name", "uuid", "from", "host", "state", "error"])
    failed = tasks.failed_vms(doc)
    moved = _moving(doc["vms"])
    if task.get("state") != "done" or failed:
        why = task.get("error") or ", ".join(f"{row['name']}: {row.get('error') or 'error'}"
                                             for row in failed)
        raise Failed(f"host {host} not removed: evacuate {automation} {task.get('state')}"
                     + (f": {why}" if why else "") + f" (it stays drained; host remove "
                     f"{host} --evacuate tries again)",
                     result={"host": host, "automation": automation,
                             "state": task.get("state") or "failed", "moved": moved,
                             "removed": [], "kept": []})
    return moved, automation


def register_remove(what) -> None:
    """Register ``host remove`` on the ``host`` noun's verbs."""
    p = what.add(
        "remove", "take a host out of the cluster for good",
        "python peerctl.py host remove h9 --yes\n"
        "python peerctl.py host remove h9 --evacuate --dry-run", cmd_remove,
        "Take host NAME out of the cluster for good: refused while VMs are on it, unless "
        "--evacuate moves them off first (as evacuate NAME does; the host is removed only "
        "once every VM moved). It drains the host, fences its peer (a tombstone, "
        "removed/NAME: a peer serving stops and exits 2, and never registers again), waits "
        "for it to leave, then deletes its etcd user, its placement provider and the "
        "allocations on it, and every record named after it. Backups, replicas and disks "
        "kept aside stored on it are listed as lost (their records say so), never dropped "
        "silently. Interrupted, running it again finishes it. It asks first unless --yes; "
        "--dry-run lists what would move, be removed and be kept, and writes nothing.")
    p.add_argument("host", metavar="NAME")
    p.add_argument("--evacuate", action="store_true",
                   help="move its VMs to other hosts first (as evacuate does)")
    yes_option(p, "do not ask")
    dry_run_option(p, "only list what would be moved, removed and kept; write nothing")
