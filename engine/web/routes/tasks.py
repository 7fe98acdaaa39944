"""The API's automations: list, one, wait, abort, and a boot's addresses."""
from __future__ import annotations

from engine.errors import Failed, UsageError
from engine.operations import tasks

from .core import Answer, Call, listed, MAX_WAIT, Refusal, route

@route("GET", "/v1/tasks", "list automations", "tasks [--all]",
       query=(("all", "boolean", "ended ones too"),))
def list_tasks(ctx, call: Call) -> Answer:
    return Answer(listed(tasks.list_tasks(ctx, include_finished=call.flag("all")),
                          tasks.LISTED, tasks.ORDER))


@route("GET", "/v1/automations/{id}", "one automation with its log", "task ID")
def get_task(ctx, call: Call) -> Answer:
    return Answer(_known(ctx, call.path["id"]))


def _known(ctx, automation: str) -> dict:
    try:
        return tasks.get_task(ctx, automation)
    except Failed as exc:
        raise Refusal(404, str(exc)) from None


@route("GET", "/v1/automations/{id}/wait", "wait until an automation ends",
       "wait ID [--timeout S]", waits=True,
       query=(("timeout", "number", f"seconds, at most {MAX_WAIT:g} (default 30)"),))
def wait(ctx, call: Call) -> Answer:
    automation = call.path["id"]
    _known(ctx, automation)
    timeout = _timeout(call)
    last = None
    for last in tasks.follow(ctx, automation, timeout=timeout):
        pass
    return Answer(last)


def _timeout(call: Call) -> float:
    text = call.one("timeout", "30")
    try:
        timeout = float(text)
    except ValueError:
        raise UsageError(f"bad timeout {text!r}: want seconds") from None
    if not 0 <= timeout <= MAX_WAIT:
        raise UsageError(f"bad timeout {text!r}: 0 to {MAX_WAIT:g} seconds")
    return timeout


@route("GET", "/v1/automations/{id}/addresses",
       "wait until a boot ends and its VMs have their addresses",
       "boot ... --wait-ip --ip-timeout S", waits=True,
       query=(("timeout", "number", f"seconds, at most {MAX_WAIT:g} (default 30)"),))
def addresses(ctx, call: Call) -> Answer:
    """What ``boot --wait-ip`` prints, once the boot has ended and each VM
    it built with a network interface has an address, or the timeout
    passed (then a VM without one has ``ip`` null, where the command exits 1;
    ask again to wait longer)."""
    from engine.operations import vms
    _known(ctx, call.path["id"])
    return Answer(vms.boot_addresses(ctx, call.path["id"], _timeout(call)))


@route("DELETE", "/v1/automations/{id}", "ask an automation to stop", "abort ID", write=True)
def abort(ctx, call: Call) -> Answer:
    _known(ctx, call.path["id"])
    return Answer(tasks.abort(ctx, call.path["id"]))
