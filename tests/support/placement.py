"""Fixtures for the placement tests: one contract, two backends.

``placement`` is parametrized over ``etcd`` (a fresh cluster on the session
etcd) and ``openstack`` (a real openstack-placement served on loopback for
the whole session, wiped after each test).  Import the fixtures into a test
module with ``from tests.support.placement import ...``.
"""
from __future__ import annotations

import uuid

import pytest

from engine.placement import open_placement

__all__ = ["placement", "placement_server", "new_uuid", "make_provider", "full_state"]


def new_uuid() -> str:
    return str(uuid.uuid4())


def make_provider(placement, name, inventories=None, traits=(), aggregates=(), parent=None):
    rp = placement.ensure_provider(name, parent=parent)
    if inventories:
        rp = placement.set_inventory(rp["uuid"], inventories)
    if traits:
        rp = placement.set_traits(rp["uuid"], traits)
    if aggregates:
        rp = placement.set_aggregates(rp["uuid"], aggregates)
    return rp


def full_state(placement) -> dict:
    """Everything a write could have changed, to compare before and after.

    etcd: every key of the cluster with its value and mod revision.
    Placement: providers (inventories, usages, traits, aggregates,
    generations), the resource class and trait lists, every allocation."""
    if placement.backend == "etcd":
        kvs, _ = placement.store.range("")
        return {kv.key: (kv.value, kv.mod_revision) for kv in kvs}
    get = lambda path: placement._call("GET", path).json()  # noqa: E731
    return {"providers": placement.providers(),
            "resource_classes": sorted(rc["name"] for rc in get("/resource_classes")["resource_classes"]),
            "traits": sorted(get("/traits")["traits"]),
            "allocations": placement.all_allocations()}


@pytest.fixture(scope="session")
def placement_server(tmp_path_factory):
    from tests.support.placement_server import PlacementServer, placement_installed
    if not placement_installed():
        pytest.skip("openstack-placement not installed (pip install -r requirements-placement.txt)")
    server = PlacementServer(str(tmp_path_factory.mktemp("placement"))).start()
    yield server
    server.stop()


@pytest.fixture(params=["etcd", "openstack"])
def placement(request, etcd, cluster_name):
    if request.param == "etcd":
        from engine.core.store import Store
        store = Store(etcd.url, cluster_name)
        backend = open_placement("etcd", store)
        yield backend
        store.close()
    else:
        server = request.getfixturevalue("placement_server")
        backend = open_placement(server.url)
        yield backend
        server.wipe()
        backend.close()
