"""A three-member etcd: the cluster carries on when etcd's leader member is
SIGKILLed in the middle of a 20-VM boot, the boot completes exactly once,
nothing is orphaned, `ping` keeps working, and the member rejoins; commands
started while it dies each start their automation once."""
from __future__ import annotations

import json
import threading
import time

import pytest

from engine.core import api, keys
from engine.core.etcd_server import EtcdCluster
from engine.core.store import Store
from tests.support import wait_for
from tests.support.cluster import Cluster, start_three_peers
from tests.support.vms import allocations, published


@pytest.fixture
def members(tmp_path):
    etcd = EtcdCluster(str(tmp_path / "etcd"), 3).start()
    yield etcd
    etcd.stop()


def leader_of(etcd: EtcdCluster):
    """The member etcd's members agree leads, and a store on every member."""
    stores = [Store(member.url, "x", timeout=2.0) for member in etcd.members]
    try:
        statuses = [store.status() for store in stores]
    finally:
        for store in stores:
            store.close()
    leaders = {status["leader"] for status in statuses}
    assert len(leaders) == 1, statuses
    (leader,) = leaders
    return next(member for member, status in zip(etcd.members, statuses)
                if status["member"] == leader)


class Pinger(threading.Thread):
    """`ping` over and over through the command line until stopped."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.done, self.outcomes = cluster, threading.Event(), []

    def run(self):
        while not self.done.is_set():
            ping = self.cluster.cli("--format", "json", "ping", timeout=60)
            self.outcomes.append((ping.returncode, ping.stderr.strip()[-300:]))


def test_leader_member_killed_during_a_boot_of_twenty(members, tmp_path, cluster_name):
    cluster = Cluster(members.urls, cluster_name, tmp_path)
    store = Store(members.urls, cluster_name)
    pinger = Pinger(cluster)
    try:
        start_three_peers(cluster)
        names = [f"vm{i}" for i in range(1, 21)]
        started = cluster.cli_json("boot", *names, "--resources",
                                   "VCPU:1,MEMORY_MB:64,DISK_GB:1", "--detach")
        automation = started["automation"]
        pinger.start()
        wait_for(lambda: len(published(store)) >= 4, timeout=60, what="a few VMs built")

        leader = leader_of(members)
        leader.kill()
        killed_at = time.monotonic()
        waited = cluster.cli("--format", "json", "wait", automation, timeout=180)
        assert waited.returncode == 0, (waited.stdout, waited.stderr)
        task = json.loads(waited.stdout)
        assert task["state"] == "done", task
        print(f"boot done {time.monotonic() - killed_at:.1f} s after the leader member died")

        leader.start()          # rejoins on its data directory
        wait_for(lambda: pinger.outcomes and len(pinger.outcomes) >= 3, timeout=60,
                 what="pings after the member came back")
    finally:
        pinger.done.set()
        pinger.join(90)
        cluster.close()

    # everything once: 20 VMs, each on one host, each with one allocation
    vms = published(store)
    assert sorted(vm["name"] for vm in vms) == sorted(names)
    assert all(vm["state"] == "running" for vm in vms)
    assert set(allocations(store)) == {vm["uuid"] for vm in vms}, "orphan or missing claims"
    assert [vm["state"] for vm in task["result"]["vms"]] == ["running"] * 20
    # `ping` worked throughout
    failed = [outcome for outcome in pinger.outcomes if outcome[0] != 0]
    assert len(pinger.outcomes) >= 3 and not failed, failed
    # the member that came back holds what was written while it was away
    rejoined = Store(leader.url, cluster_name)
    try:
        wait_for(lambda: len(rejoined.range("vms/")[0]) == 20, timeout=30,
                 what="the rejoined member to catch up")
    finally:
        rejoined.close()
        store.close()


class Starter(threading.Thread):
    """Automations started one after another, each by a new client, as
    separate `peerctl.py` commands would: the ids returned, the failures."""

    def __init__(self, urls, cluster_name):
        super().__init__(daemon=True)
        self.urls, self.cluster_name = urls, cluster_name
        self.done, self.started, self.failed = threading.Event(), [], []

    def run(self):
        while not self.done.is_set():
            store = Store(self.urls, self.cluster_name)
            try:
                self.started.append(api.start_automation(store, "ping", {"hosts": ["h1"]}))
            except Exception as exc:        # any failure is one: none may end the thread unseen
                self.failed.append(f"{type(exc).__name__}: {exc}")
            finally:
                store.close()


def test_automations_started_while_the_leader_member_dies_are_each_created_once(
        members, cluster_name):
    store = Store(members.urls, cluster_name)
    store.put(keys.host("h1"), {"host": "h1"}, store.grant(600))
    starters = [Starter(members.urls, cluster_name) for _ in range(4)]
    try:
        for starter in starters:
            starter.start()
        count = lambda: sum(len(starter.started) for starter in starters)    # noqa: E731
        wait_for(lambda: count() >= 100, timeout=60, what="automations started")
        leader_of(members).kill()
        killed_at = count()
        wait_for(lambda: count() >= killed_at + 400, timeout=120,
                 what="automations started after the leader member died")
    finally:
        for starter in starters:
            starter.done.set()
            starter.join(60)
    # none failed, none lost, none doubled
    assert [exc for starter in starters for exc in starter.failed] == []
    started = [automation for starter in starters for automation in starter.started]
    written = [kv.key for kv in store.range(keys.auto())[0] if kv.key.endswith("/spec")]
    store.close()
    assert len(set(started)) == len(started)
    assert sorted(written) == sorted(keys.spec(automation) for automation in started)
