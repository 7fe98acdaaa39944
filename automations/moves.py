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

Since ``evacuate`` version 4 (:func:`move_some`) the lanes move batches of
up to :data:`BATCH` VMs of one source host, and each step above is one
step for the whole batch where a move is a redefinition: ``lock_vms``,
``move_describe_vms``, ``claim_moves`` (one placement pass, one write),
``move_redefine_vms`` on each destination (prepare and adopt), then for
the VMs defined there ``destroy_vms`` on the source, ``confirm_moves`` and
``unlock_vms`` (``requests/moves.py``).  Every promise above holds VM by
VM: a VM refused at a step leaves the batch there with its own error, and
one whose redefinition failed or went unanswered is decided from both
hypervisors alone (step 6).  A VM on another driver moves alone once
locked: its copy is its time.
"""
from dataclasses import dataclass
from typing import Any

from engine.core.registry import automation
from engine.core.replay import Request, Response

from automations._handoff import prepared_from_replica
from automations._steps import finish, resend

ACTION_DEADLINE = 120.0
TIMEOUT_PER_GIB = 120.0         # seconds of copy per GiB of RAM and disk
ACTIVE = ("running", "paused")


def _result(vm, host, state, mode=None, error=None, copied=None, via=None):
    copied = copied or {}
    return {"name": vm["name"], "uuid": vm["uuid"], "from": vm["host"], "host": host,
            "state": state, "mode": mode, "downtime_ms": copied.get("downtime_ms"),
            "bytes": copied.get("bytes"), "disk_bytes": copied.get("disk_bytes"),
            "via_replica": via, "error": error}


def _copy_deadline(described: dict) -> float:
    gib = described.get("memory_mb", 0) / 1024 + \
        sum(d.get("capacity", 0) for d in described.get("disks") or ()) / (1 << 30)
    return max(300.0, TIMEOUT_PER_GIB * gib * 1.5 + 120.0)


@dataclass
class _Move:
    """One VM's move, filled in as :func:`move_one` learns it: the steps
    that follow read it instead of a long list of arguments.  It lives in
    one replay only; everything in it comes from the arguments and the
    logged answers, so every replay fills it alike."""
    ctx: Any
    vm: dict                    # {name, uuid, host, state?}: as the automation was given it
    was: str | None = None      # its state on the source before the move
    mode: str | None = None     # live, cold or redefine
    migration: str | None = None    # placement consumer holding the source's share
    dest: str | None = None
    stopped: bool = False       # stopped on the source for an offline move
    via: Any = None             # the replica it moved onto, or why the disks went whole

    @property
    def uuid(self) -> str:
        return self.vm["uuid"]

    @property
    def name(self) -> str:
        return self.vm["name"]

    @property
    def source(self) -> str:
        return self.vm["host"]

    @property
    def final(self) -> str:
        """The state the VM must have on the destination."""
        return "running" if self.stopped else self.was

    def step(self, request, args, target=None, deadline=ACTION_DEADLINE) -> Request:
        return Request(request, {"uuid": self.uuid, "name": self.name, **args}, target=target,
                       deadline=deadline, label=self.name)

    def unlock(self, **extra):
        return resend(self.step("unlock_vm", {"owner": self.ctx.automation_id, **extra}))

    def result(self, host, state, error=None, copied=None) -> dict:
        return _result(self.vm, host, state, self.mode, error, copied, self.via)


def _locate(move: _Move, described, prepared):
    """``(state at source, state at dest)``, each running, paused, shutoff,
    absent or unreachable, as the hypervisors say."""
    if described["driver"].upper() == "TEST":     # each peer's test driver is its own
        states = []
        for host in (move.source, move.dest):
            info = yield from resend(Request("vm_info", {"uuid": move.uuid}, target=host,
                                             deadline=ACTION_DEADLINE, label=move.name))
            states.append(info.value["state"] if info.ok else "unreachable")
        return tuple(states)
    found = yield from resend(Request("move_locate", {
        "uuid": move.uuid, "hosts": {"source": described["libvirt_uri"],
                                     "dest": prepared["libvirt_uri"]},
        "wait": _copy_deadline(described)},
        deadline=_copy_deadline(described) + 60, label=move.name))
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


def move_one(ctx, vm, to=None, offline=False, bandwidth_mib=None, postcopy=False,
             replicas=False, max_downtime_ms=None, stop_to_redefine=True):
    """One VM's move, steps 1 to 7 of the module's docstring; its result
    row, ``error`` saying what went wrong.  With ``replicas`` (migrate and
    evacuate version 2), a live move to the VM's replica's host copies only
    what changed since the replica (``automations/_handoff.py``).  Without
    ``stop_to_redefine`` (evacuate version 3) a running VM on the test
    driver is redefined without being stopped first, as a live move leaves
    it running: a step and its record writes fewer per VM."""
    move = _Move(ctx, vm)
    locked = yield from resend(move.step("lock_vm", {
        "host": move.source, "owner": ctx.automation_id, "kind": "migrate",
        "why": "being moved"}))
    if not locked.ok:
        return move.result(move.source, vm.get("state"), locked.error)
    return (yield from _move_locked(move, to, offline, bandwidth_mib, postcopy, replicas,
                                    max_downtime_ms, stop_to_redefine))


def _move_locked(move: _Move, to, offline, bandwidth_mib, postcopy, replicas,
                 max_downtime_ms, stop_to_redefine):
    """:func:`move_one` once the VM's lock is held: steps 2 to 7."""
    ctx, vm = move.ctx, move.vm
    described = yield from resend(move.step("move_describe", {}, move.source))
    if not described.ok:
        yield from move.unlock()
        return move.result(move.source, vm.get("state"), described.error or described.status)
    described = described.value
    move.was = described["state"]
    if described["driver"].upper() == "TEST":
        move.mode = "redefine"
    else:
        move.mode = "live" if move.was in ACTIVE and not offline else "cold"
    move.migration = ctx.uuid("migration/" + move.uuid)
    claimed = yield from resend(move.step("claim_move", {
        "consumer": move.migration, "source": move.source, "hosts": to,
        "required": described.get("required"),
        # only when planned (evacuate): moves logged before plans replay alike
        **({"prefer": vm["prefer"]} if vm.get("prefer") else {})}))
    if not claimed.ok:
        yield from move.unlock()
        return move.result(move.source, move.was, f"no destination: {claimed.error}")
    move.dest = claimed.value["host"]

    if move.mode != "live" and move.was in ACTIVE and \
            (stop_to_redefine or move.mode != "redefine"):     # an offline move: stop it first
        halted = yield from resend(move.step("stop", {}, move.source))
        if not halted.ok:
            return (yield from _revert(move, f"stop before the move: {halted.error}"))
        move.stopped = True

    prepared = None
    if replicas and move.mode == "live":
        prepared, move.via = yield from prepared_from_replica(move, described)
        if prepared is None and move.via:
            move.via = {"used": False, "why": move.via}
    if prepared is None:
        prepared = yield from resend(move.step("move_prepare", {"describe": described},
                                               move.dest))
        if not prepared.ok:
            return (yield from _revert(
                move, f"prepare on {move.dest}: {prepared.error or prepared.status}"))
        prepared = prepared.value
    else:
        move.via = {"used": True, **move.via}

    moved = yield from _copy(move, described, prepared, bandwidth_mib, postcopy,
                             max_downtime_ms)
    outcome, why = yield from _outcome(move, moved, described, prepared)
    if outcome == "confirm":
        copied = (moved.value or {}) if moved.ok and move.mode != "redefine" else {}
        return (yield from _confirm(move, copied))
    if outcome in ("revert", "both"):
        return (yield from _revert(move, why or "the move did not complete"))
    return (yield from _keep_both(move, why))


