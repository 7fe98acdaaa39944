"""Backups: ``backup`` copies VMs' disks to another host, ``restore``
rebuilds a VM from a backup chain, ``backup_delete`` removes backups.

``backup``, per VM (one worker each, all in parallel):

1. ``lock_vm`` (kind ``backup``): no move, destroy or second backup of the
   VM meanwhile; each is refused with a line naming this one.
2. ``backup_plan``: the hosts that may keep it, the chain's host first, and
   the parent (the VM's newest recorded backup).
3. ``move_describe`` on the VM's host: its disks' sizes; ``backup_store``
   on the first candidate with room (the next one otherwise).
4. ``backup_take`` on the VM's host: the point in time, and the copy to the
   target (see :mod:`engine.hypervisor.data.backups`).  Incremental only when the
   target is the parent's host.  For a running VM whose target pulls
   (:mod:`engine.hypervisor.data.backup_pull`), no copy: a pull-mode job
   left running, its NBD exports named in the reply.
5. ``backup_verify`` on the target: read back, checksums compared, the
   record ``backups/<id>`` written.  Nothing is listed before this.  With
   exports: the target pulls the disks, checksumming them as they arrive,
   then records.
6. ``backup_finish`` on the VM's host, after a pull: the job ended, its
   scratch files deleted.
7. ``backup_prune`` on the VM's host: only this backup's checkpoint stays.
8. ``unlock_vm``.

A step that fails, or whose peer stays lost, ends the attempt with
``backup_discard`` on both hosts (the job, the scratch volumes, the new
checkpoint, the target's volumes): no half-written backup, no dangling job,
no checkpoint that a record names but that missed its data.

``restore``: ``restore_plan`` (the chain, every link's host up), ``claim``
(placement picks the host, the VM's size, ``--on``), ``restore_export`` on
the chain's host (every link checked against its record, then the chain
served read-only over NBD as one image), ``restore_disks`` on the claimed
host (the export copied into the VM's disk, each block read once),
``restore_unexport`` (whatever happened), ``build`` on those disks; on
failure the host is cleared and the claim released.

The backup id and a new VM's uuid derive from the automation, so a replay
names the same ones.
"""
from engine.core.registry import automation
from engine.core.replay import Request
from engine.errors import Failed

from automations._steps import disk_copy_deadline, finish, first_willing, resend

STEP_DEADLINE = 120.0
BUILD_DEADLINE = 300.0


def _row(vm, error=None, taken=None, target=None, backup_id=None):
    taken = taken or {}
    return {"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"],
            "state": "error" if error else "done", "backup": None if error else backup_id,
            "kind": taken.get("kind"), "bytes": taken.get("bytes"),
            "consistency": taken.get("consistency"), "target": target,
            "reason": taken.get("reason"), "error": error}


def backup_one(ctx, vm, to=None, full=False, run=None, schedule=None, protect=False):
    """``run``: the run of a schedule (a schedule backs a VM up once per
    run); ``schedule``: its id, recorded so that it prunes only what it
    made; ``protect``: the record is written protected."""
    name = "backup/" + vm["uuid"] + ("" if run is None else f"/{run}")
    backup_id = ctx.uuid(name).replace("-", "")[:16]

    def step(request, args, target=None, deadline=STEP_DEADLINE):
        return Request(request, {"uuid": vm["uuid"], "name": vm["name"], **args},
                       target=target, deadline=deadline, label=vm["name"])

    locked = yield from resend(step("lock_vm", {
        "host": vm["host"], "owner": ctx.automation_id, "kind": "backup",
        "why": "being backed up"}))
    if not locked.ok:
        return _row(vm, locked.error or locked.status)
    error, taken, store = None, None, None
    planned = yield from resend(step("backup_plan", {"host": vm["host"], "to": to,
                                                     "full": bool(full)}))
    described = None
    if planned.ok:
        described = yield from resend(step("move_describe", {}, vm["host"]))
    if not planned.ok or not described.ok:
        error = (planned if not planned.ok else described).error or "lost"
    else:
        disks = described.value.get("disks") or []
        needed = sum(d.get("capacity", 0) for d in disks)
        store, refused = yield from first_willing(
            planned.value["candidates"],
            lambda candidate: step("backup_store", {"id": backup_id, "needed": needed},
                                   candidate))
        if store is None:
            error = "no host could keep it: " + refused
        else:
            marks = {**({"schedule": schedule} if schedule else {}),
                     **({"protected": True} if protect else {})}
            error, taken = yield from _take(step, vm, backup_id, planned.value, store, disks,
                                            full, marks)
    if error and store is not None:
        for where in (vm["host"], store["host"]):
            yield from resend(step("backup_discard", {"id": backup_id}, where))
    yield from resend(step("unlock_vm", {"owner": ctx.automation_id}))
    return _row(vm, error, taken, store and store["host"], backup_id)


