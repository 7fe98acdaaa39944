"""Host records nobody leases are no hosts (issue 26): with ``hosts/`` keys
put by hand beside two real peers (a record of the right shape, one whose
name is a number, and bytes that are no record at all, none of them held
by a lease), the real command line's ``hostlist``, ``ping``, ``boot`` and
``evacuate`` work on the real peers alone, saying once which keys they
skipped.  The other way round, a record a lease holds is a live host however
long ago it was written: peers write it only when it says something new."""
from __future__ import annotations

import json
import time

import msgpack
import pytest

from engine.core import keys
from tests.support import wait_for
from tests.support.cluster import start_peers
from tests.support.raw import put_raw

PEERS = ["host1", "host2"]
SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
GHOSTS = {"ghost-3": msgpack.packb({"host": "ghost-3", "vcpus": 4}),
          "ghost-7": msgpack.packb({"host": 7}),
          "ghost-9": b"\xc1 not msgpack"}


@pytest.fixture
def haunted(cluster, store, etcd):
    """host1 and host2 ready for boots, and the ghosts' keys beside them."""
    start_peers(cluster, store, PEERS)
    wait_for(lambda: set(PEERS) <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what="providers of host1 and host2")
    for name, raw in GHOSTS.items():
        put_raw(etcd.url, f"/peerctl/{cluster.name}/{keys.host(name)}", raw)
    return [keys.host(name) for name in GHOSTS]


def json_and_warnings(cluster, *args, rc=0):
    done = cluster.cli("--format", "json", *args, input="")
    assert done.returncode == rc, (args, done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout), done.stderr


def test_hostlist_lists_only_real_hosts_and_names_each_ghost_once(cluster, haunted):
    hosts, warnings = json_and_warnings(cluster, "hostlist")
    assert {h["host"]: h["alive"] for h in hosts} == {"host1": True, "host2": True}
    for key in haunted:
        assert warnings.count(key) == 1, warnings
    assert "ghost-3: bound to no lease" in warnings
    table = cluster.cli("hostlist")
    assert table.returncode == 0 and "ghost" not in table.stdout
    assert "2 hosts responded" in table.stdout


def test_ping_boot_and_evacuate_use_the_real_hosts_alone(cluster, store, haunted):
    ping, _ = json_and_warnings(cluster, "ping")
    assert ping["state"] == "done" and {r["host"] for r in ping["replies"]} == set(PEERS)
    assert set(store.get(keys.spec(ping["automation"])).value["members"]) <= set(PEERS)
    _, said = json_and_warnings(cluster, "ping", "ghost*", rc=1)
    assert said.splitlines()[-1] == "peerctl: no live host matches 'ghost*'"

    booted, _ = json_and_warnings(cluster, "boot", "g1", "g2", "--resources", SPEC)
    assert booted["state"] == "done", booted
    assert {vm["host"] for vm in booted["vms"]} <= set(PEERS)
    assert set(store.get(keys.spec(booted["automation"])).value["members"]) <= set(PEERS)
    pinned, _ = json_and_warnings(cluster, "boot", "g3", "--resources", SPEC, "--on", "host1")
    assert pinned["state"] == "done" and pinned["vms"][0]["host"] == "host1", pinned
    refused, said = json_and_warnings(cluster, "boot", "g4", "--resources", SPEC,
                                      "--on", "ghost*", rc=1)
    assert refused == {"automation": None, "state": "failed", "vms": []}   # none started
    assert said.splitlines()[-1] == "peerctl: no host matches --on 'ghost*'"

    on_host1 = [vm["name"] for vm in booted["vms"] + pinned["vms"] if vm["host"] == "host1"]
    moved, _ = json_and_warnings(cluster, "evacuate", "host1", "--yes")
    assert moved["state"] == "done", moved
    assert sorted(vm["name"] for vm in moved["vms"]) == sorted(on_host1)
    assert {vm["host"] for vm in moved["vms"]} <= {"host2"}
    listed, _ = json_and_warnings(cluster, "vmlist")
    assert sorted((vm["name"], vm["host"]) for vm in listed) == [
        ("g1", "host2"), ("g2", "host2"), ("g3", "host2")]
    _, said = json_and_warnings(cluster, "evacuate", "ghost*", "--yes", rc=1)
    assert said.splitlines()[-1] == "peerctl: no host matches 'ghost*'"


def test_a_leased_record_written_an_hour_ago_is_a_live_host_with_its_figures(cluster, store):
    record = {"host": "quiet-1", "updated": time.time() - 3600, "vcpus": 8,
              "memory_mb": 16384, "free_memory_mb": 12288, "disk_gb": 500.0,
              "free_disk_gb": 400.0, "cpu_usage": 4.0, "kernel": "6.1.0"}
    store.put(keys.host("quiet-1"), record, store.grant(60))
    store.put(keys.host_config("quiet-1"), record)
    (listed,), warnings = json_and_warnings(cluster, "hostlist")
    assert warnings == ""
    assert (listed["host"], listed["alive"], listed["enabled"]) == ("quiet-1", True, True)
    assert (listed["free_memory_mb"], listed["free_disk_gb"]) == (12288, 400.0)
    (stats,), _ = json_and_warnings(cluster, "hoststats")
    assert (stats["alive"], stats["cpu_usage"]) == (True, 4.0)
    assert "1 host responded" in cluster.cli("hostlist").stdout
