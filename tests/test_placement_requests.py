"""The claim/release/candidates request handlers, and the CLI row shapes."""
from __future__ import annotations

import pytest

from engine.errors import RequestError
from engine.placement import PlacementError, open_placement
from engine.placement.cli import allocations_rows, candidates_rows, providers_rows
from tests.support.handlers import call, new_host
from tests.support.placement import make_provider, new_uuid


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
    a = make_provider(placement, "host1", {"VCPU": 4})
    vm = new_uuid()
    placement.claim(vm, {a["uuid"]: {"VCPU": 1}}, project="p", user="u")
    [row] = providers_rows(placement, "host*")
    assert set(row) == {"uuid", "name", "parent", "generation", "inventories", "usages",
                        "traits", "aggregates"}
    assert row["usages"] == {"VCPU": 1}
    assert set(row["inventories"]["VCPU"]) == {"total", "reserved", "min_unit", "max_unit",
                                               "step_size", "allocation_ratio"}
    assert providers_rows(placement, "nope*") == []
    assert allocations_rows(placement, vm) == [{"consumer": vm, "allocations": {a["uuid"]: {"VCPU": 1}}}]
    assert allocations_rows(placement) == allocations_rows(placement, vm)
    assert allocations_rows(placement, new_uuid()) == []
    with pytest.raises(PlacementError, match="bad consumer 'not-a-uuid': not a UUID"):
        allocations_rows(placement, "not-a-uuid")
    assert candidates_rows(placement, "VCPU:1", None, 5) == [
        {"allocations": {a["uuid"]: {"VCPU": 1}}, "host": "host1"}]
    assert candidates_rows(placement, "resources=VCPU:1&required=!CUSTOM_X", None, None)
