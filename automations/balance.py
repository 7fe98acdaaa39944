"""``balance``: run a plan of moves that evens out hosts (planned by
:func:`engine.planning.balance.plan_balance` before this starts, and given
whole in the arguments, so that every replay runs the same plan).

The plan's sets run in order; the moves of one set touch disjoint hosts
and run in ``parallel`` lanes.  For each move:

1. ``balance_check``: the move checked again against the cluster as it is
   now (the VM still where the plan found it, not held, the destination
   still allowed and the gain still worth it).  A move no longer good is
   ``skipped``, with the reason; the check's answer is logged, so a replay
   skips the same moves.
2. The move itself, as ``migrate`` makes it (:func:`automations.moves.move_one`:
   lock, claim the destination in placement, copy or redefine, confirm
   or revert), to the planned host only.
3. After a confirmed move, ``balance_note``: the VM's hold starts
   (``balanced/<uuid>``): no balance moves it again for ``hold`` seconds.

At the end ``balance_score`` measures the score of the plan's hosts now.
``abort`` stops the lanes from starting more moves (those left are
``aborted``); a move under way is confirmed or reverted as a migration is.

The result: ``{score_before, score_planned, score_after, moves: [{vm, uuid,
from, to, gain, set, state, error}]}``, a move's ``state`` ``moved``,
``skipped`` (``error`` says why), ``failed`` (it stayed, or nobody can tell
where it is: see ``error``) or ``aborted``.  The automation fails, keeping
that result, when a move failed.
"""
from engine.core.registry import automation
from engine.core.replay import Request
from engine.errors import Failed

from automations._steps import resend
from automations.moves import move_one

CHECK_DEADLINE = 60.0


def _row(move: dict, state: str, error: str | None = None) -> dict:
    return {"vm": move["vm"], "uuid": move["uuid"], "from": move["from"], "to": move["to"],
            "gain": move["gain"], "set": move["set"], "state": state, "error": error}


def _request(move: dict, name: str, args: dict) -> Request:
    return Request(name, {"uuid": move["uuid"], "name": move["vm"], **args},
                   deadline=CHECK_DEADLINE, label=move["vm"])


def balance_one(ctx, move, hosts, hold, min_gain):
    """One planned move: check it, make it, start its hold."""
    checked = yield from resend(_request(move, "balance_check", {
        "source": move["from"], "dest": move["to"], "hosts": hosts, "hold": hold,
        **({"min_gain": min_gain} if min_gain is not None else {})}))
    if not checked.ok:
        return _row(move, "skipped", f"could not check it: {checked.error or checked.status}")
    if checked.value["reason"]:
        return _row(move, "skipped", checked.value["reason"])
    vm = {"name": move["vm"], "uuid": move["uuid"], "host": move["from"]}
    moved = yield ctx.worker(move_one, vm, move["to"], False, None, False, True,
                             label=move["vm"])
    if moved["host"] != move["to"]:
        return _row(move, "failed", moved["error"] or f"it stayed on {moved['host']}")
    noted = yield from resend(_request(move, "balance_note", {
        "automation": ctx.automation_id, "time": ctx.now(), "hold": hold}))
    error = moved["error"]
    if not noted.ok:        # moved all the same; only its hold is missing
        error = "; ".join(filter(None, [error, f"hold not noted: {noted.error or noted.status}"]))
    return _row(move, "moved", error)


def _lane(ctx, moves, hosts, hold, min_gain):
    """Moves one after another; after an abort, start no more."""
    rows = []
    for move in moves:
        if ctx.aborted:
            rows.append(_row(move, "aborted", "not moved: aborted"))
            continue
        rows.append((yield ctx.worker(balance_one, move, hosts, hold, min_gain,
                                      label=move["vm"])))
    return rows


def _sets(moves: list[dict]) -> list[list[dict]]:
    by_set: dict[int, list[dict]] = {}
    for move in moves:
        by_set.setdefault(move["set"], []).append(move)
    return [by_set[index] for index in sorted(by_set)]


@automation("balance", version=1, cleans_up=True)
def balance(ctx, moves, hosts=None, parallel=4, hold=None, min_gain=None,
            score_before=None, score_after=None):
    """``moves``: the plan's rows ``[{vm, uuid, from, to, gain, set}]``;
    ``hosts``: the hosts it evens out (None: all); ``hold``: seconds a moved
    VM is held (checked moves skip VMs still held); ``score_before`` and
    ``score_after``: the plan's, reported beside the score reached."""
    rows = []
    for members in _sets(moves):
        if ctx.aborted:
            rows += [_row(move, "aborted", "not moved: aborted") for move in members]
            continue
        lanes = max(1, min(int(parallel or 1), len(members)))
        done = yield ctx.all([ctx.worker(_lane, members[i::lanes], hosts, hold, min_gain)
                              for i in range(lanes)])
        by_uuid = {row["uuid"]: row for lane in done for row in lane}
        rows += [by_uuid[move["uuid"]] for move in members]
    measured = yield from resend(Request("balance_score", {"hosts": hosts},
                                         deadline=CHECK_DEADLINE))
    result = {"score_before": score_before, "score_planned": score_after,
              "score_after": measured.value["score"] if measured.ok else None, "moves": rows}
    failed = [row for row in rows if row["state"] == "failed"]
    if failed:
        raise Failed(f"{len(failed)} of {len(rows)} moves failed: "
                     + "; ".join(f"{row['vm']}: {row['error']}" for row in failed[:5]), result)
    return result
