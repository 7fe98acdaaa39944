"""Placement requests, so that automations can claim and release resources.

- ``claim``: ``{consumer, resources | allocations, required?, hosts?, project?,
  user?, consumer_type?}`` -> ``{consumer, host, allocations}``.  With
  ``resources`` (``"VCPU:1,MEMORY_MB:256"`` or a mapping) it takes the best
  candidate whose host matches the ``hosts`` glob, alternates on
  capacity_exceeded; hosts named in ``exclude`` are skipped (alternates
  after a failed build); ``prefer`` (a plan's host) is tried first.
  Idempotent: a consumer that already holds what was asked for gets its
  allocations back unchanged.
- ``release``: ``{consumer}`` -> ``{consumer, released: true}`` (also when it
  held nothing).
- ``candidates``: ``{resources, required?, limit?}`` -> ``{candidates: [...]}``.
- ``claim_move``, ``confirm_move``, ``revert_move``: a VM move's migration
  allocations (see each).

A VM in a group (``claim``'s ``group: {name, rule}``; for a move, the group
``groupof/<uuid>`` names) is placed only where the group's rule allows, and
recorded there in the same guarded step (:func:`engine.placement.groups.place`); a
rule that leaves no host is refused in one line naming the group.

The backend is ``open_placement(None, host.store)``: etcd unless
``$PEERCTL_PLACEMENT`` names an OpenStack Placement URL.
"""
from __future__ import annotations

import fnmatch

from engine.placement import groups
from engine.core import keys
from engine.core.handlers import handler
from engine.core.hosts import live_host_names
from engine.core.values import readable
from engine.placement.drains import drained_hosts
from engine.errors import Conflict, NotFound, RequestError, UsageError
from engine.leases.events import unreserved
from engine.placement import for_request, parse_query, together
from engine.placement.shortfall import explain
from engine.placement.traits import list_in_words


def _spec(args: dict) -> str:
    query = together.query_of(args)
    if query is None:
        raise RequestError("claim needs resources (e.g. VCPU:1,MEMORY_MB:256) or allocations")
    return query


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
    owner = together.owner_of(args)
    with _placement(host) as placement:
        if args.get("allocations"):
            doc = placement.claim(consumer, args["allocations"], **owner)
            return {"consumer": doc["consumer"], "allocations": doc["allocations"],
                    "host": _host_of(placement, doc["allocations"])}
        query = _spec(args)
        excluded = set(args.get("exclude") or ())
        # A host a lease holds is no candidate unless the traits ask for the lease.
        required = unreserved(host.store, args.get("required"))
        if args.get("group"):
            return _claim_in_group(host, placement, args, query, required, excluded, owner)
        if placement.backend == "etcd":
            # Most claims are a VM's first, its consumer holding nothing: as
            # new, with the claims other threads of this peer make now, in
            # one transaction (engine/placement/together.py).  None: the
            # batch could not (the consumer holds something, nothing fits):
            # then alone, as follows.
            done = together.claim_new(host.store, together.NewClaim.of_request(args, query,
                                                                              required))
            if done is not None:
                return done
        held = placement.allocations(consumer)
        wanted = _wanted(query, args.get("required"))
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


def _wanted(query: str, required) -> dict:
    """What a query asks for in all, by resource class."""
    wanted: dict[str, int] = {}
    for group in parse_query(query, required).groups:
        for rc, n in group.resources.items():
            wanted[rc] = wanted.get(rc, 0) + n
    return wanted


def _group_arg(args: dict) -> tuple[str, str | None]:
    group = args.get("group")
    if not isinstance(group, dict) or not isinstance(group.get("name"), str):
        raise RequestError(f"group must be {{name, rule}}, got {group!r}")
    try:
        return groups.check_name(group["name"]), (groups.check_rule(group["rule"])
                                                  if group.get("rule") else None)
    except UsageError as exc:
        raise RequestError(str(exc)) from None


def _usable(store):
    """Can a host take a VM now: alive, not drained, not held by a lease
    (a together group whose hosts cannot is free to go elsewhere)."""
    live, drained = live_host_names(store), drained_hosts(store)
    held = {keys.suffix(kv.key, keys.reserved())
            for kv in store.range(keys.reserved(), keys_only=True)[0]}
    return lambda name: name in live and name not in drained and name not in held


def _ruled_out(rule: str, taken: dict, allowed, providers) -> dict:
    """Host -> why the group's rule leaves it out, for the refusal."""
    if rule == "spread":
        return {host: f"has {name}" for host, name in taken.items()}
    return {p["name"]: "" for p in providers if not allowed(p["name"])}


def _group_refusal(name: str, rule: str, taken: dict, query: str) -> str:
    if rule == "spread":
        return f"group {name!r} (spread) leaves no host that can fit {query}"
    where = ", ".join(sorted(set(taken))) or "nowhere"
    return f"group {name!r} (together: its VMs are on {where}) leaves no host that can fit {query}"


