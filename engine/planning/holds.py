"""Balance's records in etcd: the cluster's balance settings, and the hold
``balance`` leaves on each VM it moved.

- ``settings/balance`` ``{auto, threshold, rounds, hold, time, by}``: one
  record for the cluster, written whole by ``balance --auto on|off``; no
  record reads as the defaults (auto off).  ``auto``: the ``balancer``
  singleton (:mod:`engine.planning.auto`) starts a balance when the score stayed
  above ``threshold`` for ``rounds`` rounds in a row; ``hold``: seconds a
  VM moved by a balance is not moved by another.
- ``balanced/<uuid>`` ``{uuid, time, automation}``: a balance moved the VM
  at ``time`` (:mod:`engine.planning.snapshot` makes it ``stuck`` while its
  hold runs).
- ``balancer/status`` ``{host, round, score, above, busy, time, started}``:
  what the ``balancer`` on ``host`` saw in its last round while ``auto`` is
  on (its rounds counted since it leads; the score, None while a balance
  runs; how many rounds in a row it was above the threshold; the last
  balance it started); ``balance --auto show`` prints it.

Promises:
- a settings record that cannot be read, or holds a value out of range,
  reads as the defaults (reported once): a bad record can turn ``auto``
  off, never make the balancer act on nonsense;
- holds do not pile up: :func:`prune_holds` drops every mark whose hold
  ended more than a hold ago (the ``balance_note`` request after each move,
  and the ``balancer`` singleton every few minutes, call it), so a
  destroyed VM's mark goes too.
"""
from __future__ import annotations

import dataclasses
import math
import time

from engine.core import keys
from engine.core.store import Delete, modified_at
from engine.core.values import declare, readable, shape
from engine.errors import UsageError
from engine.planning.snapshot import HOLD_SECONDS

__all__ = ["BalanceSettings", "SETTINGS", "HOLD", "DEFAULT_THRESHOLD", "DEFAULT_ROUNDS",
           "read_settings", "write_settings", "checked_settings", "note_hold", "prune_holds",
           "running_balances", "MOVING", "is_running", "automation_args", "read_status"]

# The score (engine/planning/score.py) --auto acts above: an evenly filled
# cluster with VMs coming and going stays below it (tests/test_balance.py
# simulates an hour of it), half its hosts full and half empty is far above
# (about 1.1).  Proxmox CRS's ha-auto-rebalance-threshold defaults to 0.3 too.
DEFAULT_THRESHOLD = 0.3
DEFAULT_ROUNDS = 3           # rounds in a row above it first (CRS's hold duration)

SETTINGS = shape("balance settings", auto=bool, threshold=(int, float), rounds=int,
                 hold=(int, float))
HOLD = shape("balance hold", uuid=str, time=(int, float), automation=str)
STATUS = shape("balancer status", host=str, round=int, score=(int, float, type(None)),
               above=int, time=(int, float))
declare(keys.BALANCE_SETTINGS, SETTINGS)
declare(keys.balanced() + "*", HOLD)
declare(keys.BALANCER_STATUS, STATUS)


@dataclasses.dataclass(frozen=True)
class BalanceSettings:
    auto: bool = False
    threshold: float = DEFAULT_THRESHOLD
    rounds: int = DEFAULT_ROUNDS
    hold: float = HOLD_SECONDS

    def doc(self) -> dict:
        return dataclasses.asdict(self)


