"""Real processes racing for capacity, and a claimer killed mid-claim."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from engine.placement import open_placement
from engine.store import Store
from tests.cluster import wait_for
from tests.placement_support import make_provider, new_uuid, placement_server  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLAIMER = os.path.join(ROOT, "tests", "placement_claimer.py")
PROCESSES = 8


def race(backend: str, spec: str, tmp_path) -> list[dict]:
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, CLAIMER, backend, spec, "until-refused", str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(PROCESSES)]
    go.write_text("go")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def fill(placement, providers: int, vcpus: int) -> list[dict]:
    return [make_provider(placement, f"cn{i:03d}", {"VCPU": vcpus, "MEMORY_MB": 65536})
            for i in range(providers)]


def check_exact(placement, results, rps, capacity):
    claimed = [c for r in results for c in r["claimed"]]
    assert len(claimed) == len(set(claimed))
    held = placement.all_allocations()
    # nothing lost: every claim that said yes holds its allocation, nothing else does
    assert sorted(a["consumer"] for a in held) == sorted(claimed)
    used = sum(placement.provider(rp["uuid"])["usages"].get("VCPU", 0) for rp in rps)
    assert used == len(claimed)
    return len(claimed)


def test_eight_processes_claim_exactly_capacity_on_etcd(etcd, cluster_name, tmp_path):
    store = Store(etcd.url, cluster_name)
    placement = open_placement("etcd", store)
    rps = fill(placement, 10, 8)
    capacity = 80
    results = race(f"etcd:{etcd.url}:{cluster_name}", "VCPU:1", tmp_path)
    assert check_exact(placement, results, rps, capacity) == capacity
    for rp in rps:
        assert placement.provider(rp["uuid"])["usages"]["VCPU"] == 8
    print("etcd:", {k: sum(r[k] for r in results) for k in ("capacity_exceeded",
                                                              "concurrent_update")})
    store.close()


def test_eight_processes_against_openstack_placement(placement_server, tmp_path):  # noqa: F811
    placement = open_placement(placement_server.url)
    try:
        rps = fill(placement, 4, 4)
        capacity = 16
        results = race(placement_server.url, "VCPU:1", tmp_path)
        granted = check_exact(placement, results, rps, capacity)
        # recorded behaviour (sqlite, single-threaded server): no overcommit
        print("openstack placement granted", granted, "of", capacity,
              {k: sum(r[k] for r in results) for k in ("capacity_exceeded", "concurrent_update")})
        assert granted == capacity
    finally:
        placement_server.wipe()
        placement.close()


@pytest.mark.parametrize("round_", range(3))
def test_sigkill_mid_claim_leaves_whole_allocations(etcd, cluster_name, tmp_path, round_):
    store = Store(etcd.url, cluster_name)
    placement = open_placement("etcd", store)
    agg = new_uuid()
    cn = make_provider(placement, "cn", {"VCPU": 1000000}, aggregates=[agg])
    nfs = make_provider(placement, "nfs", {"DISK_GB": 1000000},
                        traits=["MISC_SHARES_VIA_AGGREGATE"], aggregates=[agg])
    claimer = subprocess.Popen([sys.executable, CLAIMER, f"etcd:{etcd.url}:{cluster_name}",
                                "VCPU:1,DISK_GB:2", "forever"], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        target = random.randint(5, 40)
        wait_for(lambda: placement.provider(cn["uuid"])["generation"] >= target + 1
                 or claimer.poll() is not None, timeout=30, interval=0.002,
                 what=f"{target} allocation changes")
        assert claimer.poll() is None, claimer.stderr.read().decode()[-2000:]
    finally:
        claimer.send_signal(signal.SIGKILL)
        claimer.wait()
    whole = {cn["uuid"]: {"VCPU": 1}, nfs["uuid"]: {"DISK_GB": 2}}
    held = placement.all_allocations()
    assert held, "the claimer claimed nothing"
    for consumer in held:
        assert consumer["allocations"] == whole, consumer
    assert placement.provider(cn["uuid"])["usages"] == {"VCPU": len(held)}
    assert placement.provider(nfs["uuid"])["usages"] == {"DISK_GB": 2 * len(held)}
    store.close()
