"""Allocation candidates computed in memory from one read of every provider.

Semantics follow OpenStack Placement (microversion 1.39):

- the unnumbered group may spread its resource classes over the providers of
  one tree plus the sharing providers (trait MISC_SHARES_VIA_AGGREGATE)
  anchored to that tree by a common aggregate; its required traits must be
  held collectively by the providers it uses, its forbidden traits by none;
- a numbered group (``resources1=...``) is satisfied by a single provider of
  the tree or a sharing provider; ``group_policy=isolate`` keeps numbered
  groups on different providers;
- ``member_of``/``in_tree`` filter the providers a group may use,
  ``root_required`` filters on the traits of the tree's root.

Candidates are ordered by :func:`weigh`: least loaded first.

Who is in which tree changes rarely, usages at every claim: :func:`layout_of`
computes the first once (a :class:`Layout`), and a caller that keeps it
(the provider view does, until a provider comes, goes or moves) hands it to
every query on the same providers, with a memo of the weights of trees of
one provider: a query weighs again only the providers that changed, and
ranks them again only when a document changed.
"""
from __future__ import annotations

import heapq
import itertools
import random
from collections import defaultdict
from dataclasses import dataclass

from engine.placement.model import SHARING_TRAIT, capacity
from engine.placement.query import Query, RequestGroup

__all__ = ["find_candidates", "weigh", "order", "Layout", "layout_of"]

_MAX_PER_TREE = 64      # bound the combinations one tree may contribute


def _fits(provider: dict, rc: str, amount: int) -> bool:
    inv = provider["inventories"].get(rc)
    if inv is None:
        return False
    if amount < inv["min_unit"] or amount > inv["max_unit"] or amount % inv["step_size"]:
        return False
    return provider["usages"].get(rc, 0) + amount <= capacity(inv)


def _group_allows(provider: dict, group: RequestGroup, tree_of: dict) -> bool:
    if group.forbidden and group.forbidden & set(provider["traits"]):
        return False
    if group.in_tree and provider["root"] != tree_of.get(group.in_tree):
        return False
    aggs = set(provider["aggregates"])
    for wanted, negated in group.member_of:
        if bool(wanted & aggs) == negated:
            return False
    return True


def _traits_hold(required: list, traits: set) -> bool:
    return all(any_of & traits for any_of in required)


def _unnumbered_options(group, pool, tree_of):
    if len(pool) == 1:      # the common case: a host without children or sharing
        p = pool[0]
        if (all(_fits(p, rc, n) for rc, n in group.resources.items())
                and _group_allows(p, group, tree_of)
                and _traits_hold(group.required, set(p["traits"]))):
            return [{p["uuid"]: dict(group.resources)}]
        return []
    per_rc = []
    for rc, amount in group.resources.items():
        options = [p for p in pool if _fits(p, rc, amount) and _group_allows(p, group, tree_of)]
        if not options:
            return []
        per_rc.append([(p, rc, amount) for p in options])
    result = []
    for combo in itertools.islice(itertools.product(*per_rc), _MAX_PER_TREE * 4):
        used = {p["uuid"]: p for p, _, _ in combo}
        traits = set().union(*(set(p["traits"]) for p in used.values()))
        if not _traits_hold(group.required, traits):
            continue
        allocs = defaultdict(dict)
        for p, rc, amount in combo:
            allocs[p["uuid"]][rc] = amount
        result.append(dict(allocs))
    return result


def _numbered_options(group, pool, tree_of):
    return [{p["uuid"]: dict(group.resources)} for p in pool
            if all(_fits(p, rc, n) for rc, n in group.resources.items())
            and _group_allows(p, group, tree_of)
            and _traits_hold(group.required, set(p["traits"]))]


@dataclass(frozen=True)
class Layout:
    """What candidates need of the providers but their inventories and
    usages (by uuid, so that it holds for any documents of the same
    providers): each provider's root, the trees, and the sharing providers
    each tree reaches."""
    tree_of: dict           # provider -> its root
    lone: tuple             # roots of trees of one provider that reach no sharing provider
    trees: dict             # every other root -> the providers of its tree
    anchored: dict          # root -> the sharing providers of other trees it reaches


def layout_of(providers: dict) -> Layout:
    """The :class:`Layout` of ``providers`` (uuid -> document)."""
    trees = defaultdict(list)
    roots_in_agg = defaultdict(set)
    for uuid, p in providers.items():
        trees[p["root"]].append(uuid)
        for agg in p["aggregates"]:
            roots_in_agg[agg].add(p["root"])
    anchored = defaultdict(list)
    for uuid, p in providers.items():
        if SHARING_TRAIT in p["traits"] and p["aggregates"]:
            for root in set().union(*(roots_in_agg[a] for a in p["aggregates"])):
                if root != p["root"]:
                    anchored[root].append(uuid)
    lone = tuple(root for root, members in trees.items()
                 if len(members) == 1 and root not in anchored)
    return Layout({u: p["root"] for u, p in providers.items()}, lone,
                  {root: members for root, members in trees.items()
                   if len(members) > 1 or root in anchored}, dict(anchored))


