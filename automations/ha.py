"""HA: ``ha`` sets VMs' policy; ``recover`` restarts a dead host's HA VMs
on other hosts; ``ha_restart`` restarts an HA VM that crashed or went
missing on a live host.

``ha`` per VM: ``lock_vm``, ``set_ha`` on its host (the domain's metadata,
which the host's guard reads, and its record), ``unlock_vm``.

``recover``:

Started by the ``recoverer`` singleton (``engine/hypervisor/ha/recoverer.py``) once a
host's lease has expired and the fencing margin has passed.  One worker per
VM, all in parallel:

1. ``ha_lock``: the VM's lock, only while its host is still dead.  A host
   that came back keeps its VMs (the VM is ``left``, no error).
2. ``vm_definition``: what the VM was built from (``vmdef/<uuid>``).
3. ``claim_move``: the best live host but the dead one (the VM's traits,
   never a drained host); the instance's allocations go there while a
   migration consumer holds the dead host's, as for a move.
4. ``build`` there, from the definition, policy ``restart``, marked
   ``recovered`` from the dead host.  With local disks the new copy starts
   from the VM's image: its state in the result is ``restarted`` and its
   record says ``recovered``.  A failed build is cleaned up (destroyed, or
   disowned when that host died too), the claim reverted, and the next
   host tried, up to ``attempts``.
5. ``confirm_move`` (the dead host's allocations go), ``disown`` with
   ``keep`` (when the dead host comes back its copy is stopped, undefined,
   and its disks are kept aside, listed by ``peerctl aside``), then
   ``unlock_vm`` dropping the dead host's ``vms/`` record in the same write.

A VM that found no host stays listed on the dead host (state ``unknown``),
its lock released, and the recoverer tries again later.  Every step is
idempotent, so the automation survives the death of any member, its
initiator included.

``ha_restart`` (one VM; started by the same ``recoverer`` from a
``restart/<uuid>`` request its host's publisher wrote): ``lock_vm`` while
the VM is listed on its host; ``ha_start`` there, which starts it again in
place when its domain is there (and leaves a VM running again, or stopped
on purpose meanwhile); a domain gone from the host is rebuilt elsewhere by
steps 2-5 above.  ``note_restart`` counts the restart in the VM's record
(``restarts``), which is how the recoverer stops after
``ha_max_restarts`` within ``ha_restart_window`` (docs/ha.md).
"""
from engine.core.registry import automation
from engine.core.replay import Request

from automations._steps import finish, resend

BUILD_DEADLINE = 300.0
ACTION_DEADLINE = 120.0


def _result(vm, host, state, error=None, note=None):
    return {"name": vm["name"], "uuid": vm["uuid"], "from": vm["host"], "host": host,
            "state": state, "error": error, "note": note}


def recover_one(ctx, vm, attempts=3, note=False, replicas=False):
    """``note`` (version 2): the restart is counted in the VM's record;
    ``replicas`` (version 3): a replicated VM restarts from its replica."""
    uuid, dead, name = vm["uuid"], vm["host"], vm["name"]
    step = _stepper(vm)
    locked = yield from resend(step("ha_lock", {"host": dead, "owner": ctx.automation_id}))
    if not locked.ok:
        return _result(vm, dead, "unknown", locked.error)
    if not locked.value["locked"]:
        return _result(vm, dead, "left", note=locked.value["why"])
    return (yield from _rebuild_elsewhere(ctx, vm, step, attempts, note, replicas))


def _stepper(vm):
    def step(request, args, target=None, deadline=ACTION_DEADLINE):
        return Request(request, {"uuid": vm["uuid"], "name": vm["name"], **args},
                       target=target, deadline=deadline, label=vm["name"])
    return step


def _unlock(ctx, step, **extra):
    return resend(step("unlock_vm", {"owner": ctx.automation_id, **extra}))


def _restarted(ctx, step, migration, source, dest, note, reason):
    """Step 5: the VM runs on ``dest``; ``source`` lets go of it."""
    yield from resend(step("confirm_move", {"consumer": migration}))
    yield from resend(step("disown", {"host": source, "keep": True,
                                      "automation": ctx.automation_id, "reason": reason}))
    if note:
        yield from resend(step("note_restart", {"host": dest, "time": ctx.now(),
                                                "automation": ctx.automation_id}))
    yield from _unlock(ctx, step, drop_record=source)


