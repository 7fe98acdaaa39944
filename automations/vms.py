"""VM automations: boot places, claims and builds; the others act on VMs.

Every VM gets one worker, and one automation drives all selected VMs in
parallel.  VM uuids are derived from the automation (``ctx.uuid``), so a
replay after a crash names the same VMs and the same placement consumers.

``boot`` per VM: claim (placement picks the least loaded host that fits,
honouring traits and ``--on``), build on that host; if the build fails or the
host is lost, release the claim and take the next alternate, up to
``attempts`` hosts.  A VM that cannot be built ends in state ``error`` with
the reason, and its claim released.

Since version 5 the first claims of :data:`CLAIMS_PER_STEP` VMs go in one
step, ``claim_vms`` (each VM's ``claim`` as before, made at the same time
so that placement writes them together); the build, and every attempt
after it, stays the VM's own.

A host whose build failed or was lost may still hold (or, when its libvirtd
outlived a killed peer, bring back) a copy of the VM.  Since version 2, boot
``disown``s the VM on that host before taking an alternate: a durable
``disowned/<host>/<uuid>`` mark that the host's peer acts on whenever it
runs (see ``engine/hypervisor/host/reconciler.py``, ``sweep_ghosts``), so one uuid never
runs on two hosts.

A VM's ``networks``, cloud-init ``seed`` (``boot --network``,
``--user-data``, ``--ssh-key``, ``--hostname``) and HA policy (``ha``, only
when ``restart``: a boot logged before it existed replays the same steps)
go to ``build`` as they are;
the networks' placement traits are among its ``required`` traits (the
command line adds them), so a host without a network is never picked.
"""
from engine.core.registry import automation
from engine.core.replay import Request, Response

from automations._steps import finish as _finish
from automations._steps import resend as _idempotent

BUILD_DEADLINE = 300.0
ACTION_DEADLINE = 120.0
CLAIMS_PER_STEP = 16        # VMs whose first claims go in one claim_vms step (version 5)


def _traits(required) -> str | None:
    if not required:
        return None
    return required if isinstance(required, str) else ",".join(required)


def _outcome(vm, uuid, host, state, error=None):
    return {"name": vm["name"], "uuid": uuid, "host": host, "state": state, "error": error}


def _claim(ctx, vm, uuid, tried, lease):
    args = {"consumer": uuid, "resources": vm["resources"],
            "required": _traits(vm.get("required")), "hosts": vm.get("on"),
            "exclude": tried, "project": ctx.automation_id,
            # Added only when asked for: a boot logged before groups and
            # plans existed replays the same steps.
            **({"prefer": vm["prefer"]} if vm.get("prefer") else {}),
            **({"group": vm["group"], "name": vm["name"]} if vm.get("group") else {})}
    if lease:
        return Request("lease_claim", {**args, "lease": lease, "name": vm["name"]},
                       label=vm["name"])
    return Request("claim", args, label=vm["name"])


def _release(vm, uuid, lease):
    if lease:
        return Request("lease_return", {"lease": lease, "consumer": uuid}, label=vm["name"])
    return Request("release", {"consumer": uuid}, label=vm["name"])


def boot_one(ctx, vm, attempts, disown=False, keep_traits=False, leases=False, claimed=None):
    """``leases`` (version 4): a VM with a ``reservation`` is claimed inside
    that lease (``lease_claim``) and gives its share back if never built.
    ``claimed`` (version 5): the reply to the first claim, made already
    with other VMs' (:func:`boot_some`); the next attempts claim alone."""
    uuid = ctx.uuid("vm/" + vm["name"])
    resources = vm["resources"]
    lease = vm.get("reservation") if leases else None
    tried, reasons = [], []
    for _ in range(attempts):
        if claimed is not None:
            claim, claimed = claimed, None
        else:
            claim = yield from _idempotent(_claim(ctx, vm, uuid, tried, lease))
        if not claim.ok:
            reasons.append(claim.error or claim.status)
            break
        host = claim.value["host"]
        built = yield Request("build", {"uuid": uuid, "name": vm["name"],
                                        "vcpus": resources.get("VCPU", 1),
                                        "memory_mb": resources.get("MEMORY_MB", 256),
                                        "disk_gb": resources.get("DISK_GB", 0),
                                        "image": vm.get("image"),
                                        **({"required": _traits(vm.get("required"))}
                                           if keep_traits and vm.get("required") else {}),
                                        **{key: vm[key] for key in ("networks", "seed", "ha")
                                           if vm.get(key)}},
                              target=host, deadline=BUILD_DEADLINE, label=vm["name"])
        if built.ok:
            return _outcome(vm, uuid, host, built.value.get("state", "running"))
        tried.append(host)
        reasons.append(f"{host}: {built.error or built.status}")
        if built.status in ("error", "timeout"):
            # The host is alive: clear whatever half-built VM it holds.
            yield Request("destroy", {"uuid": uuid, "name": vm["name"]}, target=host,
                          deadline=ACTION_DEADLINE, label=vm["name"])
        if disown:
            # Before the alternate claim: once the VM can exist elsewhere,
            # this host is already told to drop its copy.
            yield from _idempotent(Request("disown", {
                "uuid": uuid, "host": host, "automation": ctx.automation_id,
                "reason": built.status}, label=vm["name"]))
        released = yield from _idempotent(_release(vm, uuid, lease))
        if not released.ok:
            reasons.append(f"release: {released.error}")
            break
    yield from _idempotent(_release(vm, uuid, lease))
    return _outcome(vm, uuid, None, "error", "; ".join(reasons) or "no attempt left")


