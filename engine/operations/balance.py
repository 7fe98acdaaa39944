"""Balance: even out hosts with live migrations, planned before anything
moves (docs/balance.md); and the cluster's balance settings (``--auto``).

:func:`plan_balance` reads the cluster once (:mod:`engine.planning.snapshot`),
plans greedily (:func:`engine.planning.balance.plan_balance`) and gives a
:class:`BalancePlan`: its dry run is the whole plan (each move with its set,
the score before and after, the hosts each set touches), its automation
(``automations/balance.py``) runs exactly those moves.

Promises:
- a bad HOSTGLOB, ``max_moves`` or ``parallel`` is a ``UsageError`` before
  anything is read; a HOSTGLOB matching no host is one line (exit 1);
- a balance running already is one line naming it, nothing planned: two
  balances would plan the same moves;
- a plan of no moves starts nothing.
"""
from __future__ import annotations

import dataclasses
import fnmatch

from engine.errors import Failed, UsageError
from engine.wording import given

from .plans import Plan, failed_doc
from .select import NoMatch, host_pattern

__all__ = ["BalancePlan", "plan_balance", "balance_settings", "set_balance_settings",
           "MOVE_FIELDS", "RESULT_FIELDS"]

# a planned move's fields, and those of a move in the automation's result
MOVE_FIELDS = ["vm", "uuid", "from", "to", "gain", "set"]
RESULT_FIELDS = [*MOVE_FIELDS, "state", "error"]


@dataclasses.dataclass
class BalancePlan(Plan):
    """A :class:`Plan` whose dry run also says what the plan reaches:
    ``{score_before, score_after, hosts, sets}``."""
    summary: dict = dataclasses.field(default_factory=dict)

    def dry_run(self) -> dict:
        return {"automation": None, "state": "dry-run", **self.summary, "moves": self.targets}


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"bad {given(name, value)} (want a whole number, at least 1)")
    return value


def plan_balance(ctx, hostglob: str | None = None, *, max_moves: int | None = None,
                 parallel: int = 4) -> BalancePlan:
    """The moves that even out the hosts matching ``hostglob`` (all when
    None): only VMs on them move, only between them, at most ``max_moves``,
    ``parallel`` at a time when run."""
    glob = host_pattern(hostglob)       # usage errors before any read
    if max_moves is not None:
        _count(max_moves, "max_moves")
    _count(parallel, "parallel")
    from engine.planning.holds import automation_args, read_settings, running_balances
    from engine.natural import natural_key
    from engine.planning.balance import plan_balance as plan
    from engine.planning.snapshot import read_cluster
    store = ctx.store()
    running = running_balances(store)
    if running:
        raise Failed(f"balance {running[0]} is running: wait for it (wait {running[0]}) "
                     f"or abort it first", result=failed_doc("moves"))
    settings = read_settings(store)
    with ctx.placement() as placement:
        cluster = read_cluster(store, placement, hold=settings.hold)
    hosts = [name for name in cluster.host_names() if fnmatch.fnmatchcase(name, glob)]
    if not hosts:
        raise NoMatch(f"no host matches {hostglob!r}" if hostglob is not None
                      else "no hosts in this cluster: nothing to balance",
                      result=failed_doc("moves"))
    scope = hosts if hostglob is not None else None
    planned = plan(cluster, hosts=scope, max_moves=max_moves)
    rows = planned.to_rows()
    sets = [sorted({host for move in moves for host in (move.source, move.dest)},
                   key=natural_key) for moves in planned.sets()]
    summary = {"score_before": round(planned.score_before, 6),
               "score_after": round(planned.score_after, 6), "hosts": list(planned.hosts),
               "sets": sets}
    args = automation_args(planned, scope, parallel, settings.hold)
    return BalancePlan("balance", args, args["moves"], ask=bool(rows), what="moves",
                       key="moves", summary=summary)


def balance_settings(ctx) -> dict:
    """``{auto, threshold, rounds, hold, status}``: the cluster's settings
    (the defaults where none were set), and the balancer's last round
    (``{host, round, score, above, busy, time, started}``, None before
    its first with ``auto`` on)."""
    from engine.planning.holds import read_settings, read_status
    from .tasks import iso
    store = ctx.store()
    status = read_status(store)
    return {**read_settings(store).doc(),
            "status": dict(status, time=iso(status["time"])) if status else None}


def set_balance_settings(ctx, *, auto: bool | None = None, threshold: float | None = None,
                         rounds: int | None = None, hold: float | None = None,
                         by: str | None = None) -> dict:
    """Change the settings given (the others stay); each is checked before
    anything is read.  The settings now, as :func:`balance_settings`."""
    from engine.planning.holds import BalanceSettings, checked_settings, read_settings, \
        write_settings
    given = {"auto": auto, "threshold": threshold, "rounds": rounds, "hold": hold}
    checked_settings(BalanceSettings(), **given)
    store = ctx.store()
    wanted = checked_settings(read_settings(store), **given)
    if by is None:
        from .moves import operator
        by = operator()
    write_settings(store, wanted, by)
    return balance_settings(ctx)
