"""Placement benchmark: the etcd backend against a real OpenStack Placement.

    python bench/placement.py [--providers 100] [--vcpus 8] [--claimers 8]
                              [--big 1000] [--samples 200] [--no-openstack]
                              [--no-postgres]

Backends, in one run: peerctl's etcd backend; OpenStack Placement on sqlite
behind a single-threaded server (the reference of the claims/s target);
OpenStack Placement on PostgreSQL behind a threaded server, its production
setting (needs ``apt-get install -y postgresql``; skipped with a note when
missing).  For each backend:
- claims/s: ``--claimers`` processes, each taking the best candidate for
  VCPU:1 and claiming it for a new consumer (alternates on
  capacity_exceeded) until nothing fits, on ``--providers`` providers of
  ``--vcpus`` VCPU; claims/s = claims granted / wall time from the common
  start to the last claimer's end;
- overcommit: claims granted beyond capacity, and the worst provider's usage
  beyond its capacity, read back after the race;
- candidates latency (median, p99) for VCPU:1,MEMORY_MB:256,DISK_GB:1 with
  limit 20 at ``--big`` providers, ``--samples`` queries per backend.

The table ends with the targets of issue 15 marked PASS or MISS: etcd
claims/s at least 25x Placement's on sqlite with zero overcommit, and etcd
candidates at most 5 ms median and 15 ms p99.  Placement on PostgreSQL has no
target: its claims/s and its overcommit are reported beside the others.  The
machine's load average is printed before and after.

Starts its own etcd (engine.core.etcd_server), its own Placement
(tests/support/placement_server.py) and its own PostgreSQL
(tests/support/postgres_server.py), all on loopback.  Not a test: the
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
from tests.support.postgres_server import PostgresServer, postgres_bin  # noqa: E402

CLAIMS_TARGET = 25          # etcd claims/s >= 25x Placement's (sqlite)
MEDIAN_TARGET_MS = 5.0      # candidates at --big providers, limit 20
P99_TARGET_MS = 15.0

CLAIMER = os.path.join(ROOT, "tests", "support", "placement_claimer.py")
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


def openstack_run(args, workdir: str, name: str, **server_args) -> dict:
    """Race and latency on one Placement server (wiped in between)."""
    server = PlacementServer(os.path.join(workdir, name), **server_args).start()
    try:
        fill_openstack(server.url, args.providers, args.vcpus)
        print(f"{name}: {args.claimers} claimers on {args.providers} providers ...",
              file=sys.stderr)
        r = race(server.url, args.claimers, workdir)
        rest = open_placement(server.url)
        r["overuse"] = worst_overuse(rest)
        server.wipe()
        print(f"{name}: {args.big} providers ...", file=sys.stderr)
        fill_openstack(server.url, args.big, args.vcpus)
        r.update(latency(rest, args.samples))
        return r
    finally:
        server.stop()


def load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", type=int, default=100)
    parser.add_argument("--vcpus", type=int, default=8)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--big", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=200,
                        help="candidates queries timed per backend (>= 100 for a p99)")
    parser.add_argument("--no-openstack", action="store_true", help="etcd only")
    parser.add_argument("--no-postgres", action="store_true",
                        help="no Placement on PostgreSQL")
    args = parser.parse_args()
    capacity = args.providers * args.vcpus
    print("python bench/placement.py " + " ".join(sys.argv[1:]), file=sys.stderr)
    before = load()
    workdir = tempfile.mkdtemp(prefix="placement-bench-")
    etcd = EtcdServer(os.path.join(workdir, "etcd")).start()
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
    finally:
        etcd.stop()
    # -- OpenStack Placement ----------------------------------------------------------
    if not args.no_openstack:
        if not placement_installed():
            print("openstack-placement not installed: pip install -r "
                  "requirements-placement.txt", file=sys.stderr)
        else:
            results["sqlite"] = openstack_run(args, workdir, "sqlite")
            if args.no_postgres:
                pass
            elif postgres_bin() is None:
                print("PostgreSQL not installed (apt-get install -y postgresql): "
                      "Placement on PostgreSQL skipped", file=sys.stderr)
            else:
                pg = PostgresServer(tempfile.mkdtemp(prefix="placement-bench-pg-")).start()
                try:
                    results["postgres"] = openstack_run(
                        args, workdir, "postgres", database=pg.create_database("placement"),
                        threaded=True)
                finally:
                    pg.stop()
    after = load()

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
    heads = {"etcd": "etcd", "sqlite": "Placement/sqlite", "postgres": "Placement/pg"}
    print(f"{'':50}" + "".join(f"{heads[n]:>18}" for n in names))
    for label, key, fmt in rows:
        cells = []
        for n in names:
            value = results[n]["granted"] - capacity if key is None else results[n][key]
            cells.append(f"{(fmt or '%d') % value:>18}")
        print(f"{label:50}" + "".join(cells))
    for n in names[1:]:
        print(f"{'claims/s ratio etcd / ' + heads[n]:50}"
              f"{results['etcd']['claims_per_s'] / results[n]['claims_per_s']:>18.1f}")
    print(f"machine: before {before}; after {after}")
    print("targets:")
    etcd_r = results["etcd"]
    if "sqlite" in results:
        ratio = etcd_r["claims_per_s"] / results["sqlite"]["claims_per_s"]
        print(f"  {'PASS' if ratio >= CLAIMS_TARGET else 'MISS'}  etcd claims/s >= "
              f"{CLAIMS_TARGET}x Placement's on sqlite ({ratio:.1f}x: "
              f"{etcd_r['claims_per_s']:.0f} vs {results['sqlite']['claims_per_s']:.1f}/s)")
    else:
        print(f"  ----  etcd claims/s >= {CLAIMS_TARGET}x Placement's (Placement not run)")
    print(f"  {'PASS' if etcd_r['median_ms'] <= MEDIAN_TARGET_MS else 'MISS'}  etcd candidates "
          f"median <= {MEDIAN_TARGET_MS:.0f} ms at {args.big} providers "
          f"({etcd_r['median_ms']:.1f} ms)")
    print(f"  {'PASS' if etcd_r['p99_ms'] <= P99_TARGET_MS else 'MISS'}  etcd candidates "
          f"p99 <= {P99_TARGET_MS:.0f} ms ({etcd_r['p99_ms']:.1f} ms)")
    for n in names:
        over = max(results[n]["granted"] - capacity, results[n]["overuse"])
        verdict = ("PASS" if over <= 0 else "MISS") if n != "postgres" else "info"
        print(f"  {verdict}  zero overcommit on {heads[n]} "
              f"(granted {results[n]['granted']} of {capacity}, worst provider "
              f"{results[n]['overuse']:+d})")
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