def _claim_reply(value: dict) -> Response:
    """One VM's part of a ``claim_vms`` reply, as its own ``claim``'s reply."""
    if value.get("error"):
        return Response("error", error=value["error"])
    return Response("ok", value)


def boot_some(ctx, vms, attempts):
    """Version 5: the first claims of ``vms`` in one step (``claim_vms``:
    each VM's ``claim`` as before, made at the same time so that placement
    writes them together), then each VM's :func:`boot_one` from its reply.
    A VM booting into a lease claims alone, inside it; so does every VM of
    a ``claim_vms`` that failed as a whole.  The step is labelled with its
    first VM's name: progress views show one line per VM, and it is on that
    one's until its build."""
    together = [vm for vm in vms if not vm.get("reservation")]
    replies = {}
    if together:
        claims = yield from _idempotent(Request("claim_vms", {"claims": [
            _claim(ctx, vm, ctx.uuid("vm/" + vm["name"]), [], None).args for vm in together]},
            deadline=ACTION_DEADLINE, label=together[0]["name"]))
        if claims.ok:
            replies = {vm["name"]: _claim_reply(value)
                       for vm, value in zip(together, claims.value["claims"])}
    return (yield ctx.all([ctx.worker(boot_one, vm, attempts, True, True, True,
                                      claimed=replies.get(vm["name"]), label=vm["name"])
                           for vm in vms]))


@automation("boot", version=5, feature_level=2)
def boot(ctx, vms, attempts=3):
    """Since version 5 the first claims go :data:`CLAIMS_PER_STEP` VMs to a
    step (:func:`boot_some`): a thousand VMs' claims are some sixty steps,
    not a thousand, and placement writes them in batches as large as it
    takes, not as the executor's threads allow."""
    chunks = [vms[start:start + CLAIMS_PER_STEP]
              for start in range(0, len(vms), CLAIMS_PER_STEP)]
    results = yield ctx.all([ctx.worker(boot_some, chunk, attempts) for chunk in chunks])
    return _finish([result for chunk in results for result in chunk], "built")


@automation("boot", version=4)
def boot_v4(ctx, vms, attempts=3):
    """Since version 4 a VM may boot into a lease (``reservation``)."""
    results = yield ctx.all([ctx.worker(boot_one, vm, attempts, True, True, True,
                                        label=vm["name"]) for vm in vms])
    return _finish(results, "built")


@automation("boot", version=3)
def boot_v3(ctx, vms, attempts=3):
    """Since version 3 the VM's traits go to ``build``, which keeps them in
    the domain's metadata, so that a move honours them."""
    results = yield ctx.all([ctx.worker(boot_one, vm, attempts, True, True, label=vm["name"])
                             for vm in vms])
    return _finish(results, "built")


@automation("boot", version=2)
def boot_v2(ctx, vms, attempts=3):
    results = yield ctx.all([ctx.worker(boot_one, vm, attempts, True, label=vm["name"])
                             for vm in vms])
    return _finish(results, "built")


@automation("boot", version=1)
def boot_v1(ctx, vms, attempts=3):
    """Without ``disown``: kept so that boots started before version 2 replay."""
    results = yield ctx.all([ctx.worker(boot_one, vm, attempts, label=vm["name"])
                             for vm in vms])
    return _finish(results, "built")


def _lock(ctx, vm, why, force=False):
    """Since version 3 an action on a VM holds the VM's lock while it acts
    (``requests/locks.py``): it never interleaves with a move."""
    return _idempotent(Request("lock_vm", {
        "uuid": vm["uuid"], "name": vm["name"], "host": vm["host"], "owner": ctx.automation_id,
        "why": why, "force": force}, label=vm["name"]))


def _unlock(ctx, vm):
    return _idempotent(Request("unlock_vm", {"uuid": vm["uuid"], "owner": ctx.automation_id},
                               label=vm["name"]))


def _locked(inner):
    """``inner`` (a VM worker) run between ``lock_vm`` and ``unlock_vm``."""
    def worker(ctx, vm, *args, why="busy", force=False):
        locked = yield from _lock(ctx, vm, why, force)
        if not locked.ok:
            return _outcome(vm, vm["uuid"], vm["host"], "error", locked.error)
        outcome = yield from inner(ctx, vm, *args)
        yield from _unlock(ctx, vm)
        return outcome
    worker.__name__ = f"locked_{inner.__name__}"
    return worker