def _rebuild_elsewhere(ctx, vm, step, attempts, note, replicas=False):
    """Steps 2-5 of the module docstring, under the VM's lock: the VM is
    built again from its definition on another live host, and ``vm['host']``
    lets go of it.  With ``replicas`` (recover version 3, ha_restart version
    2), a replicated VM is built on its replica's host from its replica
    instead (:func:`_from_replica`), and never from its image unless its
    replication allows that fallback."""
    uuid, source = vm["uuid"], vm["host"]
    defined = yield from resend(step("vm_definition", {}))
    if not defined.ok:
        yield from _unlock(ctx, step)
        return _result(vm, source, "unknown", defined.error)
    build = dict(defined.value)
    migration = ctx.uuid("recovery/" + uuid)
    if replicas:
        known = yield from resend(step("replica_of", {}))
        if not known.ok:
            yield from _unlock(ctx, step)
            return _result(vm, source, "unknown", known.error or known.status)
        replica = known.value
        if replica["replicated"]:
            why = replica.get("why")
            if replica["usable"]:
                done, why = yield from _from_replica(ctx, vm, step, build, migration,
                                                     replica["replica"], note)
                if done is not None:
                    return done
            if replica.get("fallback") != "image":
                yield from _unlock(ctx, step)
                return _result(vm, source, "unknown",
                               f"not restarted from its image: {why}; its replication "
                               "does not allow that (replicate --from-image-if-no-replica)")
    tried, reasons = [], []
    for _ in range(attempts):
        claimed = yield from resend(step("claim_move", {
            "consumer": migration, "source": source, "required": build.get("required"),
            "exclude": tried, "live_only": True}))
        if not claimed.ok:
            reasons.append(f"no host can take it: {claimed.error}")
            break
        dest = claimed.value["host"]
        # Not re-sent: a build lost with its host is retried on another one.
        built = yield step("build", {**build, "ha": "restart",
                                     "recovered": {"from": source, "time": ctx.now()}},
                           dest, BUILD_DEADLINE)
        if built.ok:
            yield from _restarted(ctx, step, migration, source, dest, note,
                                  f"restarted on {dest}")
            return _result(vm, dest, "restarted",
                           note=f"started from its image; its disks on {source} are kept "
                                "aside when it comes back")
        tried.append(dest)
        reasons.append(f"{dest}: {built.error or built.status}")
        cleaned = yield from resend(step("destroy", {}, dest))
        if not cleaned.ok:
            yield from resend(step("disown", {"host": dest, "automation": ctx.automation_id,
                                              "reason": f"recovery build {built.status}"}))
        yield from resend(step("revert_move", {"consumer": migration}))
    yield from _unlock(ctx, step)
    return _result(vm, source, "unknown", "; ".join(reasons) or "no attempt left")


def _from_replica(ctx, vm, step, build, migration, replica, note):
    """``(result, None)``: the VM built on its replica's host from the
    replica (its allocations moved there, the replica promoted to its
    disks); ``(None, why)`` when that failed before the replica was used."""
    source, there = vm["host"], replica["host"]
    claimed = yield from resend(step("claim_move", {
        "consumer": migration, "source": source, "required": build.get("required"),
        "hosts": there, "exclude": [], "live_only": True}))
    if not claimed.ok:
        return None, f"its replica's host {there} cannot take it: {claimed.error}"
    promoted = yield from resend(step("replica_promote", {"owner": ctx.automation_id}, there,
                                      BUILD_DEADLINE))
    if not promoted.ok:
        yield from resend(step("revert_move", {"consumer": migration}))
        return None, f"its replica on {there}: {promoted.error or promoted.status}"
    recovered = {"from": source, "time": ctx.now(), "data_as_of": promoted.value["time"]}
    built = yield step("build", {**build, "ha": "restart", "disk_ready": True,
                                 "recovered": recovered}, there, BUILD_DEADLINE)
    if not built.ok:
        # the disks are the replica's data: kept aside there, never deleted
        yield from resend(step("disown", {"host": there, "keep": True,
                                          "automation": ctx.automation_id,
                                          "reason": f"build from replica {built.status}"}))
        yield from resend(step("revert_move", {"consumer": migration}))
        yield from _unlock(ctx, step)
        return _result(vm, source, "unknown",
                       f"build from its replica on {there}: {built.error or built.status}; "
                       f"its disks are kept aside there (peerctl aside)"), None
    yield from _restarted(ctx, step, migration, source, there, note,
                          f"restarted on {there} from its replica")
    result = _result(vm, there, "restarted",
                     note=f"started from its replica on {there}; its disks on {source} are "
                          "kept aside when it comes back")
    return {**result, "recovered": recovered}, None


