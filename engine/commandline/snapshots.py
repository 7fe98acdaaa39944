"""Snapshots: snapshot create, snapshot list, snapshot revert, snapshot
delete (docs/snapshots.md).

``snapshot list`` reads etcd only (no hypervisor call).  Its JSON groups
the rows by VM, as the contract has it: ``[{vm, uuid, host, snapshots:
[{name, time, age_s, memory, state}]}]``; the table is one row per
snapshot.  ``revert`` always asks (data written since is lost) unless
``--yes``; ``delete`` asks when it deletes several."""
from __future__ import annotations

import functools

from engine.errors import Failed
from engine.leases.times import human_span
from engine.operations import snapshots as ops
from engine.operations.plans import failed_doc

from . import table, through
from .confirm import confirm
from .follow import act, vm_outcome
from .listing import check_fields
from .options import detach_option, dry_run_option, listing_options, yes_option

C = table.Column


def _age(seconds) -> str:
    return f"{human_span(seconds)} ago"


def _yes_no(value) -> str:
    return "yes" if value else "no"


LIST_COLUMNS = [C("vm", "VM"), C("uuid", "UUID"), C("host", "Host"), C("name", "Name"),
                C("time", "Time"), C("age_s", "Age", _age, True),
                C("memory", "Memory", _yes_no), C("state", "State")]
LIST_DEFAULT = ["vm", "host", "name", "age_s", "memory"]
RESULT_FIELDS = ["name", "uuid", "host", "state", "snapshots", "dropped", "error"]
RESULT_COLUMNS = [C("name", "VM"), C("host", "Host"), C("state", "State"),
                  C("snapshots", "Snapshots",
                    lambda snaps: ", ".join(s["name"] for s in snaps or ()))]
DRY_COLUMNS = [C("host", "Host"), C("name", "VM"), C("state", "State"),
               C("snapshot", "Snapshot")]


def _notes(doc: dict) -> list[str]:
    """A line for each VM whose checkpoints went (its next backup is full)."""
    return [f"{row['name']}: checkpoints {', '.join(row['dropped'])} deleted (the next "
            "backup or replica update is full)" for row in doc["vms"] if row.get("dropped")]


def _outcome(verb: str):
    return functools.partial(vm_outcome, fields=RESULT_FIELDS, columns=RESULT_COLUMNS,
                             verb=verb, notes=_notes)


# -- the verbs ----------------------------------------------------------------------

def cmd_create(ctx) -> int:
    args = ctx.args
    body = {"patterns": args.patterns, "name": args.name, "memory": args.memory or None}
    plan = through.planned(ctx, lambda: ops.plan_create(ctx, args.patterns, args.name,
                                                        memory=args.memory),
                           "/v1/snapshots", {k: v for k, v in body.items() if v is not None},
                           "snapshot")
    name = plan.args.get("snapshot") or args.name or next(
        (row.get("snapshot") for row in plan.targets if row.get("snapshot")), "")
    return act(ctx, plan, _outcome("snapshotted"), "snapshot create", DRY_COLUMNS,
               f" as {name}", would="would snapshot")


def cmd_list(ctx) -> int:
    args = ctx.args
    chosen = check_fields(args, LIST_COLUMNS, LIST_DEFAULT)
    try:
        rows = ops.list_snapshots(ctx, args.pattern) if ctx.api is None else [
            dict(snap, vm=vm["vm"], uuid=vm["uuid"], host=vm["host"])
            for vm in ctx.api.call("GET", "/v1/snapshots", query={"pattern": args.pattern})
            for snap in vm["snapshots"]]
    except Failed as exc:
        matched = getattr(exc, "matched", None)
        if matched is not None:
            _show(ctx, matched, chosen)
            exc.result = None
        raise
    _show(ctx, rows, chosen)
    return 0


def _show(ctx, rows: list[dict], chosen) -> None:
    args = ctx.args
    rows = table.sort_rows(rows, args.sort or "vm,time", [c.field for c in LIST_COLUMNS])
    if ctx.json:
        ctx.emit(ops.grouped(rows))
        return
    ctx.emit(None, table.render(rows, chosen, headers=not args.no_headers,
                                separator=args.separator))


def cmd_revert(ctx) -> int:
    args = ctx.args
    plan = through.planned(ctx, lambda: ops.plan_revert(ctx, args.vm, args.snapshot),
                           f"/v1/vms/{through.segment(args.vm)}/snapshots/{through.segment(args.snapshot)}/revert",
                           {}, "snapshot_revert")
    if not args.yes and not args.dry_run and (plan.ask or ctx.api is None):
        (row,) = plan.targets
        confirm("snapshot revert",
                [f"{row['host']}/{row['name']} to {row['snapshot']} (taken {row['time']}, "
                 f"{'with' if row['memory'] else 'without'} memory)"], "VM",
                cancelled=failed_doc(),
                question="Revert? What the VM wrote since the snapshot is lost")
    plan.ask = False        # asked above
    return act(ctx, plan, _outcome("reverted"), "snapshot revert", DRY_COLUMNS,
               would="would revert")