def _copy(move: _Move, described, prepared, bandwidth_mib, postcopy, max_downtime_ms=None):
    """The move itself, one step: the domain defined anew on the test
    driver, else libvirt's copy from the source.  Its answer, unresent: a
    copy whose outcome is unknown is decided from both hosts, never run
    twice.  Options not given are left out of the request, so that a move
    logged before they existed replays alike."""
    if move.mode == "redefine":
        return (yield move.step("move_adopt", {"xml": prepared["xml"], "state": move.final},
                                move.dest))
    return (yield move.step("move_migrate", {
        "destination": move.dest, "destination_uri": prepared["libvirt_uri"],
        "xml": prepared["xml"], "disks": [d["dev"] for d in prepared["disks"]],
        "incremental": prepared["incremental"], "live": move.mode == "live",
        "timeout_per_gib": TIMEOUT_PER_GIB,
        **({"bandwidth_mib": bandwidth_mib} if bandwidth_mib else {}),
        **({"max_downtime_ms": max_downtime_ms} if max_downtime_ms else {}),
        **({"postcopy": True} if postcopy else {})},
        move.source, _copy_deadline(described)))


def _outcome(move: _Move, moved, described, prepared):
    """``(outcome, why)``: see :func:`_decide`; a redefinition that
    succeeded is confirmed at once, anything else is decided from what
    both hypervisors say."""
    why = None if moved.ok else f"{moved.status}: {moved.error}"
    if moved.ok and move.mode == "redefine":
        return "confirm", why
    at_source, at_dest = yield from _locate(move, described, prepared)
    outcome = _decide(move.mode if move.mode == "live" else "cold",
                      "shutoff" if move.stopped else move.was, at_source, at_dest)
    if outcome == "unknown":
        why = (f"{why or 'moved'}; then the source has it {at_source} and the "
               f"destination {at_dest}")
    return outcome, why


