"""The ghost sweep with a copy of a VM that etcd places on another host and
nothing says was given up here (no ``disowned/`` mark): what an etcd
restored from a snapshot older than the VM's move looks like from the host
it moved to.  It may be the only copy: running, it is left alone and
reported once; stopped, its disks are kept aside, never deleted.  Request
handlers called in this process on two test-driver hosts and a real etcd."""
from __future__ import annotations

import uuid as uuidlib

import pytest
import structlog

from engine.core import keys
from engine.hypervisor.host.reconciler import sweep_ghosts
from engine.placement import open_placement
from tests.support.handlers import call, new_host
from tests.support.placement import make_provider
from tests.support.vms import big_test_host

BUILD = {"vcpus": 1, "memory_mb": 64, "disk_gb": 1, "image": None}
COMPUTE = {"VCPU": 8, "MEMORY_MB": 8192, "DISK_GB": 100}


@pytest.fixture
def hosts(store, tmp_path):
    placement = open_placement("etcd", store)
    for name in ("h1", "h2"):
        make_provider(placement, name, COMPUTE)
    return [new_host(tmp_path / name, store, big_test_host(tmp_path / f"{name}.xml"), name)
            for name in ("h1", "h2")]


def copy_placed_on_h1_running_on_h2(store, h2) -> str:
    """A VM built on h2 whose allocation etcd holds on h1's provider."""
    uuid = str(uuidlib.uuid4())
    call(h2, "build", uuid=uuid, name="db1", **BUILD)
    placement = open_placement("etcd", store)
    h1 = placement.provider("h1")["uuid"]
    placement.claim(uuid, {h1: {"VCPU": 1, "MEMORY_MB": 64, "DISK_GB": 1}},
                    project="p", user="u")
    return uuid


def test_a_running_copy_nothing_gave_up_is_left_alone_and_reported_once(store, hosts):
    _, h2 = hosts
    uuid = copy_placed_on_h1_running_on_h2(store, h2)
    with structlog.testing.capture_logs() as logs:
        assert sweep_ghosts(store, h2) == []
        assert sweep_ghosts(store, h2) == []
    assert h2.conn.lookupByUUIDString(uuid).isActive() == 1
    reported = [e for e in logs if e["event"] == "ghost_vm_running_left_alone"]
    assert [(e["host"], e["uuid"]) for e in reported] == [("h2", uuid)], "reported once"
    assert store.get(keys.vm("h2", uuid)) is not None, "its record went"


def test_a_stopped_copy_nothing_gave_up_has_its_disks_kept_aside(store, hosts):
    _, h2 = hosts
    uuid = copy_placed_on_h1_running_on_h2(store, h2)
    h2.conn.lookupByUUIDString(uuid).destroy()            # powered off, still defined
    assert sweep_ghosts(store, h2) == [uuid]
    assert uuid not in [d.UUIDString() for d in h2.conn.listAllDomains(0)]
    (kept,) = [kv.value for kv in store.range(keys.aside("h2"))[0]]
    assert kept["uuid"] == uuid and kept["volumes"], kept
    pool = h2.conn.storagePoolLookupByName("peerctl-h2")
    assert {v["name"] for v in kept["volumes"]} <= set(pool.listVolumes())
