"""Running a planned automation from the command line, written once: a dry
run, the confirmation, starting it (Ctrl-C while it is created waits for
its id), following it with the progress view (Ctrl-C detaches: it goes
on, exit 130), and rendering its result."""
from __future__ import annotations

import signal
import sys

from engine.errors import Detached, Failed, StoreUnavailable, Unavailable
from engine.operations import tasks
from engine.operations.plans import Plan, failed_doc

from . import table, through
from .confirm import confirm
from .context import me, say

__all__ = ["act", "follow", "detach", "vm_outcome", "VM_RESULT_COLUMNS"]

C = table.Column
VM_RESULT_COLUMNS = [C("name", "Name"), C("host", "Host"), C("state", "State"),
                     C("uuid", "UUID")]
DRY_RUN_COLUMNS = [C("host", "Host"), C("name", "Name"), C("state", "State"), C("uuid", "UUID")]


def act(ctx, plan: Plan, outcome, verb: str | None = None, dry_columns=DRY_RUN_COLUMNS,
        dry_text: str = "", would: str = "would act on") -> int:
    """``--dry-run``: show the plan; else confirm it when it asks for that
    (unless ``--yes``), start it and follow it to ``outcome``.  A dry run
    whose plan has a row with an ``error`` (a VM no host can take) shows
    the plan, then fails as the real run would: one line naming the first
    such row, exit 1."""
    args = ctx.args
    verb = verb or plan.kind
    if getattr(args, "dry_run", False):
        rows = plan.targets
        stuck = [row for row in rows if row.get("error")]
        what = plan.what if len(rows) != 1 else plan.what.rstrip("s")
        count = (f"{len(rows) - len(stuck)} of {len(rows)} {what}" if stuck
                 else f"{len(rows)} {what}")
        ctx.emit(plan.dry_run(), table.render(rows, dry_columns)
                 + f"\n{verb} {would} {count}{dry_text}")
        if stuck:
            first = stuck[0]
            more = f" (and {len(stuck) - 1} more)" if len(stuck) > 1 else ""
            raise Failed(f"{verb} would fail: {first.get('name') or first.get('host')}: "
                         f"{first['error']}{more}")
        return 0
    if plan.ask and not getattr(args, "yes", False):
        confirm(verb, [f"{row.get('host') or row.get('from')}/{row['name']}"
                       + (f" ({row['state']})" if row.get("state") else "")
                       for row in plan.targets], plan.what,
                cancelled=failed_doc(plan.key, "cancelled"))
    return run(ctx, plan, outcome)


def run(ctx, plan: Plan, outcome) -> int:
    # Ctrl-C while the automation is being created waits until its id is
    # known, so that the user always learns what to re-attach to.
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        automation = through.start(ctx, plan)
    except BaseException:
        signal.signal(signal.SIGINT, previous)
        raise
    try:
        signal.signal(signal.SIGINT, previous)
        if interrupted:
            raise KeyboardInterrupt
        if ctx.args.detach:
            ctx.emit({"automation": automation}, automation)
            return 0
        if not ctx.json and not sys.stderr.isatty():
            say(f"automation {automation} started ({plan.kind}); Ctrl-C detaches")
        task = follow(ctx, automation)
    except KeyboardInterrupt:
        detach(ctx, automation)
    return outcome(ctx, automation, task)


def follow(ctx, automation: str, timeout: float | None = None, quiet: bool = False) -> dict:
    """Follow ``automation`` to a terminal state; Ctrl-C detaches (exit 130)."""
    try:
        from .progress import ProgressView
        view = None if quiet else ProgressView(sys.stderr, automation, sys.stderr.isatty())
        last = None
        for task in through.follow(ctx, automation, timeout=timeout):
            last = task
            if view:
                view.update(task)
    except KeyboardInterrupt:
        detach(ctx, automation)
    except StoreUnavailable as exc:
        raise Unavailable(f"etcd unreachable at {ctx.settings['etcd']} while following "
                          f"automation {automation}, which goes on; re-attach with: "
                          f"{me()} wait {automation}") from exc
    except Unavailable as exc:          # through the API: no peer answered
        raise Unavailable(f"{exc} while following automation {automation}, which goes "
                          f"on; re-attach with: {me()} wait {automation}") from exc
    return last


def detach(ctx, automation: str):
    """Leave ``automation`` running: say how to re-attach and exit 130.  With
    ``--format json`` stdout still gets ``{"automation": ID}`` for scripts."""
    if ctx.json:
        ctx.emit({"automation": automation})
    say(f"\nDetached from automation {automation}; it goes on without us.\n"
        f"Re-attach with: {me()} wait {automation}")
    raise Detached()


def vm_outcome(ctx, automation: str, task: dict, fields=tasks.VM_RESULT_FIELDS,
               columns=VM_RESULT_COLUMNS, verb: str | None = None, key: str = "vms",
               notes=None) -> int:
    """A VM automation's result, ``{automation, state, vms: [{FIELDS}]}``, as
    JSON or a table (with an Error column when any VM has one, and ``N of M
    VMs VERB`` when a verb is given); exit 1 unless done with no VM in error.
    ``notes(doc)``, if given, may add fields to the rows and returns lines
    to print under the table."""
    doc = tasks.vm_result(automation, task, fields, key)
    lines = notes(doc) if notes else []
    rows = doc[key]
    columns = list(columns)
    if any(row.get("error") for row in rows):
        columns.append(C("error", "Error"))
    failed = tasks.failed_vms(doc, key)
    text = table.render(rows, columns)
    text = (text + "\n" if text else "") + f"automation {automation} {task.get('state')}"
    if verb:
        text += f": {len(rows) - len(failed)} of {len(rows)} VMs {verb}"
    ctx.emit(doc, "\n".join([text, *lines]))
    if task.get("state") != "done" or failed:
        why = task.get("error") or ", ".join(f"{row['name']}: {row.get('error') or 'error'}"
                                             for row in failed)
        raise Failed(f"{task.get('kind') or 'automation'} {automation} "
                     f"{task.get('state')}" + (f": {why}" if why else ""))
    return 0
