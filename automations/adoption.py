"""``adopt``: foreign domains taken under management in place; ``unmanage``:
VMs let go.  One worker per domain, all in parallel.

``adopt`` per domain (``{host, name, uuid}``), on its host, with no restart
and no copy:

1. ``adopt_survey``: its size, disks and interfaces as peerctl would
   describe them, and every reason it cannot be adopted (then it stays
   foreign, untouched, and the reason is the VM's error);
2. ``adopt_claim``: its size claimed on its host, in place of the share of
   the host's reserved it held as a foreign domain; a claim that does not
   fit refuses it, unchanged;
3. ``adopt_take``: its peerctl metadata written, then its definition and
   record.  If that fails, ``let_go`` and ``release`` undo what was done.

A domain is never half-adopted.  Owned but unclaimed cannot happen: the
claim comes first.  Claimed but unowned lasts only until the automation
goes on: each step is re-sent while its outcome is lost (all are
idempotent), so an initiator that dies anywhere is followed by one that
ends the domain adopted, or foreign with its claim released.  The
automation's spec names every domain, so the reconciler leaves their
claims alone meanwhile.

``unmanage`` per VM: ``lock_vm``; ``let_go`` on its host (metadata off,
records gone, foreign again); ``release`` of its claim; ``unlock_vm``.
Between the last two the domain is foreign and still claimed, which the
host's accounting counts once (a foreign domain holding an allocation of
its own is left out of reserved).
"""
from engine.core.registry import automation
from engine.core.replay import Request

from automations._steps import finish, resend

STEP_DEADLINE = 120.0
SIZE = ("vcpus", "memory_mb", "disk_gb")


def _outcome(vm, state, error=None):
    return {"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"], "state": state,
            "error": error}


def _on_host(vm, request, args):
    return Request(request, {"uuid": vm["uuid"], "name": vm["name"], **args},
                   target=vm["host"], deadline=STEP_DEADLINE, label=vm["name"])


def adopt_one(ctx, vm, ha):
    surveyed = yield from resend(_on_host(vm, "adopt_survey", {}))
    if not surveyed.ok:
        return _outcome(vm, "foreign", surveyed.error or surveyed.status)
    seen = surveyed.value
    if seen["problems"]:
        return _outcome(vm, "foreign", "; ".join(seen["problems"]))
    resources = {"VCPU": seen["vcpus"], "MEMORY_MB": seen["memory_mb"],
                 "DISK_GB": seen["disk_gb"]}
    claimed = yield from resend(_on_host(vm, "adopt_claim", {
        "consumer": vm["uuid"], "resources": resources, "project": ctx.automation_id}))
    if not claimed.ok:
        return _outcome(vm, "foreign", claimed.error or claimed.status)
    taken = yield from resend(_on_host(vm, "adopt_take", {
        "ha": ha, "expect": {k: seen[k] for k in SIZE}}))
    if taken.ok:
        return _outcome(vm, taken.value.get("state", seen["state"]))
    why = taken.error or taken.status
    undone = yield from resend(_on_host(vm, "let_go", {}))
    released = yield from resend(Request("release", {"consumer": vm["uuid"]},
                                         label=vm["name"]))
    if not (undone.ok and released.ok):
        why += f"; undoing it: {undone.error or released.error}"
    return _outcome(vm, "foreign", why)


@automation("adopt", version=1)
def adopt(ctx, vms, ha="none"):
    results = yield ctx.all([ctx.worker(adopt_one, vm, ha, label=vm["name"]) for vm in vms])
    return finish(results, "adopted")


def unmanage_one(ctx, vm):
    locked = yield from resend(Request("lock_vm", {
        "uuid": vm["uuid"], "name": vm["name"], "host": vm["host"],
        "owner": ctx.automation_id, "why": "being let go"}, label=vm["name"]))
    if not locked.ok:
        return _outcome(vm, "error", locked.error)
    let_go = yield from resend(_on_host(vm, "let_go", {}))
    if not let_go.ok:
        yield from resend(Request("unlock_vm", {"uuid": vm["uuid"], "owner": ctx.automation_id},
                                  label=vm["name"]))
        return _outcome(vm, "error", let_go.error or let_go.status)
    released = yield from resend(Request("release", {"consumer": vm["uuid"]},
                                         label=vm["name"]))
    yield from resend(Request("unlock_vm", {"uuid": vm["uuid"], "owner": ctx.automation_id},
                              label=vm["name"]))
    if not released.ok:
        return _outcome(vm, "error", f"release: {released.error}")
    return _outcome(vm, let_go.value.get("state", "foreign"))


@automation("unmanage", version=1)
def unmanage(ctx, vms):
    results = yield ctx.all([ctx.worker(unmanage_one, vm, label=vm["name"]) for vm in vms])
    return finish(results, "let go")
