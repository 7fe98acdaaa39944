"""Several VMs' moves claimed in one transaction: the batched form of
:meth:`~engine.placement.api.Placement.move_to_migration`, for
``claim_moves`` (``requests/moves.py``) on the etcd backend.

An evacuation moves many VMs off one host at once.  Claimed one by one,
each move reads its instance's and its migration's consumers, the
candidates and the providers, then writes its own transaction, and eight
at a time pick the same least loaded host and lose races to each other.
Here one read gives every instance's and migration's document, each move
is placed on the provider view plus the usages of the moves placed before
it (as :meth:`~engine.placement.etcd.EtcdPlacement.claim_new_together`
places new claims), and one transaction writes them all.

Promises:
- each move is exactly ``move_to_migration``: in one write, the instance's
  allocations pass to its migration consumer and the instance is claimed
  on its destination; the transaction compares every consumer and provider
  it depends on, so nothing is overcommitted and a VM is counted on both
  hosts, never on neither;
- idempotent: a move whose migration consumer holds allocations already is
  done, and is answered with where its instance is claimed now;
- a move this could not make (no candidate here, an instance holding
  nothing, the write refused or its outcome unknown) comes back as None:
  its caller moves it alone, the usual way, on a fresh read.  Nothing is
  concluded from the batch but success.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import structlog

from engine.placement.candidates import find_candidates, order
from engine.placement.model import check_uuid, consumer_doc, normalize_allocations
from engine.placement.query import parse_query

__all__ = ["MoveClaim", "move_together", "LIMIT"]

log = structlog.get_logger("placement")

LIMIT = 16      # moves per transaction: two consumers each, and the providers they touch


@dataclass
class MoveClaim:
    """One instance to move: ``allowed(host)`` filters the destinations (the
    source is never one); ``prefer``: a host to take first when it fits (a
    plan's choice)."""
    instance: str
    migration: str
    required: str | None
    allowed: Callable[[str], bool]
    prefer: str | None = None


def _totals(allocations: dict) -> str:
    totals: dict[str, int] = {}
    for resources in allocations.values():
        for rc, n in resources.items():
            totals[rc] = totals.get(rc, 0) + n
    return ",".join(f"{rc}:{n}" for rc, n in sorted(totals.items()))


def _host_of(providers: dict, allocations: dict) -> str | None:
    """The host (root provider's name) ``allocations`` sit on, from the view."""
    roots = {providers[rp]["root"] for rp in allocations if rp in providers
             and "MISC_SHARES_VIA_AGGREGATE" not in providers[rp]["traits"]}
    root = roots.pop() if len(roots) == 1 else None
    return providers[root]["name"] if root in providers else None


def move_together(placement, moves: list[MoveClaim]) -> list[dict | None]:
    """Per move, ``{host, allocations}`` (the instance's new ones), or None
    when it must be moved alone.  Raises what the write raises (nothing is
    then moved by this call)."""
    if not 0 < len(moves) <= LIMIT:
        raise ValueError(f"1 to {LIMIT} moves at once, not {len(moves)}")
    consumers = [check_uuid(c, "consumer") for m in moves for c in (m.instance, m.migration)]
    docs = placement.read_consumers(consumers)
    providers, layout = placement.provider_view()
    working: dict[str, dict] = {}       # provider uuid -> copy with this batch's usages
    want, expect, results = {}, {}, []
    for move in moves:
        inst, held = docs[move.instance], docs[move.migration]
        if held and held["allocations"]:        # moved already: a re-sent step
            where = inst and _host_of(providers, inst["allocations"])
            results.append(where and {"host": where, "allocations": inst["allocations"]})
            continue
        if not inst or not inst["allocations"] or move.instance in want:
            results.append(None)
            continue
        view = {**providers, **working} if working else providers
        ordered = order(find_candidates(view, parse_query(_totals(inst["allocations"]),
                                                          move.required), None, layout))
        if move.prefer:
            ordered.sort(key=lambda c: c["host"] != move.prefer)
        best = next((c for c in ordered if move.allowed(c["host"])), None)
        if best is None:
            results.append(None)
            continue
        destination = normalize_allocations(best["allocations"])
        for rp, resources in destination.items():
            doc = working.get(rp)
            if doc is None:
                doc = working[rp] = dict(view[rp], usages=dict(view[rp]["usages"]))
            for rc, n in resources.items():
                doc["usages"][rc] = doc["usages"].get(rc, 0) + n
        want[move.migration] = consumer_doc(move.migration, inst["allocations"],
                                            inst["project"], inst["user"], "MIGRATION")
        want[move.instance] = consumer_doc(move.instance, destination, inst["project"],
                                           inst["user"], inst["consumer_type"])
        expect.update({move.migration: None, move.instance: inst["generation"]})
        results.append({"host": best["host"], "allocations": destination})
    if want:
        placement.write(want, expect)
    log.info("placement_moves_together", moves=len(moves), written=len(want) // 2)
    return results
