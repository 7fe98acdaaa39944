"""Moving VMs: ``migrate`` and ``evacuate``.

One worker per VM (:func:`move_one`), run in ``parallel`` lanes.  For each VM:

1. ``lock_vm``: one automation at a time acts on a VM; a destroy, stop or
   second migrate meanwhile is refused with a line naming this one.
2. ``move_describe`` on the source: its state, driver, disks, traits.
3. ``claim_move``: placement picks the destination (same amounts, the
   VM's traits, ``--to``, never the source, never a drained host) and, in
   one write, the instance's allocations move there while a migration
   consumer holds the source's.  From here until the end the VM is counted
   on both hosts, never on neither.
4. ``move_prepare`` on the destination: volumes at the source's exact
   virtual sizes (overlays on its own base image when it has it), the
   destination XML.
5. The move, by mode:
   - ``live`` (the VM runs): ``move_migrate`` on the source, libvirt
     peer-to-peer with non-shared storage; the guest never stops;
   - ``cold`` (shut off, or ``--offline``: stopped first): the same copy,
     the domain started paused on the source so that no guest code runs,
     left shut off on the destination;
   - ``redefine`` (the test driver, which cannot migrate): the domain is
     defined anew on the destination; no disk content moves.  It exists so
     that evacuations can be exercised at scale on the test driver.
6. The outcome is decided from both hypervisors (Ganeti's ``migrate
   --cleanup``), whenever the move step was not a plain success and after
   every QEMU move: ``move_locate`` asks both libvirts directly (``vm_info``
   on each peer for the test driver):
   - the destination has it (running, or defined for a cold move) and the
     source runs no copy: **confirm**: the destination's copy is set to the
     VM's state, the source's copy and disks are destroyed (``disown``\\ed
     when its peer is dead), the migration consumer dropped;
   - the source runs it (or has it, for a cold move): **revert**: the
     destination's copy and volumes are destroyed, the instance gets its
     source allocations back, a VM stopped for an offline move is started;
   - it runs on both: the destination's copy is stopped and destroyed, and
     the move reverted;
   - neither: the VM is reported ``error``, both disks are kept, placement
     counts it on the source, and its lock stays *held* so that no sweep
     or automation touches either copy until an operator decides
     (``destroy`` takes it over).
   A VM's disk is never deleted while no copy of it is confirmed elsewhere.
7. ``unlock_vm``, dropping the source's ``vms/`` record in the same write.

``abort`` reaches the copy in progress (the source keeps running) and stops
the lanes from starting more VMs; each VM under way is reverted or
confirmed as above.
"""
from engine.core.registry import automation
from engine.core.replay import Request

from automations._steps import finish, resend

ACTION_DEADLINE = 120.0
TIMEOUT_PER_GIB = 120.0         # seconds of copy per GiB of RAM and disk
ACTIVE = ("running", "paused")


def _result(vm, host, state, mode=None, error=None, copied=None):
    copied = copied or {}
    return {"name": vm["name"], "uuid": vm["uuid"], "from": vm["host"], "host": host,
            "state": state, "mode": mode, "downtime_ms": copied.get("downtime_ms"),
            "bytes": copied.get("bytes"), "error": error}


def _copy_deadline(described: dict) -> float:
    gib = described.get("memory_mb", 0) / 1024 + \
        sum(d.get("capacity", 0) for d in described.get("disks") or ()) / (1 << 30)
    return max(300.0, TIMEOUT_PER_GIB * gib * 1.5 + 120.0)


def _locate(ctx, vm, source, dest, described, prepared):
    """``(state at source, state at dest)``, each running, paused, shutoff,
    absent or unreachable, as the hypervisors say."""
    if described["driver"].upper() == "TEST":     # each peer's test driver is its own
        states = []
        for host in (source, dest):
            info = yield from resend(Request("vm_info", {"uuid": vm["uuid"]}, target=host,
                                             deadline=ACTION_DEADLINE, label=vm["name"]))
            states.append(info.value["state"] if info.ok else "unreachable")
        return tuple(states)
    found = yield from resend(Request("move_locate", {
        "uuid": vm["uuid"], "hosts": {"source": described["libvirt_uri"],
                                      "dest": prepared["libvirt_uri"]},
        "wait": _copy_deadline(described)},
        deadline=_copy_deadline(described) + 60, label=vm["name"]))
    if not found.ok:
        return "unreachable", "unreachable"
    return tuple(_seen(found.value[side]) for side in ("source", "dest"))