def cmd_delete(ctx) -> int:
    args = ctx.args
    plan = through.planned(ctx, lambda: ops.plan_delete(ctx, args.vm, args.snapshots),
                           f"/v1/vms/{through.segment(args.vm)}/snapshots", {"snapshot": args.snapshots},
                           "snapshot_delete", "snapshots", method="DELETE")
    if plan.ask and not args.yes and not args.dry_run:
        confirm("snapshot delete", [f"{row['host']}/{row['name']} {row['snapshot']}"
                                    for row in plan.targets], plan.what,
                cancelled=failed_doc())
    plan.ask = False
    return act(ctx, plan, _outcome("cleared of those snapshots"), "snapshot delete",
               DRY_COLUMNS, would="would delete")


# -- the parser ---------------------------------------------------------------------

def _acting(sub, yes: str | None = None) -> None:
    if yes:
        yes_option(sub, yes)
    dry_run_option(sub)
    detach_option(sub)


def register(commands) -> None:
    sub = commands.add(
        "snapshot", "snapshot VMs on their hosts; list, revert and delete snapshots",
        "python peerctl.py snapshot create web1 --name before-upgrade\n"
        "python peerctl.py snapshot list\n"
        "python peerctl.py snapshot revert web1 before-upgrade --yes\n"
        "python peerctl.py snapshot delete web1 before-upgrade", None,
        "A snapshot keeps a VM's disks (and with --memory its running state) inside its "
        "own qcow2 disks on its host, to go back to later. snapshot list reads etcd "
        "only. A VM with snapshots cannot be migrated (the copy would not carry them): "
        "delete them first. A revert deletes the VM's backup checkpoints: its next "
        "backup is full.")
    what = commands.verbs(sub)

    p = what.add("create", "snapshot the VMs matching the patterns",
                 "python peerctl.py snapshot create 'web*' --memory", cmd_create,
                 "Snapshot every VM matching a PATTERN (HOSTGLOB/VMGLOB or VMGLOB), each on "
                 "its host, in one automation. Without --memory only the disks are kept "
                 "(a revert boots the VM from them); with --memory the guest's RAM too (a "
                 "revert resumes it where it was; the guest pauses while its memory is "
                 "written). NAME defaults to snap-<UTC time>; a name the VM already has, a "
                 "pattern matching nothing or a VM whose host is down exits 1 with nothing "
                 "started; a bad name exits 2.")
    p.add_argument("patterns", nargs="+", metavar="PATTERN")
    p.add_argument("--name", metavar="NAME",
                   help="the snapshot's name ([A-Za-z0-9._-], at most 64; default "
                        "snap-YYYYMMDD-HHMMSS)")
    p.add_argument("--memory", action="store_true",
                   help="keep the guest's RAM too (running or paused VMs)")
    _acting(p)

    p = what.add("list", "list snapshots (from etcd: no hypervisor is asked)",
                 "python peerctl.py snapshot list 'host1/*'", cmd_list,
                 "List the snapshots of the VMs matching PATTERN (on the VM's name or uuid "
                 "and its host), or of every VM. JSON groups them by VM.")
    p.add_argument("pattern", nargs="?", metavar="PATTERN")
    listing_options(p, LIST_COLUMNS, "vm,time")

    p = what.add("revert", "bring a VM back to one of its snapshots",
                 "python peerctl.py snapshot revert web1 before-upgrade", cmd_revert,
                 "Bring VM back to its snapshot NAME: what it wrote since is lost, so this "
                 "asks first (--yes does not). A memory snapshot resumes the guest as it "
                 "was; a disk snapshot of a running VM boots it again from those disks. The "
                 "VM's backup checkpoints are deleted (its next backup is full). An unknown "
                 "snapshot exits 1 with nothing started.")
    p.add_argument("vm", metavar="VM")
    p.add_argument("snapshot", metavar="NAME")
    _acting(p, "do not ask (what the VM wrote since the snapshot is lost)")

    p = what.add("delete", "delete snapshots of a VM",
                 "python peerctl.py snapshot delete web1 snap-20261125-224512", cmd_delete,
                 "Delete the snapshots NAME... of VM, on its host. Several ask first.")
    p.add_argument("vm", metavar="VM")
    p.add_argument("snapshots", nargs="+", metavar="NAME")
    _acting(p, "do not ask when several snapshots are deleted")