def _gone(move: _Move, host, why):
    """Destroy the VM's copy on ``host``; if that host's peer is dead, disown
    it there (it destroys the copy when it comes back)."""
    done = yield from resend(move.step("destroy", {}, host))
    if done.ok or done.status != "lost":
        return done
    return (yield from resend(move.step("disown", {
        "host": host, "automation": move.ctx.automation_id, "reason": why})))


def _confirm(move: _Move, copied):
    """The destination has it: settle its state there, destroy the source's
    copy, let placement drop the migration's hold on the source."""
    errors, final = [], move.final
    if move.mode != "redefine":
        settled = yield from resend(move.step("move_adopt", {"state": final}, move.dest))
        if not settled.ok:
            errors.append(f"on {move.dest}: {settled.error or settled.status}")
            final = "error"
    cleaned = yield from _gone(move, move.source, "moved away")
    if not cleaned.ok:
        errors.append(f"cleaning {move.source}: {cleaned.error or cleaned.status}")
    confirmed = yield from resend(move.step("confirm_move", {"consumer": move.migration}))
    if not confirmed.ok:
        errors.append(f"placement: {confirmed.error}")
    yield from move.unlock(drop_record=move.source)
    return move.result(move.dest, final, "; ".join(errors) or None, copied)


def _revert(move: _Move, why):
    """The source keeps it: destroy the destination's copy, give the
    instance its source allocations back, start again what an offline move
    stopped."""
    errors = [f"not moved: {why}"]
    cleaned = yield from _gone(move, move.dest, "move reverted")
    if not cleaned.ok:
        errors.append(f"cleaning {move.dest}: {cleaned.error or cleaned.status}")
    reverted = yield from resend(move.step("revert_move", {"consumer": move.migration}))
    if not reverted.ok:
        errors.append(f"placement: {reverted.error}")
    state = move.was
    if move.stopped:
        restarted = yield from resend(move.step("start", {}, move.source))
        state = (restarted.value or {}).get("state", "error") if restarted.ok else "shutoff"
    yield from move.unlock()
    return move.result(move.source, state, "; ".join(errors))


def _keep_both(move: _Move, why):
    """Nobody runs it: keep both disks and every copy, count it on the
    source, and hold its lock until an operator decides."""
    yield from resend(move.step("revert_move", {"consumer": move.migration}))
    yield from move.unlock(hold=f"a move to {move.dest} failed and no host runs it ({why}); "
                                f"both copies and disks are kept: destroy it, or start it "
                                f"by hand")
    return move.result(move.source, "error", why)


def _lane(ctx, vms, to, offline, bandwidth_mib, postcopy=False, replicas=False,
          max_downtime_ms=None, stop_to_redefine=True):
    """Move ``vms`` one after another; after an abort, start no more."""
    results = []
    for vm in vms:
        if ctx.aborted:
            results.append(_result(vm, vm["host"], vm.get("state"), error="not moved: aborted"))
            continue
        results.append((yield ctx.worker(move_one, vm, to, offline, bandwidth_mib, postcopy,
                                         replicas, max_downtime_ms, stop_to_redefine,
                                         label=vm["name"])))
    return results