def _seen(where: dict) -> str:
    return where["state"] + (f" ({where['error']})" if where.get("error") else "")


def _decide(mode: str, was: str, at_source: str, at_dest: str) -> str:
    """confirm, revert, both (runs on both: stop the destination's, revert)
    or unknown."""
    if mode == "live":
        dest_has = at_dest == "running" if was == "running" else at_dest in ACTIVE
        if at_source in ACTIVE:
            return "both" if dest_has else "revert"
        return "confirm" if dest_has else "unknown"
    if at_source in ACTIVE:
        return "both" if at_dest in ACTIVE else "revert"
    if at_dest in ("running", "paused", "shutoff"):
        return "confirm"
    return "revert" if at_source == "shutoff" else "unknown"


def move_one(ctx, vm, to=None, offline=False, bandwidth_mib=None, postcopy=False):
    uuid, source, name = vm["uuid"], vm["host"], vm["name"]

    def step(request, args, target=None, deadline=ACTION_DEADLINE):
        return Request(request, {"uuid": uuid, "name": name, **args}, target=target,
                       deadline=deadline, label=name)

    locked = yield from resend(step("lock_vm", {
        "host": source, "owner": ctx.automation_id, "kind": "migrate",
        "why": "being moved"}))
    if not locked.ok:
        return _result(vm, source, vm.get("state"), error=locked.error)

    def unlock(**extra):
        return resend(step("unlock_vm", {"owner": ctx.automation_id, **extra}))

    described = yield from resend(step("move_describe", {}, source))
    if not described.ok:
        yield from unlock()
        return _result(vm, source, vm.get("state"), error=described.error or described.status)
    described = described.value
    was = described["state"]
    if described["driver"].upper() == "TEST":
        mode = "redefine"
    else:
        mode = "live" if was in ACTIVE and not offline else "cold"
    migration = ctx.uuid("migration/" + uuid)
    claimed = yield from resend(step("claim_move", {
        "consumer": migration, "source": source, "hosts": to,
        "required": described.get("required")}))
    if not claimed.ok:
        yield from unlock()
        return _result(vm, source, was, mode, f"no destination: {claimed.error}")
    dest = claimed.value["host"]

    stopped = False
    if mode != "live" and was in ACTIVE:           # an offline move: stop it first
        halted = yield from resend(step("stop", {}, source))
        if not halted.ok:
            return (yield from _revert(ctx, vm, step, unlock, migration, dest, mode, False,
                                       f"stop before the move: {halted.error}", was))
        stopped = True
    final = "running" if stopped else was

    prepared = yield from resend(step("move_prepare", {"describe": described}, dest))
    if not prepared.ok:
        return (yield from _revert(ctx, vm, step, unlock, migration, dest, mode, stopped,
                                   f"prepare on {dest}: {prepared.error or prepared.status}",
                                   was))
    prepared = prepared.value

    copied = {}
    if mode == "redefine":
        moved = yield step("move_adopt", {"xml": prepared["xml"], "state": final}, dest)
    else:
        moved = yield step("move_migrate", {
            "destination": dest, "destination_uri": prepared["libvirt_uri"],
            "xml": prepared["xml"], "disks": [d["dev"] for d in prepared["disks"]],
            "incremental": prepared["incremental"], "live": mode == "live",
            "timeout_per_gib": TIMEOUT_PER_GIB,
            **({"bandwidth_mib": bandwidth_mib} if bandwidth_mib else {}),
            **({"postcopy": True} if postcopy else {})},
            source, _copy_deadline(described))
        if moved.ok:
            copied = moved.value or {}
    why = None if moved.ok else f"{moved.status}: {moved.error}"

    if moved.ok and mode == "redefine":
        outcome = "confirm"
    else:
        at_source, at_dest = yield from _locate(ctx, vm, source, dest, described, prepared)
        outcome = _decide(mode if mode == "live" else "cold", "shutoff" if stopped else was,
                          at_source, at_dest)
        if outcome == "unknown":
            why = (f"{why or 'moved'}; then the source has it {at_source} and the "
                   f"destination {at_dest}")

    if outcome == "confirm":
        return (yield from _confirm(ctx, vm, step, unlock, migration, source, dest, mode,
                                    final, copied))
    if outcome in ("revert", "both"):
        return (yield from _revert(ctx, vm, step, unlock, migration, dest, mode, stopped,
                                   why or "the move did not complete", was))
    # Nobody runs it: keep both disks and every copy, count it on the source.
    yield from resend(step("revert_move", {"consumer": migration}))
    yield from unlock(hold=f"a move to {dest} failed and no host runs it ({why}); both "
                           f"copies and disks are kept: destroy it, or start it by hand")
    return _result(vm, source, "error", mode, why)


