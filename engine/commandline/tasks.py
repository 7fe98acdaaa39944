"""Automations: tasks, task, wait, abort."""
from __future__ import annotations

import json

from engine.errors import Failed
from engine.operations import tasks as ops

from . import table, through
from .context import me
from .follow import follow
from .listing import listing
from .options import listing_options, seconds

C = table.Column
TASK_COLUMNS = [C("id", "ID"), C("kind", "Kind"), C("state", "State"),
                C("initiator", "Initiator"), C("created", "Created"),
                C("steps", "Steps", right=True)]
TASK_FIELDS = [c.field for c in TASK_COLUMNS]
EXAMPLE_ID = "20261125-180542-77fd3e"   # as the engine makes them (api.new_id)


def task_text(task: dict) -> str:
    head = [f"{key + ':':<11}{task.get(key)}" for key in ("id", "kind", "state", "initiator")]
    head.append(f"{'members:':<11}{', '.join(map(str, task.get('members') or []))}")
    if task.get("error"):
        head.append(f"{'error:':<11}{task['error']}")
    log = table.render(task.get("log") or [],
                       [C("index", "#", right=True), C("request", "Request"),
                        C("label", "Label"), C("target", "Target"), C("status", "Status"),
                        C("executor", "Executor")])
    result = task.get("result")
    tail = "result:    " + json.dumps(result, default=str) if result else ""
    return "\n".join(filter(None, ["\n".join(head), log, tail]))


def cmd_tasks(ctx) -> int:
    return listing(ctx, lambda: through.read(
        ctx, lambda: ops.list_tasks(ctx, include_finished=ctx.args.all), "/v1/tasks",
        all=ctx.args.all), TASK_COLUMNS, TASK_FIELDS, TASK_FIELDS, "created")


def cmd_task(ctx) -> int:
    task = _task(ctx, ctx.args.id)
    ctx.emit(task, task_text(task))
    return 0


def _task(ctx, automation: str) -> dict:
    return through.read(ctx, lambda: ops.get_task(ctx, automation),
                        f"/v1/automations/{through.segment(automation)}")


def cmd_wait(ctx) -> int:
    automation, timeout = ctx.args.id, ctx.args.timeout
    _task(ctx, automation)      # unknown id: exit 1 before following
    task = follow(ctx, automation, timeout=timeout)
    ctx.emit(task, task_text(task))
    if task.get("state") == "running":
        raise Failed(f"automation {automation} still running after {timeout}s")
    if task.get("state") != "done":
        raise Failed(f"automation {automation} {task.get('state')}"
                     + (f": {task['error']}" if task.get("error") else ""))
    return 0


def cmd_abort(ctx) -> int:
    try:
        doc = through.write(ctx, lambda: ops.abort(ctx, ctx.args.id), "DELETE",
                            f"/v1/automations/{through.segment(ctx.args.id)}")
    except Failed as exc:
        if exc.result is None:
            raise
        raise Failed(f"{exc}; follow it with: {me()} wait {ctx.args.id}",
                     result=exc.result) from None
    ctx.emit(doc, f"automation {doc.get('id')} {doc.get('state')}")
    return 0


def register(commands) -> None:
    sub = commands.add("tasks", "list running automations (--all: finished ones too)",
                       "python peerctl.py tasks --all", cmd_tasks,
                       "List the automations still running, oldest first (--all: finished "
                       "ones too); Created is ISO 8601 UTC.")
    sub.add_argument("--all", action="store_true", help="include finished automations")
    listing_options(sub, TASK_COLUMNS, "created")

    sub = commands.add("task", "show one automation with its log",
                       f"python peerctl.py task {EXAMPLE_ID}", cmd_task,
                       "Show one automation: its kind, state, members, the log of its "
                       "requests and their status, and its result.")
    sub.add_argument("id", metavar="ID")

    sub = commands.add("wait", "follow an automation until it ends (exit 1 unless done)",
                       f"python peerctl.py wait {EXAMPLE_ID}", cmd_wait,
                       "Follow an automation with the progress view until it ends; exit 0 "
                       "when done, 1 when failed, aborted or stuck. Ctrl-C detaches again.")
    sub.add_argument("id", metavar="ID")
    sub.add_argument("--timeout", type=seconds, metavar="SECONDS",
                     help="give up waiting after this long (exit 1)")

    sub = commands.add("abort", "ask an automation to stop",
                       f"python peerctl.py abort {EXAMPLE_ID}", cmd_abort,
                       "Ask an automation's leader to stop it, and wait until it has; one "
                       "that cleans up on abort is waited for until it has cleaned up.")
    sub.add_argument("id", metavar="ID")
