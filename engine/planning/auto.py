"""The ``balancer``: the cluster singleton that starts a balance by itself
when the cluster stays uneven (``balance --auto on``).

It follows Proxmox CRS's auto-rebalance (github.com/proxmox/pve-ha-manager
at b71218f, ``src/PVE/HA/Manager.pm``, ``load_balance``): once per round the CRM
computes the nodes' imbalance; it acts only when the imbalance has been
above ``ha-auto-rebalance-threshold`` for ``ha-auto-rebalance-hold-duration``
rounds in a row (default 3), never while a migration it queued is still
running, and only when the migration it found improves the imbalance by at
least ``ha-auto-rebalance-margin`` of it (default 10 %).  Here:

- a round is :data:`ROUND` seconds; each round reads the settings
  (:mod:`engine.planning.holds`) and, while ``auto`` is on and the balance it
  started last has ended, the score of the whole cluster
  (:func:`engine.planning.score.score`);
- :func:`decide`, a pure function of what the rounds saw, says when to
  plan: the score above ``threshold`` for ``rounds`` rounds in a row
  (a running balance, or auto off, starts the count again);
- then, unless an automation that moves VMs runs (a balance started by
  hand, a migrate, an evacuation, an HA recovery:
  :data:`engine.planning.holds.MOVING`), a plan of the
  whole cluster (as ``balance`` makes it) is started as one ``balance``
  automation, recorded like any other, if it has moves and
  lowers the score by at least :data:`MARGIN` of it; the automation and
  the singleton's fence are one write, so a deposed balancer starts
  nothing.  CRS moves one VM per decision; peerctl runs the whole plan,
  whose moves each re-check their gain before they run, and holds every
  VM it moved (``balanced/<uuid>``) so that no later balance moves it back.

Each round with ``auto`` on ends with ``balancer/status`` (what it saw,
fenced); every :data:`PRUNE_EVERY` seconds, auto on or off, it drops hold
marks long expired (:func:`engine.planning.holds.prune_holds`).
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time

import structlog

from engine.planning.holds import (MOVING, BalanceSettings, automation_args, is_running,
                              prune_holds, read_settings, running_balances)
from engine.core import api, keys
from engine.core.store import Put, StoreUnavailable
from engine.errors import Deposed, NoPeers, PlacementError, Unavailable

__all__ = ["Watch", "decide", "balancer", "start_balance", "ROUND", "MARGIN", "PARALLEL",
           "PRUNE_EVERY"]

log = structlog.get_logger("peerctl.balancer")

ROUND = float(os.environ.get("PEERCTL_BALANCE_ROUND", "10"))   # seconds (CRS: its CRM loop)
MARGIN = 0.1            # a plan must lower the score by this share of it (CRS's margin)
PARALLEL = 4            # moves at once, as balance's default
PRUNE_EVERY = 300.0     # seconds between two prunings of expired holds


@dataclasses.dataclass(frozen=True)
class Watch:
    """What the balancer remembers from round to round."""
    above: int = 0          # rounds in a row the score has been above the threshold


def decide(watch: Watch, score: float, settings: BalanceSettings,
           busy: bool) -> tuple[Watch, bool]:
    """After a round that saw ``score`` (``busy``: a balance was running):
    what to remember, and whether to plan a balance now."""
    if not settings.auto or busy or score <= settings.threshold:
        return Watch(), False       # `<=`: a perfectly even cluster never acts (as CRS)
    above = watch.above + 1
    if above < settings.rounds:
        return Watch(above), False
    return Watch(), True


def start_balance(store, candidacy, cluster, settings: BalanceSettings) -> str | None:
    """Plan the whole ``cluster`` and start the ``balance`` automation,
    fenced by ``candidacy``; None when the plan is not worth it."""
    from engine.planning.balance import plan_balance
    planned = plan_balance(cluster)
    worth = planned.score_before - planned.score_after
    if not planned.moves or worth < MARGIN * planned.score_before:
        log.info("balance_not_worth_it", score=round(planned.score_before, 4),
                 planned=round(planned.score_after, 4), moves=len(planned.moves))
        return None
    args = automation_args(planned, None, PARALLEL, settings.hold)
    automation_id, compares, ops = api.automation_ops(store, "balance", args)
    if not candidacy.txn(compares, ops).succeeded:
        return None
    log.warning("balance_started", automation=automation_id, moves=len(planned.moves),
                score=round(planned.score_before, 4), planned=round(planned.score_after, 4))
    return automation_id


def _read_cluster(store, hold: float):
    from engine.placement import open_placement
    from engine.planning.snapshot import read_cluster
    placement = open_placement(None, store)
    try:
        return read_cluster(store, placement, hold=hold)
    finally:
        placement.close()


def _note_round(candidacy, host: str, rounds: int, seen: float | None, watch: Watch,
                busy: bool, started: str | None) -> None:
    """``balancer/status``: what this round saw, fenced."""
    candidacy.txn([], [Put(keys.BALANCER_STATUS, {
        "host": host, "round": rounds, "score": None if seen is None else round(seen, 6),
        "above": watch.above, "busy": busy, "time": time.time(), "started": started})])


def balancer(store, host: str = "", round_seconds: float = ROUND):
    """The singleton's duty (see the module docstring)."""
    def duty(stop: threading.Event, candidacy):
        from engine.planning.score import score
        watch, pruned, rounds, started = Watch(), 0.0, 0, None
        while not stop.wait(round_seconds):
            try:
                settings = read_settings(store)
                if time.monotonic() - pruned >= PRUNE_EVERY:
                    prune_holds(store, settings.hold)
                    pruned = time.monotonic()
                if not settings.auto:
                    watch = Watch()
                    continue
                busy = is_running(store, started)
                cluster = None if busy else _read_cluster(store, settings.hold)
                seen = score(cluster) if cluster is not None else None
                watch, plan_now = decide(watch, seen or 0.0, settings, busy)
                if plan_now and not running_balances(store, MOVING):    # nor any move
                    started = start_balance(store, candidacy, cluster, settings) or started
                rounds += 1
                _note_round(candidacy, host, rounds, seen, watch, busy, started)
            except Deposed:
                return          # the new balancer carries on
            except (StoreUnavailable, Unavailable, PlacementError, NoPeers) as exc:
                log.warning("balancer_unavailable", error=str(exc))
            except Exception as exc:    # a bug must not end the duty while it leads
                log.exception("balancer_round_failed", error=str(exc))
    return duty
