"""The JSON shapes of ``peerctl.py placement ...`` (see CONTRACT.md).

Plain functions over a :class:`~engine.placement.api.Placement`; the command
line renders what they return.  Bad specs raise ``PlacementError``.
"""
from __future__ import annotations

from engine.placement.model import check_uuid
from engine.placement.query import Query, parse_query

__all__ = ["providers_rows", "allocations_rows", "candidates_rows", "candidates_query",
           "DEFAULT_LIMIT"]

DEFAULT_LIMIT = 10      # candidates shown when neither --limit nor limit= says

_INVENTORY_FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size",
                     "allocation_ratio")


def providers_rows(placement, glob: str | None = None) -> list[dict]:
    """``[{uuid, name, parent, generation, inventories, usages, traits, aggregates}]``."""
    return [{"uuid": p["uuid"], "name": p["name"], "parent": p["parent"],
             "generation": p["generation"],
             "inventories": {rc: {k: inv[k] for k in _INVENTORY_FIELDS}
                             for rc, inv in sorted(p["inventories"].items())},
             "usages": {rc: p["usages"].get(rc, 0) for rc in sorted(p["inventories"])},
             "traits": sorted(p["traits"]), "aggregates": sorted(p["aggregates"])}
            for p in placement.providers(glob)]


def allocations_rows(placement, consumer: str | None = None) -> list[dict]:
    """``[{consumer, allocations}]``: one consumer, or all; [] when it holds
    nothing.  A consumer that is not a uuid raises ``PlacementError``."""
    if consumer:
        docs = [placement.allocations(check_uuid(consumer, "consumer"))]
    else:
        docs = placement.all_allocations()
    return [{"consumer": d["consumer"], "allocations": d["allocations"]}
            for d in docs if d["allocations"]]


def candidates_query(spec: str, required: str | None = None,
                     limit: int | None = None) -> Query:
    """The whole query language (``VCPU:1`` or ``resources=...&resources1=...
    &member_of=...&in_tree=...``), checked without any store: ``PlacementError``
    on bad input.  ``--limit`` wins over ``limit=``; neither -> DEFAULT_LIMIT."""
    query = parse_query(spec, required or None, limit)
    if query.limit is None:
        query.limit = DEFAULT_LIMIT
    return query


def candidates_rows(placement, spec, required: str | None = None,
                    limit: int | None = None) -> list[dict]:
    """``[{allocations, host}]``, best first; ``spec`` is text or a parsed Query."""
    query = spec if isinstance(spec, Query) else candidates_query(spec, required, limit)
    return [{"allocations": c["allocations"], "host": c["host"]}
            for c in placement.candidates(query)]