def _claim_in_group(host, placement, args: dict, query: str, required, excluded: set,
                    owner: dict) -> dict:
    """``claim`` of a VM in a group: the best candidate the rule allows,
    claimed, then the VM recorded as the group's member there."""
    consumer = args.get("consumer")
    name, rule = _group_arg(args)
    wanted = _wanted(query, args.get("required"))

    def choose(allowed, taken, rule_now):
        held = placement.allocations(consumer)["allocations"]
        if held and _totals(held) == wanted:
            where = _host_of(placement, held)
            if where and allowed(where):
                return where, {"consumer": consumer, "allocations": held, "host": where}

        def claimed(candidate):
            doc = placement.claim(consumer, candidate["allocations"], **owner)
            return {"consumer": consumer, "allocations": doc["allocations"],
                    "host": candidate["host"]}
        done = _first_fit(
            placement, query, required, args,
            lambda host_name: host_name not in excluded and allowed(host_name), claimed,
            _group_refusal(name, rule_now, taken, query), f"claim for {consumer}",
            lambda: _why_none(host.store, placement, query, required, args, {
                **_ruled_out(rule_now, taken, allowed, placement.providers()),
                **dict.fromkeys(excluded, "tried")}), plain=True)
        return done["host"], done
    return groups.place(host.store, name, rule, consumer, args.get("name") or consumer, choose,
                        usable=_usable(host.store))


def _first_fit(placement, query: str, required, args: dict, allowed, write, none: str,
               what: str, why, plain: bool = False):
    """``write(candidate)`` for the best candidate (``required`` traits)
    whose host matches ``args['hosts']`` and ``allowed(host)`` (``prefer``
    first); the next one when it no longer fits, the candidates read again
    after a lost race.  None fits: a refusal, ``none`` with the traits the
    caller asked for (``plain``: without them) and ``why()``."""
    for _ in range(placement.retries):
        candidates = [c for c in placement.candidates(query, required=required)
                      if fnmatch.fnmatchcase(c["host"], args.get("hosts") or "*")
                      and allowed(c["host"])]
        if args.get("prefer"):      # the planned host first (a plan's pin)
            candidates.sort(key=lambda c: c["host"] != args["prefer"])
        if not candidates:
            asked = None if plain else args.get("required")
            raise RequestError(none + (f" with {list_in_words(asked)}" if asked else "")
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
        group = groups.group_of(host.store, instance) if isinstance(instance, str) else None
        if group is None:
            return _move_claim(host, placement, args, lambda name: True)
        name = args.get("name") or instance

        def choose(allowed, taken, rule):
            if placement.allocations(migration)["allocations"]:
                now = placement.allocations(instance)["allocations"]
                where = _host_of(placement, now)
                if allowed(where):
                    return where, {"host": where, "allocations": now}
                placement.revert_migration(instance, migration)    # a race lost: again
            done = _move_claim(host, placement, args, allowed, (rule, taken))
            return done["host"], done
        # An HA restart (``live_only``) that can only break the rule comes
        # back anyway, its member marked ``violated`` (docs/placement.md).
        return groups.place(host.store, group, None, instance, name, choose,
                            usable=_usable(host.store),
                            leaving=source, may_break=bool(args.get("live_only")))


def _move_claim(host, placement, args: dict, allowed, ruled: tuple | None = None) -> dict:
    """``claim_move``'s pick and write, the destination also passing
    ``allowed`` (a group's rule: ``ruled`` is its ``(rule, taken)``, for the
    refusal's words)."""
    instance, migration, source = args.get("uuid"), args.get("consumer"), args.get("source")
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
    skip = dict.fromkeys(excluded, "")
    none = (f"no {'live ' if live is not None else ''}host but "
            f"{', '.join(sorted(excluded))} can fit {query}")
    if ruled is not None:
        rule, taken = ruled
        group = groups.group_of(host.store, instance)
        skip.update(_ruled_out(rule, taken, allowed, placement.providers()))
        none = _group_refusal(group, rule, taken, query)
    return _first_fit(placement, query, required, args,
                      lambda name: name not in excluded and (live is None or name in live)
                      and allowed(name),
                      moved, none, f"moving {instance}",
                      lambda: _why_none(host.store, placement, query, required, args, skip,
                                        live_only=live is not None), plain=ruled is not None)


@handler("confirm_move")
def confirm_move(host, args: dict) -> dict:
    """``{consumer}``: the move is done; the source's allocations, held by the
    migration consumer, are dropped.  Idempotent."""
    with _placement(host) as placement:
        placement.release(args.get("consumer"))
        if isinstance(args.get("uuid"), str):
            groups.settle(host.store, args["uuid"])
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
        back = _host_of(placement, doc["allocations"])
        if back:
            groups.settle(host.store, args["uuid"], back)
        return {"uuid": args.get("uuid"), "reverted": True, "host": back}
