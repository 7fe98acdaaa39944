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
- ``claim_move``, ``confirm_move``, ``revert_move``: a VM move's migration
  allocations (see each).

The backend is ``open_placement(None, host.store)``: etcd unless
``$PEERCTL_PLACEMENT`` names an OpenStack Placement URL.
"""
from __future__ import annotations

import fnmatch

from engine.core import keys
from engine.core.handlers import handler
from engine.core.hosts import live_host_names
from engine.core.values import readable
from engine.errors import Conflict, NotFound, RequestError
from engine.leases.events import unreserved
from engine.placement import for_request, parse_query, together
from engine.placement.shortfall import explain


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


def _placement(host):
    """The cluster's placement, its refusals turned into the request's error."""
    return for_request(host.store)


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
        excluded = set(args.get("exclude") or ())
        # A host a lease holds is no candidate unless the traits ask for the lease.
        required = unreserved(host.store, args.get("required"))
        if placement.backend == "etcd":
            # Most claims are a VM's first, its consumer holding nothing: as
            # new, with the claims other threads of this peer make now, in
            # one transaction (engine/placement/together.py).  None: the
            # batch could not (the consumer holds something, nothing fits):
            # then alone, as follows.
            pattern = args.get("hosts") or "*"
            done = together.claim_new(host.store, together.NewClaim(
                consumer, query, required,
                lambda name: name not in excluded and fnmatch.fnmatchcase(name, pattern), owner))
            if done is not None:
                return done
        held = placement.allocations(consumer)
        wanted = {}
        for group in parse_query(query, args.get("required")).groups:
            for rc, n in group.resources.items():
                wanted[rc] = wanted.get(rc, 0) + n
        if held["allocations"] and _totals(held["allocations"]) == wanted:
            return {"consumer": consumer, "allocations": held["allocations"],
                    "host": _host_of(placement, held["allocations"])}

        def claimed(candidate):
            doc = placement.claim(consumer, candidate["allocations"], **owner)
            return {"consumer": consumer, "allocations": doc["allocations"],
                    "host": candidate["host"]}
        return _first_fit(placement, query, required, args, lambda host: host not in excluded,
                          claimed, f"no host can fit {query}", f"claim for {consumer}",
                          lambda: _why_none(host.store, placement, query, required, args,
                                            dict.fromkeys(excluded, "tried")))


def _first_fit(placement, query: str, required, args: dict, allowed, write, none: str,
               what: str, why):
    """``write(candidate)`` for the best candidate (``required`` traits)
    whose host matches ``args['hosts']`` and ``allowed(host)``; the next one
    when it no longer fits, the candidates read again after a lost race.
    None fits: a refusal, ``none`` with the traits the caller asked for and
    ``why()``."""
    for _ in range(placement.retries):
        candidates = [c for c in placement.candidates(query, required=required)
                      if fnmatch.fnmatchcase(c["host"], args.get("hosts") or "*")
                      and allowed(c["host"])]
        if not candidates:
            asked = args.get("required")
            raise RequestError(none + (f" with {asked}" if asked else "")
                               + (f" among {args['hosts']!r}" if args.get("hosts") else "")
                               + f": {why()}")
        for candidate in candidates:
            try:
                return write(candidate)
            except Conflict as exc:
                if exc.reason != "capacity_exceeded":
                    break       # re-read the candidates
    raise RequestError(f"{what} kept losing races")


def _why_none(store, placement, query: str, required, args: dict, skip: dict,
              live_only: bool = False) -> str:
    """Why no host fits (:func:`engine.placement.shortfall.explain`), from
    placement's providers, the leases holding reserved hosts and the hosts
    whose peer is down (left out too with ``live_only``), read now: the
    refusal is logged as the request's answer, so an automation replaying
    it meets the same words."""
    leases = [readable(kv) for kv in store.range(keys.reserved())[0]]
    held_by = {lease["host"]: f"reserved by lease {lease['lease']}"
               for lease in leases if isinstance(lease, dict) and lease.get("host")}
    alive = live_host_names(store)
    providers = placement.providers()
    down = {p["name"] for p in providers if p["name"] not in alive}
    if live_only:
        skip = {**dict.fromkeys(down, "down"), **skip}
    return explain(providers, parse_query(query, required), pattern=args.get("hosts") or "*",
                   skip=skip, held_by=held_by, down=down)


@handler("release")
def release(host, args: dict) -> dict:
    with _placement(host) as placement:
        # With the releases other threads of this peer make now, in one
        # transaction; alone if that could not be written.
        if not (placement.backend == "etcd" and isinstance(args.get("consumer"), str)
                and together.release(host.store, args["consumer"])):
            placement.release(args.get("consumer"))
        return {"consumer": args.get("consumer"), "released": True}


@handler("candidates")
def candidates(host, args: dict) -> dict:
    with _placement(host) as placement:
        found = placement.candidates(_spec(args), required=args.get("required"),
                                     limit=args.get("limit"))
        return {"candidates": [{"allocations": c["allocations"], "host": c["host"]}
                               for c in found]}


# -- moves: migration allocations ---------------------------------------------------

@handler("claim_move")
def claim_move(host, args: dict) -> dict:
    """``{uuid, consumer, source, hosts?, required?, exclude?, live_only?}``:
    pick a destination for instance ``uuid`` (same amounts as it holds,
    ``required`` traits, host name matching ``hosts``, never ``source``
    nor a host in ``exclude``; with ``live_only``, only hosts whose peer is
    alive now) and move its allocations there in one atomic write, the
    source's going to migration consumer ``consumer``
    (:meth:`~engine.placement.api.Placement.move_to_migration`).
    -> ``{host, allocations}``.  Idempotent: a move already made returns
    where it went."""
    instance, migration, source = args.get("uuid"), args.get("consumer"), args.get("source")
    with _placement(host) as placement:
        held = placement.allocations(migration)
        if held["allocations"]:
            now = placement.allocations(instance)["allocations"]
            return {"host": _host_of(placement, now), "allocations": now}
        current = placement.allocations(instance)["allocations"]
        if not current:
            raise RequestError(f"VM {instance} holds no allocations to move")
        query = ",".join(f"{rc}:{n}" for rc, n in sorted(_totals(current).items()))
        required = unreserved(host.store, args.get("required"))

        def moved(candidate):
            doc = placement.move_to_migration(instance, migration, candidate["allocations"])
            return {"host": candidate["host"], "allocations": doc["allocations"]}
        excluded = {source, *(args.get("exclude") or ())}
        live = live_host_names(host.store) if args.get("live_only") else None
        return _first_fit(placement, query, required, args,
                          lambda name: name not in excluded and (live is None or name in live),
                          moved, f"no {'live ' if live is not None else ''}host but "
                          f"{', '.join(sorted(excluded))} can fit {query}", f"moving {instance}",
                          lambda: _why_none(host.store, placement, query, required, args,
                                            dict.fromkeys(excluded, ""),
                                            live_only=live is not None))




@handler("confirm_move")
def confirm_move(host, args: dict) -> dict:
    """``{consumer}``: the move is done; the source's allocations, held by the
    migration consumer, are dropped.  Idempotent."""
    with _placement(host) as placement:
        placement.release(args.get("consumer"))
        return {"consumer": args.get("consumer"), "confirmed": True}


@handler("revert_move")
def revert_move(host, args: dict) -> dict:
    """``{uuid, consumer}``: the move is undone; the instance gets back what
    the migration consumer holds, and the destination's allocations are
    freed, in one write.  Idempotent: once reverted, nothing to do."""
    with _placement(host) as placement:
        try:
            doc = placement.revert_migration(args.get("uuid"), args.get("consumer"))
        except NotFound:
            return {"uuid": args.get("uuid"), "reverted": False}
        return {"uuid": args.get("uuid"), "reverted": True,
                "host": _host_of(placement, doc["allocations"])}
