"""Keeping etcd in bounds: the peers' compactor keeps a short history while
the cluster is busy, watches and automations carry on across compactions,
and a database out of space shows in hostlist and on every command."""
from __future__ import annotations

import json
import time

import pytest

from engine.core import api, keys
from engine.core.etcd_server import EtcdServer
from engine.core.maintenance import space, space_warning
from engine.core.store import Store
from engine.errors import StoreRefused
from tests.support import wait_for
from tests.support.cluster import Cluster, start_three_peers

SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
HISTORY = 3         # seconds of etcd history the compactor keeps in these tests


def compacted_revision(store: Store) -> int:
    kv = store.get(keys.maintenance("compaction"))
    return (kv.value or {}).get("revision", 0) if kv else 0


@pytest.mark.slow
def test_busy_cluster_is_compacted_and_automations_carry_on(own_etcd, tmp_path, cluster_name):
    cluster = Cluster(own_etcd.url, cluster_name, tmp_path)
    store = Store(own_etcd.url, cluster_name)
    try:
        for host in ("host1", "host2", "host3"):
            cluster.start_peer(host, env={"PEERCTL_ETCD_HISTORY": f"{HISTORY}s"})
        wait_for(lambda: len(cluster.cli_json("hostlist")) == 3, timeout=30, what="peers")
        # automations that outlive several compactions: a lease sleeping on
        # durable timers until its start and its end, and a long ping
        lease = cluster.cli_json("lease", "create", "across", "--start", "+12s",
                                 "--end", "+20s", "--hosts", "1")
        shown = cluster.cli_json("lease", "show", "across")
        sleeper = shown["automation"]
        # the busy VMs keep off the leased host: its start evacuates it, and a
        # destroy racing that move is refused ("busy: being moved")
        [held] = shown["hosts"]
        others = "host[!" + held.removeprefix("host") + "]"
        long_ping = cluster.cli_json("ping", "--rounds", "250", "--detach")["automation"]
        spec_revision = store.get(keys.spec(sleeper)).create_revision
        sizes, first, crossed = [], None, False
        busy_until = time.monotonic() + 25
        round_ = 0
        while time.monotonic() < busy_until:
            round_ += 1
            names = [f"r{round_}v{i}" for i in range(3)]
            cluster.cli_json("boot", *names, "--resources", SPEC, "--on", others)
            cluster.cli_json("destroy", *names, "--yes")
            if first is None and compacted_revision(store):
                first = compacted_revision(store)
            sizes.append(space(store)["db_size"])
            if not crossed and compacted_revision(store) > spec_revision:
                # compacted past the ping's own start while it still runs
                crossed = api.get_task(store, sleeper)["state"] == "running"
        last = compacted_revision(store)
        assert first and last > first, (first, last)
        # what was compacted is gone: reading it is refused
        with pytest.raises(StoreRefused, match="compacted"):
            store.range(keys.host(), revision=max(1, last - 1))
        # the automation running across the compactions completed, watched by `wait`
        assert crossed, "the lease ended before any compaction passed its start"
        waited = cluster.cli_json("wait", long_ping, timeout=120)
        assert waited["state"] == "done"
        assert len(waited["result"]["replies"]) == 250 * 3
        assert cluster.cli_json("wait", sleeper, timeout=60)["state"] == "done"
        ended = cluster.cli_json("lease", "show", "across")
        assert lease["state"] == "pending" and ended["state"] == "ended", ended
        assert [e["event"] for e in ended["events"]] == ["granted", "started", "ending", "ended"]
        # the peers' watches are alive: a new boot is taken up and built
        after = cluster.cli_json("boot", "after", "--resources", SPEC)
        assert [vm["state"] for vm in after["vms"]] == ["running"]
        # history is kept short: the database stops growing once compaction runs
        half = sizes[len(sizes) // 2]
        print(f"{round_} busy rounds; db {sizes[0] / 2**20:.2f} -> {half / 2**20:.2f} -> "
              f"{sizes[-1] / 2**20:.2f} MiB; compacted up to revision {last}")
        assert sizes[-1] <= half * 1.5 + 2 ** 20, sizes
    finally:
        cluster.close()
        store.close()


@pytest.fixture
def tiny_etcd(tmp_path):
    server = EtcdServer(str(tmp_path / "tiny"), quota_bytes=2 * 2 ** 20).start()
    yield server
    server.stop()


def fill_until_refused(store: Store, deadline: float = 60) -> None:
    """Write 200 kB values until etcd refuses one.  etcd measures its size
    when it commits a batch (every 100 ms), so a fast machine writes many
    times the quota before the first refusal: count time, not writes."""
    filler = b"x" * 200_000
    until = time.monotonic() + deadline
    i = 0
    while time.monotonic() < until:
        store.put(f"filler/{i}", filler)
        i += 1
    raise AssertionError(f"etcd took {i} writes of 200 kB in {deadline}s without refusing one")


@pytest.mark.slow       # a long scenario: an etcd filled to its quota, every command tried
def test_out_of_space_shows_in_hostlist_and_on_every_command(tiny_etcd, tmp_path, cluster_name):
    cluster = Cluster(tiny_etcd.url, cluster_name, tmp_path)
    store = Store(tiny_etcd.url, cluster_name)
    try:
        start_three_peers(cluster)
        quota = {"PEERCTL_ETCD_QUOTA": "2M"}
        assert space_warning(space(store, 2 * 2 ** 20)) is None
        listed = cluster.cli("hostlist", env=quota)
        assert listed.returncode == 0 and "etcd: " in listed.stdout and listed.stderr == ""

        with pytest.raises(StoreRefused, match="space exceeded"):
            fill_until_refused(store)
        assert "NOSPACE" in space(store)["alarms"]

        listed = cluster.cli("hostlist", env=quota)
        assert listed.returncode == 0, listed.stderr
        assert "ALARM NOSPACE" in listed.stdout
        assert "warning: etcd is out of space" in listed.stderr
        refused = cluster.cli("boot", "vm1", "--resources", SPEC, env=quota)
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert "Traceback" not in refused.stderr and len(lines) == 2, refused.stderr
        assert "out of space" in lines[0] and "database space exceeded" in lines[1]
        assert json.loads(cluster.cli("--format", "json", "vmlist", env=quota).stdout) == []
    finally:
        cluster.close()
        store.close()


def test_space_warning_says_when_and_what():
    quota = 2 * 2 ** 30
    assert space_warning({"db_size": quota // 2, "quota": quota, "ratio": 0.5,
                          "alarms": []}) is None
    nearing = space_warning({"db_size": quota * 9 // 10, "quota": quota, "ratio": 0.9,
                             "alarms": []})
    assert "90% of its quota" in nearing and "1843 MiB of 2048 MiB" in nearing
    full = space_warning({"db_size": quota, "quota": quota, "ratio": 1.0, "alarms": ["NOSPACE"]})
    assert "out of space" in full and "NOSPACE" in full
