"""Placement as a user inspects it: providers, allocations by consumer, and
where a spec would fit (the full Placement query language)."""
from __future__ import annotations

import uuid

from engine.errors import PlacementError, UsageError

from .select import NoMatch, host_pattern
from .specs import parse_traits

__all__ = ["providers", "allocations", "candidates", "DEFAULT_LIMIT"]

DEFAULT_LIMIT = 10      # candidates shown when neither --limit nor limit= says

_INVENTORY_FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size",
                     "allocation_ratio")


def providers(ctx, pattern: str | None = None) -> list[dict]:
    """``[{uuid, name, parent, generation, inventories, usages, traits,
    aggregates}]`` of the providers whose name matches ``pattern``."""
    glob = host_pattern(pattern)
    with ctx.placement() as service:
        rows = [{"uuid": p["uuid"], "name": p["name"], "parent": p["parent"],
                 "generation": p["generation"],
                 "inventories": {rc: {k: inv[k] for k in _INVENTORY_FIELDS}
                                 for rc, inv in sorted(p["inventories"].items())},
                 "usages": {rc: p["usages"].get(rc, 0) for rc in sorted(p["inventories"])},
                 "traits": sorted(p["traits"]), "aggregates": sorted(p["aggregates"])}
                for p in service.providers(glob)]
    if not rows and pattern is not None:
        raise NoMatch(f"no provider matches {pattern!r}", result=[])
    return rows


def allocations(ctx, consumer: str | None = None) -> list[dict]:
    """``[{consumer, allocations}]``: one consumer, or all; [] when it holds nothing."""
    if consumer is not None:
        try:
            uuid.UUID(consumer)
        except ValueError:
            raise UsageError(f"bad consumer {consumer!r}: not a UUID") from None
    with ctx.placement() as service:
        docs = [service.allocations(consumer)] if consumer else service.all_allocations()
    return [{"consumer": d["consumer"], "allocations": d["allocations"]}
            for d in docs if d["allocations"]]


def candidates_query(spec: str, required: str | None = None, limit: int | None = None):
    """The whole query language (``VCPU:1`` or ``resources=...&resources1=...
    &member_of=...&in_tree=...``), checked without any store; ``--limit``
    wins over ``limit=``; neither: DEFAULT_LIMIT."""
    parse_traits(required)     # a bad --required is blamed on the traits
    from engine.placement.query import parse_query
    try:
        query = parse_query(spec, required or None, limit)
    except PlacementError as exc:
        raise UsageError(f"bad resource spec {spec!r}: {exc}") from None
    if query.limit is None:
        query.limit = DEFAULT_LIMIT
    return query


def candidates(ctx, spec: str, required: str | None = None,
               limit: int | None = None) -> list[dict]:
    """``[{allocations, host}]``: where ``spec`` would fit, best first."""
    query = candidates_query(spec, required, limit)      # exit 2 before etcd
    with ctx.placement() as service:
        try:
            found = service.candidates(query)
        except PlacementError as exc:   # what only the backend knows (a CUSTOM_ class)
            raise UsageError(f"bad resource spec {spec!r}: {exc}") from None
    return [{"allocations": c["allocations"], "host": c["host"]} for c in found]
