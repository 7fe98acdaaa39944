"""Bad values in etcd are survived: an operator's ``etcdctl put``, an older
or newer peerctl, or a disk can leave anything under any prefix.  Peers stay
up, listings skip what they cannot read (one warning line per key), new
work runs, and ``scrub`` finds exactly the bad keys and deletes only those."""
from __future__ import annotations

import uuid

import msgpack

from engine.core import keys
from engine.core.executor import Executor
from engine.core.session import Session
from tests.support import wait_for
from tests.support.cluster import alive, start_three_peers
from tests.support.handlers import new_host
from tests.support.hooks import counting_hook, executions
from tests.support.raw import put_raw

# Bytes that are not msgpack, and msgpack of the wrong shape for any record.
NOT_MSGPACK = [b"\xc1", b"\x92\x01", b"\x81\x01", b"{\"json\": true}"]
WRONG_SHAPES = [msgpack.packb(v) for v in ([1, 2], "a string", 7, {"foo": 1},
                                           {"host": 5, "name": [], "uuid": None})]


def garbage_keys() -> list[str]:
    """One bad key under every prefix peerctl reads (none of a live host's own
    ``vms/`` prefix, which its publisher rewrites from libvirt)."""
    fake = "20991231-000000-bad" + uuid.uuid4().hex[:3]
    return [f"vms/host9/{uuid.uuid4()}", f"vms/host8/{uuid.uuid4()}", "hosts/host9",
            "hostcfg/host9", f"tasks/{fake}", f"tasks/{fake}x",
            f"auto/{fake}/spec", f"auto/{fake}/status", f"auto/{fake}/log/00000000",
            f"inbox/host1/{fake}y/00000000", "inbox/host2/not-a-step",
            f"member/host1/{fake}", f"member/host3/{fake}x",
            f"placement/rp/{uuid.uuid4()}", f"placement/consumer/{uuid.uuid4()}",
            "placement/name/host9"]


def plant(etcd_url: str, cluster: str, names: list[str]) -> None:
    bad = NOT_MSGPACK + WRONG_SHAPES
    for n, key in enumerate(names):
        put_raw(etcd_url, f"/peerctl/{cluster}/{key}", bad[n % len(bad)])