def _take(step, vm, backup_id, plan, store, disks, full, marks):
    """``(error, taken)``: the backup taken, verified, recorded, and the
    VM's older checkpoints pruned."""
    parent = plan["parent"] if plan["parent"] and \
        plan["parent"]["target"] == store["host"] else None
    why_full = plan.get("why_full")
    if plan["parent"] and parent is None:
        why_full = (f"the previous backup {plan['parent']['id']} is on "
                    f"{plan['parent']['target']}, which could not take this one")
    taken = yield from resend(step("backup_take", {
        "id": backup_id, "store": store, "parent": parent, "full": bool(full),
        "why_full": why_full}, vm["host"], disk_copy_deadline(disks)), tries=2)
    if not taken.ok:
        return f"{taken.status}: {taken.error}" if taken.error else taken.status, None
    taken = taken.value
    record = {"id": backup_id, "vm": vm["name"], "uuid": vm["uuid"], "host": vm["host"],
              "target": store["host"], "time": taken["time"], "kind": taken["kind"],
              "parent": taken["parent"], "bytes": taken["bytes"],
              "consistency": taken["consistency"], "reason": taken["reason"],
              "checkpoint": taken["checkpoint"], "disks": taken["disks"],
              "build": taken["build"], **marks}
    verified = yield from resend(step("backup_verify", {"id": backup_id, "record": record},
                                      store["host"], disk_copy_deadline(disks)))
    if not verified.ok:
        return f"verify on {store['host']}: {verified.error or verified.status}", None
    if any(disk.get("export") for disk in taken["disks"]):
        # a pull-mode job: the target read everything and recorded it; the
        # job ends (the sweep ends it if this step is lost)
        yield from resend(step("backup_finish", {"id": backup_id}, vm["host"]))
        taken = {**taken, "bytes": verified.value["bytes"], "disks": verified.value["disks"]}
    if taken["checkpoint"]:
        yield from resend(step("backup_prune", {"keep": taken["checkpoint"]}, vm["host"]))
    return None, taken


@automation("backup", version=1, cleans_up=True)
def backup(ctx, vms, to=None, full=False, protect=False):
    """Back up each of ``vms`` (``[{name, uuid, host, state}]``) to a host
    matching ``to`` (any other live host when None); ``full``: no
    incremental; ``protect``: each backup recorded protected (given only
    when True, so that older automations replay alike)."""
    results = yield ctx.all([ctx.worker(backup_one, vm, to, full, protect=protect,
                                        label=vm["name"]) for vm in vms])
    return finish(results, "backed up")


# -- restore -----------------------------------------------------------------

def _restored(name, uuid, backup_id, host=None, state="error", error=None):
    return {"vms": [{"name": name, "uuid": uuid, "host": host, "state": state,
                     "restored_from": backup_id, "error": error}]}


@automation("restore", version=3, cleans_up=True, feature_level=5)
def restore(ctx, backup, name, uuid=None, on=None):
    """Rebuild VM ``name`` from ``backup`` (and its chain) on a host
    placement picks (matching ``on``); ``uuid`` None: a new VM.
    ``restore_plan`` holds every backup of the chain for this automation
    (no prune or delete takes one while it reads them), and
    ``backup_release`` lets go at its end, done or failed; a restore that
    dies first leaves holds that are stale once it is no longer running.
    Since version 3 the chain's host serves it as one image over NBD
    (``restore_export``) that the restoring host copies once."""
    return (yield from _holding(ctx, backup, name, uuid, on, stream=True))


@automation("restore", version=2, cleans_up=True, feature_level=4)
def restore_v2(ctx, backup, name, uuid=None, on=None):
    """Holds, and each link copied through libvirt: kept so that restores
    started before version 3 replay."""
    return (yield from _holding(ctx, backup, name, uuid, on, stream=False))


def _holding(ctx, backup, name, uuid, on, stream):
    held = []
    try:
        result = yield from _restore(ctx, backup, name, uuid, on, held, stream)
    except Failed as exc:
        if held:
            yield from resend(Request("backup_release", {"backups": held,
                                                         "owner": ctx.automation_id},
                                      deadline=STEP_DEADLINE, label=name))
        raise exc
    yield from resend(Request("backup_release", {"backups": held, "owner": ctx.automation_id},
                              deadline=STEP_DEADLINE, label=name))
    return result


