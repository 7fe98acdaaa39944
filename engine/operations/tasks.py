"""Automations as a user sees them: start a plan, follow it, list them,
show one, abort one, and the documents their results make.

Times are ISO 8601 UTC strings (``2026-12-01T08:00:00Z``), as in leases."""
from __future__ import annotations

from engine.errors import Failed, NoPeers, NoSuch, UnknownAutomation, UnknownTask

from .plans import Plan, failed_doc

__all__ = ["start", "follow", "list_tasks", "get_task", "abort", "vm_result", "failed_vms",
           "TERMINAL_STATES", "iso", "LISTED", "ORDER"]

TERMINAL_STATES = ("done", "failed", "aborted", "stuck")
# tasks' JSON: each row's fields, and the order of the rows
LISTED = ["id", "kind", "state", "initiator", "created", "steps"]
ORDER = "created"


def iso(value):
    """Epoch seconds as ISO 8601 UTC; anything else as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        from engine.leases.times import iso as to_iso
        return to_iso(value)
    return value


def start(ctx, plan: Plan) -> str:
    """Start ``plan``'s automation; its id.  No live peer, or an unknown kind:
    ``Failed`` with the plan's empty document."""
    from engine.core import api
    try:
        return api.start_automation(ctx.store(), plan.kind, plan.args)
    except (NoPeers, UnknownAutomation, LookupError) as exc:
        raise Failed(exc.args[0] if exc.args else str(exc),
                     result=failed_doc(plan.key)) from None


def follow(ctx, automation: str, timeout: float | None = None):
    """Each new view of ``automation`` until it ends (or ``timeout``)."""
    from engine.core import api
    last = None
    for task in api.follow(ctx.store(), automation, timeout=timeout):
        last = task
        yield _dated(task)
    if last is None:
        yield get_task(ctx, automation)


def _dated(task: dict) -> dict:
    task = dict(task, created=iso(task.get("created")))
    if task.get("log"):
        task["log"] = [dict(entry, time=iso(entry.get("time"))) for entry in task["log"]]
    return task


def list_tasks(ctx, include_finished: bool = False) -> list[dict]:
    """``[{id, kind, state, initiator, created, steps}]``, oldest first."""
    from engine.core import api
    return [dict(row, created=iso(row.get("created")))
            for row in api.list_tasks(ctx.store(), include_finished=include_finished)]


def get_task(ctx, automation: str) -> dict:
    """One automation with its log; ``Failed`` when there is none."""
    from engine.core import api
    try:
        return _dated(api.get_task(ctx.store(), automation))
    except UnknownTask:
        raise NoSuch(f"no automation {automation!r}") from None


def abort(ctx, automation: str) -> dict:
    """``{id, state}`` once it has stopped; ``Failed`` (with that document)
    when its leader has not acted within abort's wait."""
    from engine.core import api
    try:
        doc = api.abort(ctx.store(), automation)
    except UnknownTask:
        raise NoSuch(f"no automation {automation!r}") from None
    if doc.get("state") not in TERMINAL_STATES:
        raise Failed(f"automation {doc.get('id')} is still {doc.get('state')}: the abort "
                     "is requested and its leader has not acted on it yet", result=doc)
    return doc


VM_RESULT_FIELDS = ["name", "uuid", "host", "state", "error"]


def vm_result(automation: str, task: dict, fields=VM_RESULT_FIELDS, key: str = "vms") -> dict:
    """An automation's result as ``{automation, state, vms: [{FIELDS}]}``
    (plus ``error`` when it failed as a whole)."""
    rows = [{f: row.get(f) for f in fields} if fields else row
            for row in (task.get("result") or {}).get(key) or []]
    doc = {"automation": automation, "state": task.get("state"), key: rows}
    if task.get("error"):
        doc["error"] = task["error"]
    return doc


def failed_vms(doc: dict, key: str = "vms") -> list[dict]:
    """The rows of a result that did not make it."""
    return [row for row in doc.get(key) or [] if row.get("error") or row.get("state") == "error"]
