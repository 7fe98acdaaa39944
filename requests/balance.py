"""The requests of a balance (``automations/balance.py``), run by the
initiator (no target); each reads the cluster as it is when it runs
(:func:`engine.planning.snapshot.read_cluster`), and its answer is logged,
so a replay meets the same answer.

- ``balance_check`` ``{uuid, name, source, dest, hosts, hold, min_gain}``:
  the planned move of VM ``uuid`` from ``source`` to ``dest`` checked
  again against the cluster now -> ``{gain, reason}``, ``reason`` None
  when it is still allowed and still gains what the planner wants of a
  move (:func:`engine.planning.balance.check_move`: ``min_gain`` per host
  scored), else why not ("it is no longer on host3", "host7 is short of
  MEMORY_MB", "it would gain only 0.0002").
- ``balance_note`` ``{uuid, automation, time, hold}``: the VM was moved:
  its hold runs from ``time`` (``balanced/<uuid>``), and marks whose hold
  ended long ago are dropped (:func:`engine.planning.holds.prune_holds`).
  Idempotent.
- ``balance_score`` ``{hosts}`` -> ``{score}``: the score of those hosts
  now (:func:`engine.planning.score.score`).
"""
from engine.planning.holds import note_hold, prune_holds
from engine.core.handlers import handler
from engine.errors import RequestError, UsageError
from engine.placement import for_request
from engine.planning.snapshot import HOLD_SECONDS, read_cluster


def _cluster(host, hold: float = HOLD_SECONDS):
    with for_request(host.store) as placement:
        return read_cluster(host.store, placement, hold=hold)


def _hosts(args: dict) -> list[str] | None:
    hosts = args.get("hosts")
    if hosts is None:
        return None
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise RequestError("hosts must be a list of host names")
    return hosts


def _text(args: dict, *names: str) -> list[str]:
    values = [args.get(name) for name in names]
    if not all(isinstance(v, str) and v for v in values):
        raise RequestError(f"needs {', '.join(names)}")
    return values


def _seconds(args: dict, name: str, default: float) -> float:
    value = args.get(name, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise RequestError(f"{name} must be a number of seconds")
    return float(value)


@handler("balance_check")
def balance_check(host, args: dict) -> dict:
    from engine.planning.balance import MIN_GAIN, check_move
    uuid, source, dest = _text(args, "uuid", "source", "dest")
    min_gain = args.get("min_gain", MIN_GAIN)
    if not isinstance(min_gain, (int, float)) or isinstance(min_gain, bool) or min_gain < 0:
        raise RequestError("min_gain must be a number, 0 or more")
    cluster = _cluster(host, _seconds(args, "hold", HOLD_SECONDS))
    try:
        gain, reason = check_move(cluster, uuid, dest, source=source, hosts=_hosts(args),
                                  min_gain=min_gain)
    except UsageError as exc:       # a host of the plan is no longer known
        return {"gain": 0.0, "reason": str(exc)}
    return {"gain": round(gain, 6), "reason": reason}


@handler("balance_note")
def balance_note(host, args: dict) -> dict:
    uuid, automation = _text(args, "uuid", "automation")
    when = args.get("time")
    if not isinstance(when, (int, float)) or isinstance(when, bool):
        raise RequestError("balance_note needs the time of the move")
    note_hold(host.store, uuid, automation, when)
    pruned = prune_holds(host.store, _seconds(args, "hold", HOLD_SECONDS), when)
    return {"uuid": uuid, "held_since": when, "pruned": pruned}


@handler("balance_score")
def balance_score(host, args: dict) -> dict:
    from engine.planning.score import score
    return {"score": round(score(_cluster(host), _hosts(args)), 6)}
