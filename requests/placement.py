"""Placement requests, so that automations can claim and release resources.

- ``claim``: ``{consumer, resources | allocations, required?, hosts?, project?,
  user?, consumer_type?}`` -> ``{consumer, host, allocations}``.  With
  ``resources`` (``"VCPU:1,MEMORY_MB:256"`` or a mapping) it takes the best
  candidate whose host matches the ``hosts`` glob, alternates on
  capacity_exceeded; hosts named in ``exclude`` are skipped (alternates
  after a failed build).  Idempotent: a consumer that already holds what was asked
  for gets its allocations back unchanged.
- ``release``: ``{consumer}`` -> ``{consumer, released: true}`` (also when it
  held nothing).
- ``candidates``: ``{resources, required?, limit?}`` -> ``{candidates: [...]}``.

The backend is ``open_placement(None, host.store)``: etcd unless
``$PEERCTL_PLACEMENT`` names an OpenStack Placement URL.
"""
from __future__ import annotations

import contextlib
import fnmatch

from engine.core.handlers import handler
from engine.errors import Conflict, PlacementError, PlacementUnavailable, RequestError
from engine.placement import open_placement, parse_query


def _spec(args: dict) -> str:
    resources = args.get("resources")
    if isinstance(resources, dict):
        return ",".join(f"{rc}:{n}" for rc, n in resources.items())
    if not isinstance(resources, str) or not resources:
        raise RequestError("claim needs resources (e.g. VCPU:1,MEMORY_MB:256) or allocations")
    return resources


def _totals(allocations: dict) -> dict:
    totals: dict[str, int] = {}
    for resources in allocations.values():
        for rc, n in resources.items():
            totals[rc] = totals.get(rc, 0) + n
    return totals


def _host_of(placement, allocations: dict) -> str | None:
    roots = set()
    for rp in allocations:
        doc = placement.provider(rp)
        if "MISC_SHARES_VIA_AGGREGATE" not in doc["traits"]:
            roots.add(doc["root"])
    return placement.provider(roots.pop())["name"] if len(roots) == 1 else None


@contextlib.contextmanager
def _placement(host):
    """The cluster's placement, its refusals turned into the request's error."""
    placement = open_placement(None, host.store)
    try:
        yield placement
    except (PlacementError, PlacementUnavailable, Conflict) as exc:
        raise RequestError(str(exc)) from None
    finally:
        placement.close()


@handler("claim")
def claim(host, args: dict) -> dict:
    consumer = args.get("consumer")
    owner = {"project": args.get("project") or "peerctl", "user": args.get("user") or "peerctl",
             "consumer_type": args.get("consumer_type") or "INSTANCE"}
    with _placement(host) as placement:
        if args.get("allocations"):
            doc = placement.claim(consumer, args["allocations"], **owner)
            return {"consumer": doc["consumer"], "allocations": doc["allocations"],
                    "host": _host_of(placement, doc["allocations"])}
        query = _spec(args)
        held = placement.allocations(consumer)
        wanted = {}
        for group in parse_query(query, args.get("required")).groups:
            for rc, n in group.resources.items():
                wanted[rc] = wanted.get(rc, 0) + n
        if held["allocations"] and _totals(held["allocations"]) == wanted:
            return {"consumer": consumer, "allocations": held["allocations"],
                    "host": _host_of(placement, held["allocations"])}
        for _ in range(placement.retries):
            excluded = set(args.get("exclude") or ())
            candidates = [c for c in placement.candidates(query, required=args.get("required"))
                          if fnmatch.fnmatchcase(c["host"], args.get("hosts") or "*")
                          and c["host"] not in excluded]
            if not candidates:
                raise RequestError(f"no host can fit {query}"
                                   + (f" with {args['required']}" if args.get("required") else ""))
            for candidate in candidates:
                try:
                    doc = placement.claim(consumer, candidate["allocations"], **owner)
                    return {"consumer": consumer, "allocations": doc["allocations"],
                            "host": candidate["host"]}
                except Conflict as exc:
                    if exc.reason != "capacity_exceeded":
                        break       # re-read the candidates
        raise RequestError(f"claim for {consumer} kept losing races")


@handler("release")
def release(host, args: dict) -> dict:
    with _placement(host) as placement:
        placement.release(args.get("consumer"))
        return {"consumer": args.get("consumer"), "released": True}


@handler("candidates")
def candidates(host, args: dict) -> dict:
    with _placement(host) as placement:
        found = placement.candidates(_spec(args), required=args.get("required"),
                                     limit=args.get("limit"))
        return {"candidates": [{"allocations": c["allocations"], "host": c["host"]}
                               for c in found]}