def _in_lanes(ctx, vms, to, offline, parallel, bandwidth_mib=None, postcopy=False,
              replicas=False, max_downtime_ms=None, stop_to_redefine=True):
    lanes = max(1, min(int(parallel or 1), len(vms)))
    done = yield ctx.all([ctx.worker(_lane, vms[i::lanes], to, offline, bandwidth_mib,
                                     postcopy, replicas, max_downtime_ms, stop_to_redefine)
                          for i in range(lanes)])
    by_uuid = {r["uuid"]: r for lane in done for r in lane}
    return [by_uuid[vm["uuid"]] for vm in vms]


# -- evacuate version 4: up to BATCH VMs of one source host to a step -------------

BATCH = 16          # VMs in one batched step (requests/moves.py: MAX_VMS)


def _batches(vms: list[dict], parallel) -> list[list[dict]]:
    """``vms`` cut into batches of one source host each, small enough that
    ``parallel`` lanes all get some: at most :data:`BATCH`."""
    by_source: dict[str, list[dict]] = {}
    for vm in vms:
        by_source.setdefault(vm["host"], []).append(vm)
    size = max(1, min(BATCH, -(-len(vms) // max(1, int(parallel or 1)))))
    return [group[start:start + size] for group in by_source.values()
            for start in range(0, len(group), size)]


def _batch_step(request: str, moves: list[_Move], items: list[dict], target=None,
                field: str = "vms", **common) -> Request:
    return Request(request, {**common, field: items}, target=target, deadline=ACTION_DEADLINE,
                   label=",".join(m.name for m in moves))     # progress views: each VM's


def _replies(reply, moves: list[_Move], field: str = "vms") -> list[tuple]:
    """``(move, value, error)`` for each of ``moves`` from a batched step's
    reply: a step that failed as a whole fails each VM alike."""
    if not reply.ok:
        return [(move, None, reply.error or reply.status) for move in moves]
    return [(move, one.get("value"), one.get("error"))
            for move, one in zip(moves, reply.value[field])]


def _unlock_all(moves: list[_Move], drop_record: str | None = None):
    """``unlock_vm`` of each of ``moves`` in one step (``drop_record``: the
    source's ``vms/`` records dropped in the same write)."""
    if moves:
        yield from resend(_batch_step("unlock_vms", moves, [
            {"uuid": m.uuid, "name": m.name, **({"drop_record": drop_record}
                                                if drop_record else {})} for m in moves],
            owner=moves[0].ctx.automation_id))


def move_some(ctx, vms, to=None, bandwidth_mib=None):
    """The moves of ``vms`` (one source host), each step of the module's
    docstring made for all of them at once where the move is a
    redefinition (the test driver): locked, described, claimed (one
    placement pass), redefined on each destination, the source's copies
    destroyed, confirmed and unlocked, one step each.  A VM refused at a
    step leaves the batch there, as it would leave its own move (unlocked,
    or decided from both hypervisors and reverted or kept, as
    :func:`move_one`); a VM on another driver, once locked, moves alone
    (:func:`move_one`'s steps, its copy being most of its time)."""
    moves = [_Move(ctx, vm) for vm in vms]
    source, results = moves[0].source, {}
    locked = yield from resend(_batch_step("lock_vms", moves, [
        {"uuid": m.uuid, "name": m.name, "host": m.source} for m in moves],
        owner=ctx.automation_id, kind="migrate", why="being moved"))
    held = []
    for move, _value, error in _replies(locked, moves):
        if error:
            results[move.uuid] = move.result(source, move.vm.get("state"), error)
        else:
            held.append(move)
    if not held:
        return [results[m.uuid] for m in moves]

    described = yield from resend(_batch_step("move_describe_vms", held, [
        {"uuid": m.uuid, "name": m.name} for m in held], target=source))
    redefine, alone, let_go = [], [], []
    for move, value, error in _replies(described, held):
        if error:
            results[move.uuid] = move.result(source, move.vm.get("state"), error)
            let_go.append(move)
            continue
        move.was, move.migration = value["state"], ctx.uuid("migration/" + move.uuid)
        if value["driver"].upper() == "TEST":
            move.mode = "redefine"
            redefine.append((move, value))
        else:
            alone.append(move)

    claimed = []
    if redefine:
        reply = yield from resend(_batch_step("claim_moves", [m for m, _ in redefine], [
            {"uuid": m.uuid, "name": m.name, "consumer": m.migration, "source": source,
             "hosts": to, "required": d.get("required"),
             **({"prefer": m.vm["prefer"]} if m.vm.get("prefer") else {})}
            for m, d in redefine], field="moves"))
        for (move, value, error), (_, desc) in zip(
                _replies(reply, [m for m, _ in redefine], "moves"), redefine):
            if error:
                results[move.uuid] = move.result(source, move.was, f"no destination: {error}")
                let_go.append(move)
            else:
                move.dest = value["host"]
                claimed.append((move, desc))
    yield from _unlock_all(let_go)

    workers = [ctx.worker(_redefine, claimed)] if claimed else []
    if alone:
        workers.append(ctx.worker(_move_alone, alone, to, bandwidth_mib, label=alone[0].name))
    if workers:
        for row in _flat((yield ctx.all(workers))):
            results[row["uuid"]] = row
    return [results[m.uuid] for m in moves]


def _move_alone(ctx, moves: list[_Move], to, bandwidth_mib):
    """The locked VMs of a batch that are no redefinition, one after the
    other as a lane of version 3 moves them (so that no more copies run at
    once than there are lanes), each with a fresh ``move_describe`` (the
    batch's may be minutes old by the time its copy starts).  After an
    abort, the ones not started are let go."""
    results = []
    for n, move in enumerate(moves):
        if ctx.aborted:
            for left in moves[n:]:
                left.ctx = ctx
            yield from _unlock_all(moves[n:])
            return results + [m.result(m.source, m.was, "not moved: aborted")
                              for m in moves[n:]]
        move.ctx = ctx
        results.append((yield from _move_locked(move, to, False, bandwidth_mib, False, True,
                                                None, False)))
    return results


def _redefine(ctx, claimed: list[tuple]):
    """The claimed VMs defined anew on their destinations, one step per
    destination, all at once; those defined are confirmed together
    (:func:`_confirm_all`), any other decided from both hypervisors, alone,
    as :func:`move_one` decides it."""
    dests = sorted({move.dest for move, _ in claimed})
    each = [[(m, d) for m, d in claimed if m.dest == dest] for dest in dests]
    defined = yield ctx.all([_batch_step("move_redefine_vms", [m for m, _ in there], [
        {"uuid": m.uuid, "name": m.name, "describe": d, "state": m.final} for m, d in there],
        target=dest) for dest, there in zip(dests, each)])
    confirmed, undecided = [], []
    for reply, there in zip(defined, each):
        for (move, _value, error), (_, desc) in zip(_replies(reply, [m for m, _ in there]),
                                                     there):
            if error:
                undecided.append((move, desc, error))
            else:
                confirmed.append(move)
    done = yield ctx.all(([ctx.worker(_confirm_all, confirmed)] if confirmed else [])
                         + [ctx.worker(_decide_one, move, desc, error, label=move.name)
                            for move, desc, error in undecided])
    return _flat(done)


def _flat(done: list) -> list[dict]:
    """Result rows from workers that answer one row or a list of them."""
    return [row for part in done for row in (part if isinstance(part, list) else [part])]


def _decide_one(ctx, move: _Move, described: dict, error: str):
    """A redefinition that failed, or whose outcome is unknown: decided
    from what both hypervisors say, then confirmed, reverted or kept."""
    move.ctx = ctx
    outcome, why = yield from _outcome(move, Response("error", error=error), described, None)
    if outcome == "confirm":
        return (yield from _confirm(move, {}))
    if outcome in ("revert", "both"):
        return (yield from _revert(move, why or "the move did not complete"))
    return (yield from _keep_both(move, why))


def _confirm_all(ctx, moves: list[_Move]):
    """:func:`_confirm` for VMs defined on their destination, one step per
    action for all: the source's copies destroyed (``disown``\\ed, VM by VM,
    when its peer is dead), placement's holds on the source dropped, the
    locks and the source's records released."""
    source, errors = moves[0].source, {m.uuid: [] for m in moves}
    for move in moves:
        move.ctx = ctx
    cleaned = yield from resend(_batch_step("destroy_vms", moves, [
        {"uuid": m.uuid, "name": m.name} for m in moves], target=source))
    for move, _value, error in _replies(cleaned, moves):
        if error and cleaned.ok:
            errors[move.uuid].append(f"cleaning {source}: {error}")
        elif error:         # the step as a whole: each VM alone, disowned if lost
            gone = yield from _gone(move, source, "moved away")
            if not gone.ok:
                errors[move.uuid].append(f"cleaning {source}: {gone.error or gone.status}")
    confirmed = yield from resend(_batch_step("confirm_moves", moves, [
        {"uuid": m.uuid, "consumer": m.migration} for m in moves], field="moves"))
    for move, _value, error in _replies(confirmed, moves, "moves"):
        if error:
            errors[move.uuid].append(f"placement: {error}")
    yield from _unlock_all(moves, drop_record=source)
    return [m.result(m.dest, m.final, "; ".join(errors[m.uuid]) or None) for m in moves]


def _batch_lane(ctx, batches, to, bandwidth_mib):
    """Move ``batches`` one after another; after an abort, start no more."""
    results = []
    for batch in batches:
        if ctx.aborted:
            results += [_result(vm, vm["host"], vm.get("state"), error="not moved: aborted")
                        for vm in batch]
            continue
        results += (yield ctx.worker(move_some, batch, to, bandwidth_mib,
                                     label=batch[0]["name"]))
    return results


@automation("migrate", version=2, cleans_up=True)
def migrate(ctx, vms, to=None, offline=False, parallel=4, bandwidth_mib=None,
            postcopy=False, max_downtime_ms=None):
    """``bandwidth_mib``: a cap on each copy, MiB/s (libvirt's migration
    bandwidth), for moves that must not fill a link; ``postcopy``: a live
    copy that has not converged in time switches to post-copy instead of
    being aborted; ``max_downtime_ms``: the longest pause QEMU may plan for
    the switch-over of a live copy (absent in moves started before it
    existed: QEMU's own default, 300 ms).  Since version 2 a live move to
    the VM's replica's host copies only what changed since the replica."""
    results = yield from _in_lanes(ctx, vms, to, offline, parallel, bandwidth_mib, postcopy,
                                   True, max_downtime_ms)
    return finish(results, "moved")


@automation("migrate", version=1, cleans_up=True)
def migrate_v1(ctx, vms, to=None, offline=False, parallel=4, bandwidth_mib=None,
               postcopy=False):
    """Disks always copied whole: kept so that moves started before
    version 2 replay."""
    results = yield from _in_lanes(ctx, vms, to, offline, parallel, bandwidth_mib, postcopy)
    return finish(results, "moved")


@automation("evacuate", version=4, cleans_up=True, feature_level=3)
def evacuate(ctx, hosts, vms, to=None, parallel=4, bandwidth_mib=None):
    """Version 3's moves, made :data:`BATCH` VMs of a host to a step where
    a move is a redefinition (:func:`move_some`): ``parallel`` lanes of
    batches, each batch no larger than spreads the VMs over every lane."""
    batches = _batches(vms, parallel)
    lanes = max(1, min(int(parallel or 1), len(batches)))
    done = yield ctx.all([ctx.worker(_batch_lane, batches[i::lanes], to, bandwidth_mib)
                          for i in range(lanes)])
    by_uuid = {r["uuid"]: r for lane in done for r in lane}
    return finish([by_uuid[vm["uuid"]] for vm in vms], "moved")


@automation("evacuate", version=3, cleans_up=True, feature_level=2)
def evacuate_v3(ctx, hosts, vms, to=None, parallel=4, bandwidth_mib=None):
    """The hosts are drained before this starts (by the command line): the
    VMs on them move away, live where running, cold where shut off (a live
    move to a VM's replica's host copies what changed since the replica).
    Since version 3 a running VM on the test driver is redefined without
    being stopped first (docs/moves.md: ``stop`` is for offline moves)."""
    results = yield from _in_lanes(ctx, vms, to, False, parallel, bandwidth_mib, False, True,
                                   stop_to_redefine=False)
    return finish(results, "moved")


@automation("evacuate", version=2, cleans_up=True)
def evacuate_v2(ctx, hosts, vms, to=None, parallel=4, bandwidth_mib=None):
    """A running VM on the test driver stopped before it is redefined: kept
    so that evacuations started before version 3 replay."""
    results = yield from _in_lanes(ctx, vms, to, False, parallel, bandwidth_mib, False, True)
    return finish(results, "moved")


@automation("evacuate", version=1, cleans_up=True)
def evacuate_v1(ctx, hosts, vms, to=None, parallel=4, bandwidth_mib=None):
    """Disks always copied whole: kept so that evacuations started before
    version 2 replay."""
    results = yield from _in_lanes(ctx, vms, to, False, parallel, bandwidth_mib)
    return finish(results, "moved")
