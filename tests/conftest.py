"""Shared fixtures: a real etcd server on free loopback ports, a fresh cluster
name per test (keys never collide), and real peer processes.  Helpers live
in :mod:`tests.support`."""
from __future__ import annotations

import os
import sys
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.core.etcd_server import EtcdServer, etcd_binary  # noqa: E402
from engine.core.store import Store  # noqa: E402
from tests.support.cluster import Cluster, ready_hosts, start_three_peers  # noqa: E402


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    """One etcd for the whole session; tests isolate by cluster name."""
    if not etcd_binary():
        pytest.fail("etcd binary missing: apt-get install etcd-server")
    server = EtcdServer(str(tmp_path_factory.mktemp("etcd") / "data")).start()
    yield server
    server.stop()


@pytest.fixture
def own_etcd(tmp_path):
    """An etcd of this test's own, for tests that kill and restart it."""
    server = EtcdServer(str(tmp_path / "etcd-data")).start()
    yield server
    server.stop()


@pytest.fixture
def cluster_name():
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def store(etcd, cluster_name):
    s = Store(etcd.url, cluster_name)
    yield s
    s.close()


@pytest.fixture
def cluster(etcd, cluster_name, tmp_path):
    """Real peer processes on the session etcd; all are killed at teardown."""
    c = Cluster(etcd.url, cluster_name, tmp_path)
    yield c
    c.close()


@pytest.fixture
def peers(cluster):
    """Three live peers, host1 to host3, as ``hostlist`` shows them."""
    return start_three_peers(cluster)


@pytest.fixture
def two_hosts(cluster, store):
    """host1 and host2 alive, each with its placement provider (ready for boots)."""
    return ready_hosts(cluster, store, ["host1", "host2"])