def find_candidates(providers: dict, query: Query, limit: int | None = None,
                    layout: Layout | None = None, memo: dict | None = None) -> list[dict]:
    """``providers``: uuid -> provider document with ``usages``; unordered
    result.  With ``limit``, trees of one provider beyond the ``limit`` best
    of them (ties picked at random) are left out: :func:`order` would drop
    them.  ``layout``: :func:`layout_of` these providers (or of documents
    of the same providers that differ in usages only), computed if not given.
    ``memo``: kept by the caller for this query (its limit aside) and this
    layout; a tree of one provider whose document is the very object of the
    last call is not weighed again, and ``providers`` that are the very
    object of the last call are not ranked again (only the ties drawn)."""
    layout = layout_of(providers) if layout is None else layout
    tree_of = layout.tree_of
    single = query.groups[0] if len(query.groups) == 1 and not query.groups[0].suffix else None
    results, seen = [], set()
    if single is not None:
        if memo is None:
            ranked = _rank_lone(providers, query, single, layout, {})
        else:
            kept = memo.get(_RANKED)
            if kept is None or kept[0] is not providers:
                kept = memo[_RANKED] = (providers, _rank_lone(providers, query, single, layout,
                                                              memo))
            ranked = kept[1]
        for weight, uuid in _best(ranked, limit):
            doc = providers[uuid]
            results.append({"allocations": {uuid: dict(single.resources)}, "host": doc["name"],
                            "root": uuid, "mappings": {"": [uuid]}, "weight": weight})
    else:
        for root in layout.lone:
            root_doc = providers[root]
            if not _root_refused(query, root_doc):
                _tree_candidates(providers, query, root_doc, [root_doc], [root_doc], tree_of,
                                 results, seen)
    for root, members in layout.trees.items():
        root_doc = providers[root]
        if _root_refused(query, root_doc):
            continue
        local = [providers[u] for u in members]
        _tree_candidates(providers, query, root_doc, local,
                         local + [providers[u] for u in layout.anchored.get(root, ())],
                         tree_of, results, seen)
    return results


_RANKED = object()      # the memo's key of the ranking made of one version of the documents


def _rank_lone(providers, query, single, layout, memo) -> list:
    """The trees of one provider that fit ``single`` (the query's one
    group), grouped by weight, heaviest first: ``[(weight, roots)]``, each
    ``roots`` a dict used as an ordered set.  With what ``memo`` kept of the
    last call, only the providers whose document is not the very object
    weighed then are weighed again, and only the groups they leave or join
    are copied: a claim changes one document, and the next query of a
    hundred hosts weighs one, not a hundred.  What is kept is never changed
    in place (threads share the memo): each call keeps new dicts."""
    tree_of, lone = layout.tree_of, layout.lone
    kept = memo.get(_LONE)
    if kept is None:
        weight_of, groups = {}, {}
        for root in lone:
            weight = _lone_root_weight(providers[root], query, single, tree_of)
            weight_of[root] = weight
            if weight is not None:
                groups.setdefault(weight, {})[root] = None
    else:
        last, weight_of, groups = kept
        changed = [root for root in lone if providers[root] is not last[root]]
        if changed:
            weight_of, leaving, joining = dict(weight_of), {}, {}
            for root in changed:
                old = weight_of[root]
                new = weight_of[root] = _lone_root_weight(providers[root], query, single,
                                                          tree_of)
                if old != new:
                    if old is not None:
                        leaving.setdefault(old, []).append(root)
                    if new is not None:
                        joining.setdefault(new, []).append(root)
            groups = dict(groups)
            for weight in leaving.keys() | joining.keys():
                group = dict(groups.get(weight, ()))
                for root in leaving.get(weight, ()):
                    del group[root]
                group.update(dict.fromkeys(joining.get(weight, ())))
                if group:
                    groups[weight] = group
                else:
                    groups.pop(weight, None)
    memo[_LONE] = (providers, weight_of, groups)
    return sorted(groups.items(), reverse=True)


_LONE = object()        # the memo's key of the last call's weights and groups


def _lone_root_weight(root_doc, query, single, tree_of) -> float | None:
    if _root_refused(query, root_doc):
        return None
    return _lone_weight(root_doc, single, tree_of)


def _best(ranked: list, limit: int | None):
    """``(weight, uuid)`` of the ``limit`` heaviest of ``ranked``; those
    tied at the lightest weight kept are drawn at random."""
    taken = 0
    for weight, roots in ranked:
        if limit and taken + len(roots) > limit:
            roots = random.sample(list(roots), limit - taken)
        for root in roots:
            yield weight, root
        taken += len(roots)
        if limit and taken >= limit:
            return