def restart_one(ctx, vm, attempts=3, replicas=False):
    """An HA VM found down or missing on its live host ``vm['host']``: under
    its lock, ``ha_start`` there starts it again in place; a domain that is
    gone from that host is rebuilt elsewhere, exactly as for a dead host
    (claim, build, confirm, disown with ``keep``, unlock dropping the
    host's record).  Each restart is counted in the VM's record."""
    where = vm["host"]
    step = _stepper(vm)
    locked = yield from resend(step("lock_vm", {
        "host": where, "owner": ctx.automation_id, "kind": "recover",
        "why": f"being restarted: {vm.get('why') or 'down'} on {where}"}))
    if not locked.ok:
        return _result(vm, where, "left", note=locked.error)
    started = yield from resend(step("ha_start", {}, where))
    if not started.ok:
        yield from _unlock(ctx, step)
        return _result(vm, where, "unknown", started.error or started.status)
    if started.value["state"] == "absent":
        return (yield from _rebuild_elsewhere(ctx, vm, step, attempts, True, replicas))
    if not started.value.get("restarted"):
        yield from _unlock(ctx, step)
        return _result(vm, where, "left", note=started.value.get("why"))
    yield from resend(step("note_restart", {"host": where, "time": ctx.now(),
                                            "automation": ctx.automation_id}))
    yield from _unlock(ctx, step)
    return _result(vm, where, "restarted", note="started again in place")


def policy_one(ctx, vm, policy):
    step = {"uuid": vm["uuid"], "name": vm["name"]}
    locked = yield from resend(Request("lock_vm", {
        **step, "host": vm["host"], "owner": ctx.automation_id,
        "why": "changing its HA policy"}, label=vm["name"]))
    if not locked.ok:
        return {**vm, "ha": None, "error": locked.error}
    done = yield from resend(Request("set_ha", {**step, "ha": policy}, target=vm["host"],
                                     deadline=ACTION_DEADLINE, label=vm["name"]))
    yield from resend(Request("unlock_vm", {**step, "owner": ctx.automation_id},
                              label=vm["name"]))
    if not done.ok:
        return {**vm, "ha": None, "error": done.error or done.status}
    return {**vm, "ha": done.value["ha"], "error": None}


@automation("ha", version=1)
def ha(ctx, vms, policy):
    """``policy`` (restart or none) for ``vms`` ``[{name, uuid, host}]``."""
    results = yield ctx.all([ctx.worker(policy_one, vm, policy, label=vm["name"])
                             for vm in vms])
    return finish([{**r, "state": "error" if r["error"] else "set"} for r in results],
                  "changed")


@automation("recover", version=3)
def recover(ctx, host, vms, attempts=3):
    """``host``: the dead host; ``vms``: its HA VMs ``{name, uuid, host}``.
    Since version 2 each restart is counted in the VM's record; since
    version 3 a replicated VM restarts from its replica."""
    results = yield ctx.all([ctx.worker(recover_one, vm, attempts, True, True,
                                        label=vm["name"]) for vm in vms])
    return finish(results, "restarted")


@automation("recover", version=2)
def recover_v2(ctx, host, vms, attempts=3):
    """From the image always: kept so that recoveries started before
    version 3 replay."""
    results = yield ctx.all([ctx.worker(recover_one, vm, attempts, True, label=vm["name"])
                             for vm in vms])
    return finish(results, "restarted")


@automation("recover", version=1)
def recover_v1(ctx, host, vms, attempts=3):
    """Without counting restarts: kept so that recoveries started before
    version 2 replay."""
    results = yield ctx.all([ctx.worker(recover_one, vm, attempts, label=vm["name"])
                             for vm in vms])
    return finish(results, "restarted")


@automation("ha_restart", version=2)
def ha_restart(ctx, vm, attempts=3):
    """``vm``: ``{name, uuid, host, why}``, an HA VM found down (``crashed``)
    or ``missing`` on its live host (:func:`restart_one`); since version 2,
    one missing is rebuilt from its replica when it has one."""
    result = yield ctx.worker(restart_one, vm, attempts, True, label=vm["name"])
    return finish([result], "restarted")


@automation("ha_restart", version=1)
def ha_restart_v1(ctx, vm, attempts=3):
    """From the image always: kept so that restarts started before version
    2 replay."""
    result = yield ctx.worker(restart_one, vm, attempts, label=vm["name"])
    return finish([result], "restarted")