def destroy_one(ctx, vm, disown=False):
    """Destroy on the VM's host, then release its allocation.

    Since version 2 (``disown``) a destroy whose host is gone (the step
    stays ``lost`` when re-sent) still ends the VM for the cluster: it
    ``disown``s it on that host, exactly as boot does for a lost build (the
    host destroys its copy when it comes back, before it takes new work; the
    reconciler drops its ``vms/`` record meanwhile), then releases the
    allocation.  The VM's state in the result is ``disowned``.  Version 1
    reports such a VM as an error and keeps its allocation."""
    step = Request("destroy", {"uuid": vm["uuid"], "name": vm["name"]},
                   target=vm["host"], deadline=ACTION_DEADLINE, label=vm["name"])
    done = (yield from _idempotent(step)) if disown else (yield step)
    state = "destroyed"
    if not done.ok:
        if not (disown and done.status == "lost"):
            return _outcome(vm, vm["uuid"], vm["host"], "error", done.error or done.status)
        marked = yield from _idempotent(Request("disown", {
            "uuid": vm["uuid"], "host": vm["host"], "automation": ctx.automation_id,
            "reason": f"destroy: {done.error or done.status}"}, label=vm["name"]))
        if not marked.ok:
            return _outcome(vm, vm["uuid"], vm["host"], "error",
                            f"{done.error or done.status}; disown: {marked.error}")
        state = "disowned"
    released = yield from _idempotent(Request("release", {"consumer": vm["uuid"]},
                                              label=vm["name"]))
    if not released.ok:
        return _outcome(vm, vm["uuid"], vm["host"], "error", f"release: {released.error}")
    return _outcome(vm, vm["uuid"], vm["host"], state)


locked_destroy_one = _locked(destroy_one)


@automation("destroy", version=3)
def destroy(ctx, vms):
    """Since version 3 under the VM's lock; destroy takes over a lock that a
    failed move left held for an operator."""
    results = yield ctx.all([ctx.worker(locked_destroy_one, vm, True, why="being destroyed",
                                        force=True, label=vm["name"]) for vm in vms])
    return _finish(results, "destroyed")


@automation("destroy", version=2)
def destroy_v2(ctx, vms):
    results = yield ctx.all([ctx.worker(destroy_one, vm, True, label=vm["name"])
                             for vm in vms])
    return _finish(results, "destroyed")


@automation("destroy", version=1)
def destroy_v1(ctx, vms):
    """Without re-send or disown: kept so that destroys started before
    version 2 replay."""
    results = yield ctx.all([ctx.worker(destroy_one, vm, label=vm["name"]) for vm in vms])
    return _finish(results, "destroyed")


def _act_one(ctx, vm, request, resend=True, token=False):
    """Since version 2 a step whose outcome was lost (its host's peer died
    after or while running it) is sent again: start, stop, suspend and
    resume are idempotent by uuid, so the second run finds the first one's
    result.  Version 1 (``resend=False``) reports the loss as an error.

    ``reboot`` cannot tell a second reboot from a retry by the VM's state:
    with ``token`` the automation's id goes along, the host records it on the
    running domain, and a re-sent reboot finds it done."""
    args = {"uuid": vm["uuid"], "name": vm["name"]}
    if token:
        args["token"] = ctx.automation_id
    step = Request(request, args, target=vm["host"], deadline=ACTION_DEADLINE,
                   label=vm["name"])
    done = (yield from _idempotent(step)) if resend else (yield step)
    if not done.ok:
        return _outcome(vm, vm["uuid"], vm["host"], "error", done.error or done.status)
    return _outcome(vm, vm["uuid"], vm["host"], (done.value or {}).get("state", "running"))


locked_act_one = _locked(_act_one)


def _action(request, verb, version=3, token=False):
    resend = version >= 2

    def act(ctx, vms):
        if version >= 3:
            workers = [ctx.worker(locked_act_one, vm, request, resend, token,
                                  why=f"being {verb}",
                                  label=vm["name"]) for vm in vms]
        else:
            workers = [ctx.worker(_act_one, vm, request, resend, token, label=vm["name"])
                       for vm in vms]
        results = yield ctx.all(workers)
        return _finish(results, verb)
    act.__name__ = request if version == 3 else f"{request}_v{version}"
    return automation(request, version=version)(act)


# Version 3: under the VM's lock (never interleaved with a move).
start = _action("start", "started")
stop = _action("stop", "stopped")
reboot = _action("reboot", "rebooted", token=True)
suspend = _action("suspend", "suspended")
resume = _action("resume", "resumed")
# Version 2 of each: no lock; version 1: no re-send of a lost step (and no
# reboot token).  Kept so that automations started before replay as they began.
start_v2 = _action("start", "started", 2)
stop_v2 = _action("stop", "stopped", 2)
reboot_v2 = _action("reboot", "rebooted", 2, token=True)
suspend_v2 = _action("suspend", "suspended", 2)
resume_v2 = _action("resume", "resumed", 2)
start_v1 = _action("start", "started", 1)
stop_v1 = _action("stop", "stopped", 1)
reboot_v1 = _action("reboot", "rebooted", 1)
suspend_v1 = _action("suspend", "suspended", 1)
resume_v1 = _action("resume", "resumed", 1)