def _gone(ctx, step, host, why):
    """Destroy the VM's copy on ``host``; if that host's peer is dead, disown
    it there (it destroys the copy when it comes back)."""
    done = yield from resend(step("destroy", {}, host))
    if done.ok or done.status != "lost":
        return done
    return (yield from resend(step("disown", {"host": host, "automation": ctx.automation_id,
                                             "reason": why})))


def _confirm(ctx, vm, step, unlock, migration, source, dest, mode, final, copied):
    errors = []
    if mode != "redefine":
        settled = yield from resend(step("move_adopt", {"state": final}, dest))
        if not settled.ok:
            errors.append(f"on {dest}: {settled.error or settled.status}")
            final = "error"
    cleaned = yield from _gone(ctx, step, source, "moved away")
    if not cleaned.ok:
        errors.append(f"cleaning {source}: {cleaned.error or cleaned.status}")
    confirmed = yield from resend(step("confirm_move", {"consumer": migration}))
    if not confirmed.ok:
        errors.append(f"placement: {confirmed.error}")
    yield from unlock(drop_record=source)
    return _result(vm, dest, final, mode, "; ".join(errors) or None, copied)


def _revert(ctx, vm, step, unlock, migration, dest, mode, stopped, why, was):
    errors = [f"not moved: {why}"]
    cleaned = yield from _gone(ctx, step, dest, "move reverted")
    if not cleaned.ok:
        errors.append(f"cleaning {dest}: {cleaned.error or cleaned.status}")
    reverted = yield from resend(step("revert_move", {"consumer": migration}))
    if not reverted.ok:
        errors.append(f"placement: {reverted.error}")
    state = was
    if stopped:
        restarted = yield from resend(step("start", {}, vm["host"]))
        state = (restarted.value or {}).get("state", "error") if restarted.ok else "shutoff"
    yield from unlock()
    return _result(vm, vm["host"], state, mode, "; ".join(errors))


def _lane(ctx, vms, to, offline, bandwidth_mib, postcopy=False):
    """Move ``vms`` one after another; after an abort, start no more."""
    results = []
    for vm in vms:
        if ctx.aborted:
            results.append(_result(vm, vm["host"], vm.get("state"), error="not moved: aborted"))
            continue
        results.append((yield ctx.worker(move_one, vm, to, offline, bandwidth_mib, postcopy,
                                         label=vm["name"])))
    return results


def _in_lanes(ctx, vms, to, offline, parallel, bandwidth_mib=None, postcopy=False):
    lanes = max(1, min(int(parallel or 1), len(vms)))
    done = yield ctx.all([ctx.worker(_lane, vms[i::lanes], to, offline, bandwidth_mib,
                                     postcopy) for i in range(lanes)])
    by_uuid = {r["uuid"]: r for lane in done for r in lane}
    return [by_uuid[vm["uuid"]] for vm in vms]


@automation("migrate", version=1, cleans_up=True)
def migrate(ctx, vms, to=None, offline=False, parallel=4, bandwidth_mib=None,
            postcopy=False):
    """``bandwidth_mib``: a cap on each copy, MiB/s (libvirt's migration
    bandwidth), for moves that must not fill a link; ``postcopy``: a live
    copy that has not converged in time switches to post-copy instead of
    being aborted."""
    results = yield from _in_lanes(ctx, vms, to, offline, parallel, bandwidth_mib, postcopy)
    return finish(results, "moved")


@automation("evacuate", version=1, cleans_up=True)
def evacuate(ctx, hosts, vms, to=None, parallel=4, bandwidth_mib=None):
    """The hosts are drained before this starts (by the command line): the
    VMs on them move away, live where running, cold where shut off."""
    results = yield from _in_lanes(ctx, vms, to, False, parallel, bandwidth_mib)
    return finish(results, "moved")
