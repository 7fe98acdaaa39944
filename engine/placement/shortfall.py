"""Why a query found no candidate, in words a refusal can give its user.

Placement answers "no candidate" and nothing more.  :func:`explain` reads
the same provider documents again and says what stopped the hosts a claim
could use:

- hosts shut to new claims: drained (trait ``COMPUTE_STATUS_DISABLED``,
  reserved = total) or holding a trait the query forbids (a lease's
  ``CUSTOM_RESERVED``), each named, with those the claim leaves out and
  those whose peer is down: ``host2 drained, host3 reserved by lease
  maint, host4 tried``;
- none of the others holding the required traits;
- else the resource class no single open host has enough of free, with the
  most any has: ``short of VCPU (most free on one host: 4 of 64)``.

A host is the root of a provider tree; what it has free of a class is the
sum over its tree and the sharing providers its aggregates reach.

Promises:
- it reads only the documents and names it is given, so the same providers
  give the same words (a refusal is logged with the automation that met it);
- a document missing a field counts as nothing free, never an error: it
  speaks only once a claim has already failed;
- a long list of hosts is cut after :data:`NAMED` names ("and 7 more").
"""
from __future__ import annotations

import fnmatch

from engine.natural import natural_key
from engine.placement.model import DISABLED_TRAIT, SHARING_TRAIT, capacity
from engine.placement.query import Query
from engine.placement.traits import in_words, list_in_words

__all__ = ["explain", "NAMED"]

NAMED = 6       # hosts named in one refusal; the rest are counted


def explain(providers: list[dict], query: Query, *, pattern: str = "*",
            skip: dict[str, str] | None = None, held_by: dict[str, str] | None = None,
            down: set[str] = frozenset()) -> str:
    """Why ``query`` has no candidate on the hosts whose name matches
    ``pattern``.

    ``skip``: host -> why the claim leaves it out (``"tried"``; an empty
    word when the caller's own words name it already);
    ``held_by``: host -> who shuts it, used when a forbidden trait does
    (``"reserved by lease maint"``); ``down``: hosts whose peer is gone
    (named; placement does not know)."""
    skip, held_by = skip or {}, held_by or {}
    trees: dict[str, list[dict]] = {}
    for p in providers:
        trees.setdefault(p.get("root") or p.get("uuid"), []).append(p)
    hosts = {p["name"]: p for p in providers
             if isinstance(p.get("name"), str) and p.get("uuid") == p.get("root")
             and SHARING_TRAIT not in _traits(p) and fnmatch.fnmatchcase(p["name"], pattern)}
    if not hosts:
        return "no host matches" if pattern != "*" else "no host has resources in placement"
    required = [any_of for g in query.groups for any_of in g.required] + \
        [{t} for t in query.root_required]
    forbidden = set(query.root_forbidden).union(*(g.forbidden for g in query.groups))
    names = sorted(hosts, key=natural_key)
    notes: dict[str, list[str]] = {name: [] for name in names}
    shut, lacking, open_ = False, [], []
    for name in names:
        root = hosts[name]
        traits = set().union(*map(_traits, trees.get(root["uuid"], [root])))
        if DISABLED_TRAIT in _traits(root):
            notes[name].append("drained")
        elif traits & forbidden:
            notes[name].append(held_by.get(name)
                               or f"has {list_in_words(sorted(traits & forbidden))}")
        elif name not in skip:
            (open_ if all(any_of & traits for any_of in required) else lacking).append(name)
        shut = shut or bool(notes[name])
        if skip.get(name):
            notes[name].append(skip[name])
        if name in down and "down" not in notes[name]:
            notes[name].append("down")
    said = _hosts([f"{name} {' and '.join(notes[name])}" for name in names if notes[name]])
    if open_:
        why = _short(query, [_free(trees.get(hosts[name]["uuid"], [hosts[name]]), providers)
                             for name in open_])
    elif lacking:
        wanted = sorted(" or ".join(sorted(map(in_words, any_of))) for any_of in required)
        why = f"no {'open ' if shut else ''}host has {', '.join(wanted)}"
    else:
        why = "no host takes new VMs" if shut else "no host is left to try"
    return f"{why} ({said})" if said else why


def _short(query: Query, free: list[dict]) -> str:
    """The classes asked for that no single host has enough of."""
    wanted: dict[str, int] = {}
    for group in query.groups:
        for rc, n in group.resources.items():
            wanted[rc] = wanted.get(rc, 0) + n
    short = [f"{rc} (most free on one host: {most} of {n})" for rc, n in wanted.items()
             if (most := max(f.get(rc, 0) for f in free)) < n]
    if short:
        return "short of " + ", of ".join(short)
    return "no one host has all of it free at once"


def _free(tree: list[dict], providers: list[dict]) -> dict[str, int]:
    """What a host has free per class: its tree's providers and the sharing
    providers of other trees in one of its aggregates."""
    aggregates = set().union(*(set(p.get("aggregates") or ()) for p in tree))
    roots = {p.get("root") for p in tree}
    shared = [p for p in providers if SHARING_TRAIT in _traits(p) and p.get("root") not in roots
              and aggregates & set(p.get("aggregates") or ())]
    free: dict[str, int] = {}
    for p in tree + shared:
        usages = p.get("usages") or {}
        for rc, inventory in (p.get("inventories") or {}).items():
            try:
                left = capacity(inventory) - usages.get(rc, 0)
            except (KeyError, TypeError):
                continue
            free[rc] = free.get(rc, 0) + max(0, int(left))
    return free


def _traits(provider: dict) -> set:
    return set(provider.get("traits") or ())


def _hosts(named: list[str]) -> str:
    if len(named) <= NAMED:
        return ", ".join(named)
    return ", ".join(named[:NAMED]) + f" and {len(named) - NAMED} more"
