"""The claim/release/candidates request handlers, and the shapes of the
placement operations (engine/operations/placement.py) the CLI prints."""
from __future__ import annotations

import contextlib

import pytest

from engine.errors import RequestError, UsageError
from engine.operations import Context
from engine.operations.placement import allocations, candidates, providers
from engine.operations.select import NoMatch
from engine.placement import open_placement
from tests.support.handlers import call, new_host
from tests.support.placement import make_provider, new_uuid


class OnPlacement(Context):
    """A Context whose placement is the test's own, left open after use."""

    def __init__(self, placement):
        super().__init__("http://127.0.0.1:9", "unused")
        self.service = placement

    @contextlib.contextmanager
    def placement(self):
        yield self.service


def test_claim_release_candidates_handlers(store, tmp_path):
    placement = open_placement("etcd", store)
    a = make_provider(placement, "a", {"VCPU": 2, "MEMORY_MB": 1024})
    make_provider(placement, "b", {"VCPU": 4, "MEMORY_MB": 1024}, traits=["CUSTOM_SLOW"])
    host = new_host(tmp_path, store, name="a")
    found = call(host, "candidates", resources="VCPU:1")["candidates"]
    assert [c["host"] for c in found] == ["b", "a"]
    vm = new_uuid()
    got = call(host, "claim", consumer=vm, resources={"VCPU": 2}, required="!CUSTOM_SLOW")
    assert got == {"consumer": vm, "host": "a", "allocations": {a["uuid"]: {"VCPU": 2}}}
    again = call(host, "claim", consumer=vm, resources="VCPU:2", required="!CUSTOM_SLOW")
    assert again == got                                 # idempotent
    with pytest.raises(RequestError, match="no host"):
        call(host, "claim", consumer=new_uuid(), resources="VCPU:1", required="!CUSTOM_SLOW")
    with pytest.raises(RequestError, match="VCPUS"):
        call(host, "claim", consumer=new_uuid(), resources="VCPUS:1")
    other = call(host, "claim", consumer=new_uuid(), resources="VCPU:1", hosts="b*")
    assert other["host"] == "b"
    assert call(host, "release", consumer=vm)["released"]
    assert call(host, "release", consumer=vm)["released"]
    assert placement.provider("a")["usages"] == {}


def test_cli_rows_follow_the_contract(store):
    placement = open_placement("etcd", store)
    ctx = OnPlacement(placement)
    a = make_provider(placement, "host1", {"VCPU": 4})
    vm = new_uuid()
    placement.claim(vm, {a["uuid"]: {"VCPU": 1}}, project="p", user="u")
    [row] = providers(ctx, "host*")
    assert set(row) == {"uuid", "name", "parent", "generation", "inventories", "usages",
                        "traits", "aggregates"}
    assert row["usages"] == {"VCPU": 1}
    assert set(row["inventories"]["VCPU"]) == {"total", "reserved", "min_unit", "max_unit",
                                               "step_size", "allocation_ratio"}
    with pytest.raises(NoMatch, match="no provider matches 'nope\\*'"):
        providers(ctx, "nope*")
    assert allocations(ctx, vm) == [{"consumer": vm, "allocations": {a["uuid"]: {"VCPU": 1}}}]
    assert allocations(ctx) == allocations(ctx, vm)
    assert allocations(ctx, new_uuid()) == []
    with pytest.raises(UsageError, match="bad consumer 'not-a-uuid': not a UUID"):
        allocations(ctx, "not-a-uuid")
    assert candidates(ctx, "VCPU:1", None, 5) == [
        {"allocations": {a["uuid"]: {"VCPU": 1}}, "host": "host1"}]
    assert candidates(ctx, "resources=VCPU:1&required=!CUSTOM_X", None, None)