@automation("restore", version=1, cleans_up=True)
def restore_v1(ctx, backup, name, uuid=None, on=None):
    """Without holds: kept so that restores started before version 2 replay."""
    return (yield from _restore(ctx, backup, name, uuid, on, None))


def _restore(ctx, backup, name, uuid, on, held, stream=False):
    """The restore itself; ``held`` (a list, or None: no hold asked) gets
    the ids of the chain the plan held; ``stream``: through the chain's
    NBD export when every link is on one host."""
    uuid = uuid or ctx.uuid("vm/" + name)

    def step(request, args, target=None, deadline=STEP_DEADLINE):
        return Request(request, {"uuid": uuid, "name": name, **args}, target=target,
                       deadline=deadline, label=name)

    planned = yield from resend(step("restore_plan", {"backup": backup} if held is None
                                     else {"backup": backup, "owner": ctx.automation_id}))
    if not planned.ok:
        return _failed(name, uuid, backup, planned.error or planned.status)
    if held is not None:
        held.extend(link["id"] for link in planned.value["chain"])
    record = planned.value["record"]
    build = record["build"]
    resources = {"VCPU": build.get("vcpus") or 1, "MEMORY_MB": build.get("memory_mb") or 256,
                 "DISK_GB": build.get("disk_gb") or 0}
    claim = yield from resend(step("claim", {
        "consumer": uuid, "resources": resources, "required": build.get("required"),
        "hosts": on, "exclude": [], "project": ctx.automation_id}))
    if not claim.ok:
        return _failed(name, uuid, backup, f"no host: {claim.error or claim.status}")
    host = claim.value["host"]
    chain = planned.value["chain"]
    keeper = chain[0]["host"] if stream and len({link["host"] for link in chain}) == 1 \
        else None
    export, error = None, None
    if keeper is not None:
        served = yield from resend(step("restore_export", {
            "owner": ctx.automation_id, "chain": chain}, keeper,
            disk_copy_deadline(record["disks"])), tries=2)
        if served.ok:
            export = served.value
        else:
            error = f"backup chain on {keeper}: {served.error or served.status}"
    if error is None:
        made = yield from resend(step("restore_disks", {
            "chain": chain, **({"export": export} if export else {})}, host,
            disk_copy_deadline(record["disks"]) * (1 if export else len(chain))), tries=2)
        error = None if made.ok else f"disks on {host}: {made.error or made.status}"
    if keeper is not None:      # the export ends whatever happened
        yield from resend(step("restore_unexport", {"owner": ctx.automation_id}, keeper))
    if error is None:
        built = yield step("build", {**build, "uuid": uuid, "name": name, "disk_ready": True,
                                     "restored": {"backup": backup, "time": record["time"]}},
                           host, BUILD_DEADLINE)
        if built.ok:
            return _restored(name, uuid, backup, host, built.value.get("state", "running"))
        error = f"build on {host}: {built.error or built.status}"
    yield from resend(step("destroy", {}, host))
    yield from resend(step("release", {"consumer": uuid}))
    return _failed(name, uuid, backup, error)


def _failed(name, uuid, backup, error):
    raise Failed(f"VM {name!r} not restored from backup {backup}: {error}",
                 _restored(name, uuid, backup, error=error))


# -- delete ------------------------------------------------------------------

@automation("backup_delete", version=1)
def backup_delete(ctx, backups):
    """Delete ``backups`` (``[{id, vm, uuid, target}]``) in the order given
    (children before their parents), each on its target host."""
    done = []
    for entry in backups:
        deleted = yield from resend(Request("backup_delete", {"id": entry["id"]},
                                            target=entry["target"], deadline=STEP_DEADLINE,
                                            label=entry.get("vm") or entry["id"]))
        done.append({"id": entry["id"], "vm": entry.get("vm"), "target": entry["target"],
                     "state": "deleted" if deleted.ok else "error",
                     "error": None if deleted.ok else deleted.error or deleted.status})
        if not deleted.ok:
            break           # its parents stay: a chain is never cut in the middle
    failed = [d for d in done if d["error"]]
    if failed or len(done) < len(backups):
        raise Failed(f"backup {failed[0]['id'] if failed else '?'} not deleted: "
                     f"{failed[0]['error'] if failed else 'stopped'}", {"backups": done})
    return {"backups": done}