def test_bad_values_under_every_prefix_leave_the_cluster_working(cluster, etcd, store):
    peers = start_three_peers(cluster)
    before = cluster.cli_json("boot", "web1", "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert before["state"] == "done", before
    planted = garbage_keys()
    plant(etcd.url, cluster.name, planted)

    # Listings answer, show the good records and warn once per bad key they read.
    for command in ("vmlist", "hostlist", "hoststats", "tasks"):
        done = cluster.cli("--format", "json", command)
        assert done.returncode == 0, (command, done.stderr)
        warnings = [line for line in done.stderr.splitlines() if "warning" in line]
        assert len(warnings) == len(set(warnings)), (command, warnings)
    vms = cluster.cli_json("vmlist")
    assert [vm["name"] for vm in vms] == ["web1"]
    assert {h["host"] for h in cluster.cli_json("hostlist") if h["alive"]} == set(peers)
    listing = cluster.cli("vmlist")
    for key in planted[:2]:
        assert listing.stderr.count(key) == 1, listing.stderr
    assert cluster.cli_json("tasks", "--all")        # the boot is still listed

    # New work runs: a boot, a ping of every host, an action on the good VM.
    booted = cluster.cli_json("boot", "web2", "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done" and booted["vms"][0]["state"] == "running", booted
    ping = cluster.cli_json("ping")
    assert ping["state"] == "done" and {r["host"] for r in ping["replies"]} == set(peers)
    assert cluster.cli_json("stop", "web1", "--yes")["state"] == "done"

    # No peer died, and each logged a bad key at most once.
    assert all(process.poll() is None for process in cluster.peers.values())
    assert alive(cluster) == set(peers)
    for host in peers:
        reports = [line for line in cluster.log(host).splitlines() if "unreadable_value" in line]
        for key in planted:
            assert sum(f"key={key} " in line for line in reports) <= 1, (host, key)

    # scrub lists exactly the planted keys, and deletes only those.
    found = cluster.cli_json("scrub")
    assert [k["key"] for k in found["keys"]] == sorted(planted), found
    assert all(k["why"] for k in found["keys"])
    deleted = cluster.cli_json("scrub", "--delete", "--yes")
    assert sorted(deleted["deleted"]) == sorted(planted)
    assert all(store.get(key) is None for key in planted)
    assert cluster.cli_json("scrub")["keys"] == []
    assert sorted(vm["name"] for vm in cluster.cli_json("vmlist")) == ["web1", "web2"]
    assert set(peers) <= {kv.key.split("/")[1] for kv in store.range(keys.host())[0]}
    clean = cluster.cli("vmlist")
    assert clean.returncode == 0 and "warning" not in clean.stderr


def test_an_unreadable_inbox_entry_is_answered_error_or_left_never_run(store, etcd, tmp_path):
    """Where the key names an automation that exists, the entry is answered
    ``error`` and deleted; otherwise it stays for inspection.  Neither runs."""
    hooks = str(tmp_path / "hooks")
    runs = counting_hook(hooks)
    store.put(keys.spec("a1"), {"id": "a1", "kind": "ping", "version": 1, "args": {}})
    store.put(keys.status("a1"), {"state": "running"})
    store.put(keys.log_entry("a1", 0), {"index": 0, "worker": "0", "seq": 0, "request": "ping",
                                        "target": "t1", "args": {}, "fingerprint": "f"})
    plant(etcd.url, store.cluster, [keys.inbox("t1", "a1", 0), keys.inbox("t1", "gone", 0),
                                    "inbox/t1/not-a-step"])
    store.put(keys.log_entry("a2", 1), {"index": 1, "worker": "0", "seq": 0, "request": "ping",
                                        "target": "t1", "args": {}, "fingerprint": "f"})
    store.put(keys.inbox("t1", "a2", 1), {})           # a good entry beside them runs
    session = Session(store, 5)
    executor = Executor(store, new_host(str(tmp_path), store, name="t1"), hooks)
    executor.attach(session)
    try:
        response = wait_for(lambda: store.get(keys.response("a1", 0)), what="an error answer")
        assert response.value["status"] == "error" and "unreadable" in response.value["error"]
        wait_for(lambda: store.get(keys.response("a2", 1)), what="the good entry to run")
        assert executor.wait_idle(10)
        left = sorted(kv.key for kv in store.range(keys.inbox("t1"))[0])
        assert left == [keys.inbox("t1", "gone", 0), "inbox/t1/not-a-step"]
        assert store.get(keys.response("gone", 0)) is None
        assert [a for a, _, _ in executions(runs)] == ["a2"]
    finally:
        executor.detach()
        session.close()


def test_figures_that_are_not_numbers_show_as_missing_and_the_tables_still_add_up(cluster,
                                                                                   store):
    """A host or VM record whose vCPUs, memory or disk are not numbers is
    still listed, those figures shown as '-' and left out of the totals,
    with one warning line per key; the good records add up as before."""
    lease = store.grant(600)        # live hosts' records, as their peers hold them
    store.put(keys.host("host7"), {"host": "host7", "vcpus": "eight", "memory_mb": 4096,
                                   "free_memory_mb": [1], "cpu_usage": "busy"}, lease)
    store.put(keys.host("host8"), {"host": "host8", "vcpus": 8, "memory_mb": 8192,
                                   "free_memory_mb": 4096, "cpu_usage": 50.0}, lease)
    store.put(keys.vm("host7", "u1"), {"host": "host7", "name": "odd", "uuid": "u1",
                                       "state": "running", "vcpus": "2", "memory_mb": True,
                                       "disk_gb": {"gb": 1}})
    store.put(keys.vm("host8", "u2"), {"host": "host8", "name": "even", "uuid": "u2",
                                       "state": "running", "vcpus": 2, "memory_mb": 1024,
                                       "disk_gb": 10})

    listing = cluster.cli("vmlist")
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()]
    assert rows[1][:5] == ["host7", "odd", "-", "-", "running"], listing.stdout
    assert rows[2][:5] == ["host8", "even", "2", "1.0G", "running"], listing.stdout
    assert listing.stdout.splitlines()[-1] == \
        "2 VMs (2 running) on 2 hosts using 2 vCPUs, 1.0G memory and 10G disk"
    assert listing.stderr.splitlines() == [
        "peerctl: warning: partly unreadable key vms/host7/u1: not a number, shown as "
        "missing: 'vcpus' (a str), 'memory_mb' (a bool), 'disk_gb' (a dict)"]
    assert cluster.cli_json("vmlist")[0]["vcpus"] is None

    for command in ("hostlist", "hoststats"):
        done = cluster.cli(command)
        assert done.returncode == 0, (command, done.stderr)
        assert "for a total of 8 cores" in done.stdout, done.stdout
        assert done.stderr.splitlines() == [
            "peerctl: warning: partly unreadable key hosts/host7: not a number, shown as "
            "missing: 'vcpus' (a str), 'free_memory_mb' (a list), 'cpu_usage' (a str)"]
