"""Hosts as providers: measured, never orphaned, drainable, on both backends."""
from __future__ import annotations

import libvirt
import pytest

from engine.placement import Conflict, open_placement
from engine.core.store import Store
from engine.placement.host import drain, measure, register_host
from tests.support import revisions_since, wait_for
from tests.support.placement import new_uuid, placement, placement_server  # noqa: F401

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
    assert len(revisions_since(store, revision)) == 1   # inventory, trait, saved reserved: one txn
    assert drained["generation"] == generation + 1
    assert all(inv["reserved"] == inv["total"] for inv in drained["inventories"].values())
    assert "COMPUTE_STATUS_DISABLED" in drained["traits"]
    assert drain(placement, "host1")["inventories"]["VCPU"]["reserved"] == 4   # twice: still
    register_host(placement, "host1", dict(FACTS, vcpus=6))     # restarted while drained
    revision = store.revision()
    back = drain(placement, "host1", drained=False)
    assert len(revisions_since(store, revision)) == 1
    assert {rc: inv["reserved"] for rc, inv in back["inventories"].items()} == \
        {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 0}
    assert back["inventories"]["VCPU"]["total"] == 6
    assert "COMPUTE_STATUS_DISABLED" not in back["traits"]
    assert back["usages"] == {"VCPU": 2}
    assert store.get("placement/drained/" + rp["uuid"]) is None
    # undraining a host that is not drained changes no reserved amount
    assert drain(placement, "host1", drained=False)["inventories"] == back["inventories"]
    store.close()


def _operator_fields(rp):
    return {rc: {k: inv[k] for k in ("reserved", "allocation_ratio", "min_unit", "step_size")}
            for rc, inv in rp["inventories"].items()}


def test_reregistration_keeps_operator_settings(placement):
    """Only total and max_unit are the peer's; what an operator set survives
    a re-registration with the same or new measurements."""
    rp = register_host(placement, "host1", FACTS)
    inventories = dict(rp["inventories"])
    inventories["VCPU"] = dict(inventories["VCPU"], reserved=1, allocation_ratio=8.0,
                               min_unit=2, step_size=2)
    inventories["MEMORY_MB"] = dict(inventories["MEMORY_MB"], reserved=512,
                                    allocation_ratio=1.5)
    set_by_operator = placement.set_inventory(rp["uuid"], inventories)
    wanted = _operator_fields(set_by_operator)
    again = register_host(placement, "host1", FACTS)            # restart, same host
    assert again["generation"] == set_by_operator["generation"]  # nothing written
    assert _operator_fields(again) == wanted
    bigger = register_host(placement, "host1", dict(FACTS, vcpus=8, memory_mb=4096))
    assert _operator_fields(bigger) == wanted
    assert {rc: (inv["total"], inv["max_unit"]) for rc, inv in bigger["inventories"].items()} \
        == {"VCPU": (8, 8), "MEMORY_MB": (4096, 4096), "DISK_GB": (20, 20)}
    # measured below what is reserved: capped, still a valid inventory
    small = register_host(placement, "host1", dict(FACTS, memory_mb=256))
    assert small["inventories"]["MEMORY_MB"]["reserved"] == 256
    assert small["inventories"]["VCPU"]["allocation_ratio"] == 8.0
    # given explicitly, reserved and ratios win
    told = register_host(placement, "host1", FACTS, reserved={"VCPU": 3}, ratios={"VCPU": 2.0})
    assert (told["inventories"]["VCPU"]["reserved"],
            told["inventories"]["VCPU"]["allocation_ratio"]) == (3, 2.0)
    assert told["inventories"]["VCPU"]["step_size"] == 2
    # given, reserved is exactly that: a class it does not name reserves 0,
    # and more than the total is capped at the total
    assert told["inventories"]["MEMORY_MB"]["reserved"] == 0
    capped = register_host(placement, "host1", FACTS, reserved={"DISK_GB": 999})
    assert {rc: inv["reserved"] for rc, inv in capped["inventories"].items()} == \
        {"VCPU": 0, "MEMORY_MB": 0, "DISK_GB": 20}
    assert [p["name"] for p in placement.providers()] == ["host1"]


def test_reregistration_keeps_a_drained_host_drained(placement):
    rp = register_host(placement, "host1", FACTS)
    placement.set_inventory(rp["uuid"], {rc: dict(inv, reserved=1, allocation_ratio=2.0)
                                         for rc, inv in rp["inventories"].items()})
    drain(placement, "host1")
    again = register_host(placement, "host1", dict(FACTS, vcpus=6))
    assert {rc: inv["reserved"] for rc, inv in again["inventories"].items()} == \
        {"VCPU": 6, "MEMORY_MB": 2048, "DISK_GB": 20}
    assert "COMPUTE_STATUS_DISABLED" in again["traits"]
    assert placement.candidates("VCPU:1") == []
    back = drain(placement, "host1", drained=False)
    assert {inv["allocation_ratio"] for inv in back["inventories"].values()} == {2.0}
    # etcd restores the reserved from before the drain, Placement cannot
    assert {inv["reserved"] for inv in back["inventories"].values()} == \
        ({1} if placement.backend == "etcd" else {0})


def test_peer_restart_keeps_operator_settings(cluster, placement):
    """A real peer (test:///default: 16 CPUs, 3072 MiB, the built-in domain
    `test` running: 2 vCPUs, 2048 MiB, foreign, reserving 2048 MiB and 2/4
    CPUs rounded up) registers its host; an
    operator sets reserved and allocation ratio; the peer is SIGKILLed and
    restarted.  The operator also raised the recorded VCPU total, which the
    restarted peer must measure and write back: that write is what the test
    waits for.  Same uuid, one provider, the operator's ratios kept; reserved
    is the peer's: what the foreign domain holds (the reserved setting,
    none here, adds to it: engine/hypervisor/host/accounting.py)."""
    env = {} if placement.backend == "etcd" else {"PEERCTL_PLACEMENT": placement.url}

    def providers():
        return cluster.cli_json("placement", "providers", env=env)

    def registered():
        rows = providers()
        return rows if rows and rows[0]["inventories"].get("VCPU", {}).get("total") == 16 \
            else None
    cluster.start_peer("host1", env=env)
    [first] = wait_for(registered, timeout=60, what="host1 registered")
    assert first["name"] == "host1"
    assert {rc: inv["reserved"] for rc, inv in first["inventories"].items()} == \
        {"VCPU": 1, "MEMORY_MB": 2048, "DISK_GB": 0}
    inventories = {rc: dict(inv) for rc, inv in first["inventories"].items()}
    inventories["VCPU"].update(total=64, max_unit=64, reserved=3, allocation_ratio=8.0)
    inventories["MEMORY_MB"].update(reserved=512, allocation_ratio=1.5)
    placement.set_inventory(first["uuid"], inventories)
    cluster.kill("host1")
    cluster.start_peer("host1", env=env)
    [again] = wait_for(registered, timeout=60, what="host1 registered again")
    assert (again["uuid"], again["name"]) == (first["uuid"], "host1")
    assert again["inventories"]["VCPU"] == dict(first["inventories"]["VCPU"],
                                                allocation_ratio=8.0)
    assert again["inventories"]["MEMORY_MB"] == dict(first["inventories"]["MEMORY_MB"],
                                                     allocation_ratio=1.5)
    assert [p["name"] for p in providers()] == ["host1"]
    assert cluster.peers["host1"].poll() is None, cluster.log("host1")