def _root_refused(query: Query, root_doc: dict) -> bool:
    if query.root_required and not query.root_required <= set(root_doc["traits"]):
        return True
    return bool(query.root_forbidden) and bool(query.root_forbidden & set(root_doc["traits"]))


def _tree_candidates(providers, query, root_doc, local, pool, tree_of, results, seen) -> None:
    """The general path: the candidates of one tree (``local``, its
    providers; ``pool``, those plus the sharing providers it reaches),
    appended to ``results``."""
    root = root_doc["uuid"]
    needed = query.resource_classes
    # cheap rejection: the pool must at least have every class asked for
    if len(pool) == 1:
        if not needed <= pool[0]["inventories"].keys():
            return
    elif not needed <= {rc for p in pool for rc in p["inventories"]}:
        return
    per_group = []
    for group in query.groups:
        options = (_unnumbered_options(group, pool, tree_of) if group.suffix == ""
                   else _numbered_options(group, pool, tree_of))
        if not options:
            return
        per_group.append(options)
    local_ids = {p["uuid"] for p in local}
    count = 0
    for combo in itertools.product(*per_group):
        if query.group_policy == "isolate":
            numbered = [next(iter(c)) for g, c in zip(query.groups, combo) if g.suffix]
            if len(numbered) != len(set(numbered)):
                continue
        if len(combo) == 1:
            allocations = combo[0]      # fits, checked per provider already
        else:
            merged = defaultdict(lambda: defaultdict(int))
            for part in combo:
                for rp, resources in part.items():
                    for rc, n in resources.items():
                        merged[rp][rc] += n
            if any(not _fits(providers[rp], rc, n) for rp, res in merged.items()
                   for rc, n in res.items()):
                continue    # two groups on one provider: must fit together
            allocations = {rp: dict(res) for rp, res in merged.items()}
        if local_ids.isdisjoint(allocations):
            continue        # only sharing providers: found under their own tree
        key = tuple(sorted((rp, tuple(sorted(r.items()))) for rp, r in allocations.items()))
        if key in seen:
            continue
        seen.add(key)
        mappings = {}
        for g, part in zip(query.groups, combo):
            mappings[g.suffix] = sorted(part)
        results.append({"allocations": allocations, "host": root_doc["name"],
                        "root": root, "mappings": mappings,
                        "weight": _weight(providers, allocations)})
        count += 1
        if count >= _MAX_PER_TREE:
            break


def _lone_weight(p: dict, group: RequestGroup, tree_of: dict) -> float | None:
    """The weight of the candidate of a tree of one provider without sharing
    providers, for a query of one unnumbered group (None: it does not fit):
    what the general path finds, with fits and weight in one pass."""
    inventories, usages = p["inventories"], p["usages"]
    free = 0.0
    for rc, amount in group.resources.items():
        inv = inventories.get(rc)
        if (inv is None or amount < inv["min_unit"] or amount > inv["max_unit"]
                or amount % inv["step_size"]):
            return None
        cap = capacity(inv)
        used = usages.get(rc, 0)
        if used + amount > cap:
            return None
        free += (cap - used - amount) / cap if cap else 0.0
    if (group.required or group.forbidden or group.in_tree or group.member_of) and not (
            _group_allows(p, group, tree_of) and _traits_hold(group.required, set(p["traits"]))):
        return None
    return round(free / len(group.resources), 6) if group.resources else 0.0


def _weight(providers: dict, allocations: dict) -> float:
    total, count = 0.0, 0
    for rp, resources in allocations.items():
        doc = providers[rp]
        for rc, amount in resources.items():
            cap = capacity(doc["inventories"][rc])
            total += (cap - doc["usages"].get(rc, 0) - amount) / cap if cap else 0.0
            count += 1
    return round(total / count, 6) if count else 0.0


def weigh(allocations: dict, capacity_used) -> float:
    """Least loaded first: the mean free fraction left after this allocation.

    ``capacity_used(rp, rc) -> (capacity, used)``.
    """
    fractions = []
    for rp, resources in allocations.items():
        for rc, amount in resources.items():
            cap, used = capacity_used(rp, rc)
            fractions.append((cap - used - amount) / cap if cap else 0.0)
    return sum(fractions) / len(fractions) if fractions else 0.0


def order(candidates: list[dict], capacity_used=None, limit: int | None = None) -> list[dict]:
    """Best first.  Ties are broken at random, like Placement's
    randomize_allocation_candidates: concurrent claimers then spread over
    equally loaded hosts instead of all racing for the same one.  Weights
    missing are computed with ``capacity_used``."""
    for c in candidates:
        if "weight" not in c:
            c["weight"] = round(weigh(c["allocations"], capacity_used), 6)
    keyed = [(-c["weight"], random.random(), i) for i, c in enumerate(candidates)]
    best = heapq.nsmallest(limit, keyed) if limit and limit < len(keyed) else sorted(keyed)
    return [candidates[i] for _, _, i in best]
