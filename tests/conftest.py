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

from engine.core.etcd_server import PORTS_ENV, EtcdServer, etcd_binary  # noqa: E402
from engine.core.store import Store  # noqa: E402
from tests.support.cluster import Cluster, ready_hosts, start_three_peers  # noqa: E402


PORTS_FROM, PORTS_PER_WORKER = 20000, 1200    # below the kernel's ephemeral ports (32768-)


def pytest_configure(config):
    """Each process of the run (the only one, or each pytest-xdist worker)
    hands out loopback ports from a range of its own (free_port), and the
    bytecode of the modules every peer and command imports is compiled once
    here, not again in each of the thousands of processes the tests start
    (PYTHONDONTWRITEBYTECODE would have each compile them all)."""
    # Started in the background by a shell without job control (`cmd &` in
    # a script), a process ignores SIGINT, and so would every command the
    # tests interrupt with Ctrl-C: they get the default action back.
    import signal
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    low = PORTS_FROM + (index % 10) * PORTS_PER_WORKER
    os.environ[PORTS_ENV] = f"{low}-{low + PORTS_PER_WORKER - 1}"
    if not hasattr(config, "workerinput"):
        import compileall
        for part in ("engine", "automations", "requests", "tests"):
            compileall.compile_dir(os.path.join(ROOT, part), quiet=2)


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


# -- the real-QEMU tier's workers (owned by the QEMU tier) -------------------------

QEMU_TIER_WORKERS = 3   # on 2 CPUs: 5:34 (4 workers: 5:31 with the CPUs saturated)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """``-m qemu`` alone (the real-QEMU tier) runs on QEMU_TIER_WORKERS
    pytest-xdist workers, whatever -n setup.cfg's addopts gives the quick
    tier, unless the command line or PYTEST_ADDOPTS says -n itself.  Runs
    before xdist's own hook reads the option; each worker has its own etcd,
    ports, private libvirtd pair and network namespace."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    if (config.option.markexpr or "").strip() != "qemu" or config.getoption("usepdb"):
        return
    import shlex
    given = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    if any(str(a) in ("-n", "--numprocesses") or str(a).startswith(("-n", "--numprocesses="))
           for a in given):
        return
    config.option.numprocesses = QEMU_TIER_WORKERS
