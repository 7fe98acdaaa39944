"""Candidates computed in memory (``engine/placement/candidates.py``): the
``limit`` best hosts kept while scanning, ties drawn at random, and a
layout kept from other usages giving what a fresh one gives."""
from __future__ import annotations

import collections
import uuid as uuidlib

from engine.placement.candidates import find_candidates, layout_of, order
from engine.placement.model import SHARING_TRAIT
from engine.placement.query import parse_query

INVENTORY = {"total": 16, "reserved": 0, "allocation_ratio": 1.0, "min_unit": 1,
             "max_unit": 16, "step_size": 1}


def provider(name, vcpus_used=0, root=None, traits=(), aggregates=(), classes=("VCPU",)):
    uuid = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name))
    return {"uuid": uuid, "name": name, "root": root or uuid, "traits": list(traits),
            "aggregates": list(aggregates), "usages": {"VCPU": vcpus_used} if vcpus_used else {},
            "inventories": {rc: dict(INVENTORY) for rc in classes}}


def by_uuid(*docs):
    return {doc["uuid"]: doc for doc in docs}


def hosts(found):
    return sorted(c["host"] for c in found)


def test_a_limit_keeps_the_least_loaded_hosts():
    providers = by_uuid(*(provider(f"h{i:02}", vcpus_used=i % 15) for i in range(60)))
    query = parse_query("VCPU:1")
    everything = order(find_candidates(providers, query))
    kept = find_candidates(providers, query, limit=8)
    assert len(kept) == 8
    assert sorted(c["weight"] for c in kept) == sorted(c["weight"] for c in everything[:8])
    assert {c["weight"] for c in kept} == {15 / 16, 14 / 16}   # the emptiest: used 0 and 1


def test_ties_at_the_limit_are_drawn_at_random():
    providers = by_uuid(*(provider(f"h{i}") for i in range(10)), provider("busy", 8))
    query = parse_query("VCPU:1")
    seen = collections.Counter()
    for _ in range(300):
        kept = find_candidates(providers, query, limit=3)
        assert len(set(hosts(kept))) == 3 and "busy" not in hosts(kept)
        seen.update(hosts(kept))
    assert set(seen) == {f"h{i}" for i in range(10)}, seen       # every tied host drawn


def test_a_layout_kept_from_other_usages_finds_what_a_fresh_one_finds():
    aggregate = str(uuidlib.uuid4())
    parent = provider("parent", classes=("MEMORY_MB",), aggregates=[aggregate])
    child = provider("child", root=parent["uuid"])
    nas = provider("nas", traits=[SHARING_TRAIT], aggregates=[aggregate], classes=("DISK_GB",))
    lone = [provider(f"h{i}", classes=("VCPU", "MEMORY_MB", "DISK_GB")) for i in range(4)]
    before = by_uuid(parent, child, nas, *lone)
    layout = layout_of(before)
    after = {u: {**doc, "usages": {"VCPU": 3, "DISK_GB": 2}} for u, doc in before.items()}
    for spec in ("VCPU:1,MEMORY_MB:8,DISK_GB:1", "VCPU:2",
                 "resources1=VCPU:1&resources2=DISK_GB:5&group_policy=isolate"):
        query = parse_query(spec)
        kept = find_candidates(after, query, None, layout)
        fresh = find_candidates(after, query, None)
        assert sorted(map(repr, kept)) == sorted(map(repr, fresh)), spec
        assert kept, spec
    assert "parent" in hosts(find_candidates(after, parse_query("VCPU:1,MEMORY_MB:8,DISK_GB:1"),
                                             None, layout))
