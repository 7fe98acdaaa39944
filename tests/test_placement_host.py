"""Hosts as providers: measured, never orphaned, drainable, on both backends."""
from __future__ import annotations

import libvirt
import pytest

from engine.placement import Conflict, open_placement
from engine.store import Store
from engine.placement.host import drain, measure, register_host
from tests.placement_support import new_uuid, placement, placement_server  # noqa: F401

FACTS = {"vcpus": 4, "memory_mb": 2048, "disk_gb": 20}


def test_measure_from_libvirt_and_psutil(tmp_path):
    conn = libvirt.open("test:///default")
    measured = measure(conn, str(tmp_path))
    info = conn.getInfo()
    assert measured["VCPU"] == info[2] and measured["MEMORY_MB"] == info[1]
    assert measured["DISK_GB"] >= 1
    local = measure(None, str(tmp_path))
    assert local["VCPU"] >= 1 and local["MEMORY_MB"] > 0


def test_restart_keeps_the_provider(placement):
    first = register_host(placement, "host1", FACTS)
    assert first["inventories"]["VCPU"]["total"] == 4
    assert first["inventories"]["VCPU"]["allocation_ratio"] == 4.0
    again = register_host(placement, "host1", FACTS)        # a restarted peer
    assert again["uuid"] == first["uuid"]
    assert again["generation"] == first["generation"]       # nothing written
    bigger = register_host(placement, "host1", dict(FACTS, vcpus=8))
    assert bigger["uuid"] == first["uuid"]
    assert bigger["inventories"]["VCPU"]["total"] == 8
    assert [p["name"] for p in placement.providers()] == ["host1"]


def test_register_with_libvirt_connection(placement, tmp_path):
    rp = register_host(placement, "lvhost", libvirt.open("test:///default"),
                       state_dir=str(tmp_path))
    assert set(rp["inventories"]) == {"VCPU", "MEMORY_MB", "DISK_GB"}
    assert placement.candidates("VCPU:1,MEMORY_MB:64,DISK_GB:1")[0]["host"] == "lvhost"


def test_drain_survives_restart(placement):
    rp = register_host(placement, "host1", FACTS)
    placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 2}}, project="p", user="u")
    drain(placement, "host1")
    again = register_host(placement, "host1", dict(FACTS, vcpus=6))
    assert again["inventories"]["VCPU"]["reserved"] == 6
    assert placement.candidates("VCPU:1") == []
    with pytest.raises(Conflict):
        placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 1}}, project="p", user="u")
    assert again["usages"] == {"VCPU": 2}       # existing allocations stay
    drain(placement, "host1", drained=False)
    assert len(placement.candidates("VCPU:1")) == 1


def test_nested_children_under_a_host(placement):
    host = register_host(placement, "host1", FACTS)
    cell = placement.ensure_provider("host1_numa0", parent=host["uuid"])
    placement.set_inventory(cell["uuid"], {"PCPU": 2})
    [cand] = placement.candidates("VCPU:1,PCPU:1")
    assert cand["host"] == "host1"
    assert cand["allocations"] == {host["uuid"]: {"VCPU": 1}, cell["uuid"]: {"PCPU": 1}}


def test_etcd_drain_is_one_transaction_and_undrain_restores_reserved(etcd, cluster_name):
    store = Store(etcd.url, cluster_name)
    placement = open_placement("etcd", store)
    rp = register_host(placement, "host1", FACTS, reserved={"VCPU": 1, "MEMORY_MB": 512})
    placement.claim(new_uuid(), {rp["uuid"]: {"VCPU": 2}}, project="p", user="u")
    revision, generation = store.revision(), placement.provider("host1")["generation"]
    drained = drain(placement, "host1")
    assert store.revision() == revision + 1         # inventory, trait, saved reserved: one txn
    assert drained["generation"] == generation + 1
    assert all(inv["reserved"] == inv["total"] for inv in drained["inventories"].values())
    assert "COMPUTE_STATUS_DISABLED" in drained["traits"]
    assert drain(placement, "host1")["inventories"]["VCPU"]["reserved"] == 4   # twice: still
    register_host(placement, "host1", dict(FACTS, vcpus=6))     # restarted while drained
    revision = store.revision()
    back = drain(placement, "host1", drained=False)
    assert store.revision() == revision + 1
    assert {rc: inv["reserved"] for rc, inv in back["inventories"].items()} == \
        {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 0}
    assert back["inventories"]["VCPU"]["total"] == 6
    assert "COMPUTE_STATUS_DISABLED" not in back["traits"]
    assert back["usages"] == {"VCPU": 2}
    assert store.get("placement/drained/" + rp["uuid"]) is None
    # undraining a host that is not drained changes no reserved amount
    assert drain(placement, "host1", drained=False)["inventories"] == back["inventories"]
    store.close()
