"""Placement benchmark: the etcd backend against a real OpenStack Placement.

    python bench/placement.py [--providers 100] [--vcpus 8] [--claimers 8]
                              [--big 1000] [--samples 200] [--no-openstack]

In one run, for each backend:
- claims/s: ``--claimers`` processes, each taking the best candidate for
  VCPU:1 and claiming it for a new consumer (alternates on
  capacity_exceeded) until nothing fits, on ``--providers`` providers of
  ``--vcpus`` VCPU; claims/s = claims granted / wall time from the common
  start to the last claimer's end;
- overcommit: claims granted beyond capacity, and the worst provider's usage
  beyond its capacity, read back after the race;
- candidates latency (median, p99) for VCPU:1,MEMORY_MB:256,DISK_GB:1 with
  limit 20 at ``--big`` providers, ``--samples`` queries per backend.

The table ends with the issue's targets marked PASS or MISS: etcd claims/s at
least 10x Placement's, and zero overcommit (per backend).

Starts its own etcd (engine.core.etcd_server) and its own Placement (sqlite,
single-threaded wsgiref; see tests/support/placement_server.py).  Not a test: the
figures depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# bench/ holds other benchmarks (bench/engine.py): never let them shadow packages
sys.path[:] = [ROOT] + [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import requests  # noqa: E402

from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.placement import open_placement  # noqa: E402
from engine.placement.model import normalize_inventories  # noqa: E402
from engine.core.store import Put, Store  # noqa: E402
from tests.support.placement_server import HEADERS, PlacementServer, placement_installed  # noqa: E402

CLAIMER = os.path.join(ROOT, "tests", "placement_claimer.py")
QUERY = "VCPU:1,MEMORY_MB:256,DISK_GB:1"


def inventory(vcpus: int) -> dict:
    return {"VCPU": {"total": vcpus}, "MEMORY_MB": {"total": 65536}, "DISK_GB": {"total": 1000}}


def fill_etcd(store: Store, count: int, vcpus: int) -> None:
    """Providers written straight in the etcd backend's layout (setup, not measured)."""
    for i in range(count):
        u = str(uuid.uuid4())
        doc = {"uuid": u, "name": f"cn{i:04d}", "parent": None, "root": u, "generation": 1,
               "inventories": normalize_inventories(inventory(vcpus)), "usages": {},
               "traits": [], "aggregates": []}
        store.txn([], [Put("placement/rp/" + u, doc), Put("placement/name/" + doc["name"], u)])


def fill_openstack(url: str, count: int, vcpus: int) -> None:
    s = requests.Session()
    s.headers.update(HEADERS)
    for i in range(count):
        rp = s.post(url + "/resource_providers", json={"name": f"cn{i:04d}"})
        rp.raise_for_status()
        s.put(f"{url}/resource_providers/{rp.json()['uuid']}/inventories",
              json={"resource_provider_generation": 0,
                    "inventories": inventory(vcpus)}).raise_for_status()
    s.close()