def checked_settings(current: BalanceSettings, *, auto=None, threshold=None, rounds=None,
                     hold=None) -> BalanceSettings:
    """``current`` with the values given (None: as it is), each checked: a
    bad one is a ``UsageError`` naming it."""
    if auto is not None and not isinstance(auto, bool):
        raise UsageError(f"bad balance auto {auto!r} (want on or off)")
    if threshold is not None and not (isinstance(threshold, (int, float))
                                      and not isinstance(threshold, bool)
                                      and math.isfinite(threshold) and threshold > 0):
        raise UsageError(f"bad balance threshold {threshold!r} (want a score above 0, "
                         f"e.g. {DEFAULT_THRESHOLD})")
    if rounds is not None and not (isinstance(rounds, int) and not isinstance(rounds, bool)
                                   and 1 <= rounds <= 10_000):
        raise UsageError(f"bad balance rounds {rounds!r} (want a whole number, 1 to 10000)")
    if hold is not None and not (isinstance(hold, (int, float)) and not isinstance(hold, bool)
                                 and math.isfinite(hold) and hold >= 0):
        raise UsageError(f"bad balance hold {hold!r} (want seconds, 0 or more)")
    given = {"auto": auto, "threshold": threshold, "rounds": rounds, "hold": hold}
    return dataclasses.replace(current, **{k: v for k, v in given.items() if v is not None})


def read_settings(store) -> BalanceSettings:
    """The cluster's balance settings (the defaults where there is no record,
    or it cannot be used)."""
    record = readable(store.get(keys.BALANCE_SETTINGS))
    if record is None:
        return BalanceSettings()
    try:
        return checked_settings(BalanceSettings(), auto=record["auto"],
                                threshold=record["threshold"], rounds=record["rounds"],
                                hold=record["hold"])
    except UsageError as exc:
        from engine.core.values import report
        report(keys.BALANCE_SETTINGS, str(exc))
        return BalanceSettings()


def write_settings(store, settings: BalanceSettings, by: str) -> BalanceSettings:
    """``settings`` as the cluster's, whole."""
    store.put(keys.BALANCE_SETTINGS, {**settings.doc(), "time": time.time(), "by": by})
    return settings


def read_status(store) -> dict | None:
    """The balancer's last round (None: it never ran with ``auto`` on)."""
    return readable(store.get(keys.BALANCER_STATUS))


def note_hold(store, uuid: str, automation: str, when: float) -> None:
    """VM ``uuid`` was moved by balance ``automation`` at ``when``: its hold
    runs from then.  Written again with the same values, the same mark."""
    store.put(keys.balanced(uuid), {"uuid": uuid, "time": float(when),
                                    "automation": automation})


def prune_holds(store, hold: float, now: float | None = None) -> int:
    """Drop the marks whose hold ended more than ``hold`` seconds ago, and
    those nobody can read (each only if unchanged since read); how many
    went."""
    now = time.time() if now is None else now
    gone = 0
    for kv in store.range(keys.balanced())[0]:
        mark = readable(kv)
        if mark is not None and now - mark["time"] <= 2 * hold:
            continue        # its hold runs, or ended lately: kept
        if store.txn([modified_at(kv.key, kv.mod_revision)], [Delete(kv.key)]).succeeded:
            gone += 1
    return gone


# automations that move VMs: the balancer starts nothing while one runs (CRS
# waits for every migration it queued, and a move in flight is counted on
# two hosts)
MOVING = ("balance", "migrate", "evacuate", "recover", "ha_restart")


def running_balances(store, kinds: tuple = ("balance",)) -> list[str]:
    """The automations of ``kinds`` (balances) that have not ended, oldest
    first."""
    from engine.core.api import running_kinds
    return running_kinds(store, kinds)


def is_running(store, automation_id: str | None) -> bool:
    """Whether ``automation_id`` has not ended (one read: its status)."""
    if not automation_id:
        return False
    status = readable(store.get(keys.status(automation_id)))
    return status is not None and status["state"] not in keys.TERMINAL_STATES


def automation_args(planned, hosts: list[str] | None, parallel: int, hold: float) -> dict:
    """The ``balance`` automation's arguments for ``planned`` (a
    :class:`~engine.planning.balance.BalancePlan`), written once for the
    command line and the ``balancer``: the plan's moves, the hosts it
    evens out (None: all), how many moves at once, the hold, the minimum
    gain each move must still make when checked, the scores planned."""
    from engine.planning.balance import MIN_GAIN
    return {"moves": planned.to_rows(), "hosts": hosts, "parallel": parallel, "hold": hold,
            "min_gain": MIN_GAIN, "score_before": round(planned.score_before, 6),
            "score_after": round(planned.score_after, 6)}