def race(backend: str, claimers: int, workdir: str) -> dict:
    go = os.path.join(workdir, f"go-{uuid.uuid4().hex[:6]}")
    procs = [subprocess.Popen([sys.executable, CLAIMER, backend, "VCPU:1", "until-refused", go],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(claimers)]
    deadline = time.monotonic() + 60
    while len([f for f in os.listdir(workdir) if f.startswith(os.path.basename(go) + ".ready")]) < claimers:
        if time.monotonic() > deadline:
            raise TimeoutError("claimers did not start")
        time.sleep(0.01)
    open(go, "w").close()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode:
            raise RuntimeError(err[-2000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    granted = sum(len(r["claimed"]) for r in results)
    wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {"granted": granted, "seconds": wall, "claims_per_s": granted / wall,
            "capacity_exceeded": sum(r["capacity_exceeded"] for r in results),
            "concurrent_update": sum(r["concurrent_update"] for r in results),
            "races_lost": sum(r.get("races_lost", 0) for r in results),
            "winners": sum(1 for r in results if r["claimed"])}


def worst_overuse(placement) -> int:
    worst = 0
    for p in placement.providers():
        inv = p["inventories"]["VCPU"]
        cap = int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
        worst = max(worst, p["usages"].get("VCPU", 0) - cap)
    return worst


def latency(placement, samples: int) -> dict:
    placement.candidates(QUERY, limit=20)      # warm caches (names, connections)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        found = placement.candidates(QUERY, limit=20)
        times.append((time.perf_counter() - start) * 1000)
        assert len(found) == 20
    times.sort()
    return {"median_ms": statistics.median(times),
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", type=int, default=100)
    parser.add_argument("--vcpus", type=int, default=8)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--big", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=200,
                        help="candidates queries timed per backend (>= 100 for a p99)")
    parser.add_argument("--no-openstack", action="store_true")
    args = parser.parse_args()
    capacity = args.providers * args.vcpus
    print("python bench/placement.py " + " ".join(sys.argv[1:]), file=sys.stderr)
    workdir = tempfile.mkdtemp(prefix="placement-bench-")
    etcd = EtcdServer(os.path.join(workdir, "etcd")).start()
    server = None
    results = {}
    try:
        # -- etcd ----------------------------------------------------------------
        store = Store(etcd.url, "race")
        fill_etcd(store, args.providers, args.vcpus)
        print(f"etcd: {args.claimers} claimers on {args.providers} providers ...", file=sys.stderr)
        r = race(f"etcd:{etcd.url}:race", args.claimers, workdir)
        r["overuse"] = worst_overuse(open_placement("etcd", store))
        big = Store(etcd.url, "big")
        fill_etcd(big, args.big, args.vcpus)
        r.update(latency(open_placement("etcd", big), args.samples))
        results["etcd"] = r
        # -- OpenStack Placement ----------------------------------------------
        if not args.no_openstack:
            if not placement_installed():
                print("openstack-placement not installed: pip install -r "
                      "requirements-placement.txt", file=sys.stderr)
            else:
                server = PlacementServer(os.path.join(workdir, "placement")).start()
                fill_openstack(server.url, args.providers, args.vcpus)
                print(f"openstack: {args.claimers} claimers on {args.providers} providers ...",
                      file=sys.stderr)
                r = race(server.url, args.claimers, workdir)
                rest = open_placement(server.url)
                r["overuse"] = worst_overuse(rest)
                server.wipe()
                print(f"openstack: {args.big} providers ...", file=sys.stderr)
                fill_openstack(server.url, args.big, args.vcpus)
                r.update(latency(rest, args.samples))
                results["openstack"] = r
    finally:
        if server:
            server.stop()
        etcd.stop()

    rows = [("claims/s (%d claimers, %d providers)" % (args.claimers, args.providers),
             "claims_per_s", "%.0f"),
            ("claims granted (capacity %d)" % capacity, "granted", "%d"),
            ("overcommit: granted - capacity", None, None),
            ("overcommit: worst provider over capacity", "overuse", "%d"),
            ("capacity_exceeded conflicts seen", "capacity_exceeded", "%d"),
            ("claimers that won claims", "winners", "%d"),
            ("writes lost to a racer and redone (races_lost)", "races_lost", "%d"),
            ("concurrent_update after retries", "concurrent_update", "%d"),
            ("candidates median ms (%d providers, limit 20)" % args.big, "median_ms", "%.1f"),
            ("candidates p99 ms (%d samples)" % args.samples, "p99_ms", "%.1f")]
    names = list(results)
    print(f"{'':50}" + "".join(f"{n:>14}" for n in names))
    for label, key, fmt in rows:
        cells = []
        for n in names:
            value = results[n]["granted"] - capacity if key is None else results[n][key]
            cells.append(f"{(fmt or '%d') % value:>14}")
        print(f"{label:50}" + "".join(cells))
    if len(names) == 2:
        print(f"{'claims/s ratio etcd / openstack':50}"
              f"{results['etcd']['claims_per_s'] / results['openstack']['claims_per_s']:>14.1f}")
    print("targets:")
    if len(names) == 2:
        ratio = results["etcd"]["claims_per_s"] / results["openstack"]["claims_per_s"]
        print(f"  {'PASS' if ratio >= 10 else 'MISS'}  etcd claims/s >= 10x Placement's "
              f"({ratio:.1f}x)")
    else:
        print("  ----  etcd claims/s >= 10x Placement's (Placement not run)")
    for n in names:
        over = max(results[n]["granted"] - capacity, results[n]["overuse"])
        print(f"  {'PASS' if over <= 0 else 'MISS'}  zero overcommit on {n} "
              f"(granted {results[n]['granted']} of {capacity}, worst provider "
              f"{results[n]['overuse']:+d})")
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
