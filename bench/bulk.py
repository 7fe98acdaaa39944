"""Bulk benchmark: boot, then destroy, N VMs across P peers on libvirt's test driver.

    python bench/bulk.py [--peers 20] [--sizes 10,100,1000] [--busy 1] [--smoke]
    python bench/bulk.py --sizes 100,1000,5000

One automation boots all N VMs (placement claim + build per VM, in
parallel), then one automation destroys them all (destroy + release).
Prints VMs/s for each N, the cost per VM, to show how it grows with N, and
the CPU the peers and etcd used per VM booted (a figure the machine's load
changes less than the time); then each target with PASS/MISS: issue 4,
1,000 VMs booted in 20 s or less; issue 34, at least 250 VMs/s booted at
N=1,000 (issue 15 asked 200); cost linear in N (ms/VM at the largest N
within 1.5x of the smallest N of 100 or more, else of the smallest N).
``--busy K`` runs K CPU-bound processes beside the peers for the whole run
(issue 34: a figure must pass on a loaded machine).  The machine's load
average is printed before and after.

``--smoke``: 3 peers, N=10 then 50: every path in a few seconds.
Everything it starts (etcd, the peers, the busy processes, its work
directory under /var/tmp) is stopped or removed at the end, on error too;
the processes it ends are its own, by PID.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

from bench.options import BadInput, numbers, whole  # noqa: E402
from bench.processes import cpu_seconds, load_line, stop_processes  # noqa: E402
from engine.core import api, keys  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.store import Store  # noqa: E402

VM = {"VCPU": 1, "MEMORY_MB": 32, "DISK_GB": 1}
TARGET_N, TARGET_S = 1000, 20.0         # issue 4
TARGET_RATE = 250.0                     # issue 34: VMs/s booted at N = TARGET_N (issue 15: 200)
LINEAR_SLACK = 1.5      # ms/VM at the largest N over ms/VM at the base N
LINEAR_BASE = 100       # the base N: the smallest N of at least this, else the smallest
WORK = "peerctl-bbulk-"                 # the work directory's prefix, under /var/tmp
SMOKE = {"peers": 3, "sizes": [10, 50]}
BUSY = [sys.executable, "-c", "while 1: pass"]


def wait(predicate, timeout=120.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError


peers_count = whole(1, 50, "peers")


busy_count = whole(0, 16, "busy processes")


ttl_seconds = whole(2, 30, "a TTL in seconds")


sizes = numbers(1, 20000, "VM counts")


def run(store, kind, args):
    started = time.perf_counter()
    automation_id = api.start_automation(store, kind, args)
    status = wait(lambda: (lambda s: s if s and s["state"] in keys.TERMINAL_STATES else None)(
        store.get(keys.status(automation_id)).value), timeout=1800)
    elapsed = time.perf_counter() - started
    if status["state"] != "done":
        raise SystemExit(f"bench/bulk.py: {kind} ended {status['state']}: {status.get('error')}")
    return elapsed, status["result"]


def _verdict(met: bool) -> str:
    return "PASS" if met else "MISS"


def make_room(store, n: int, peers: int) -> None:
    """Raise the allocation ratio of every host's inventories so that each
    fits its share of ``n`` VMs with room to spare (the test driver's host
    has 16 CPUs: 1,280 one-VCPU VMs at the default ratio of 4 over 20
    hosts).  A ratio an operator set is kept when a peer registers again."""
    from engine.placement import open_placement
    placement = open_placement("etcd", store)
    share = 2 * n // peers + 1
    for provider in placement.providers():
        inventories = {}
        for rc, inv in provider["inventories"].items():
            need = share * VM.get(rc, 0)
            ratio = max(inv["allocation_ratio"],
                        need / max(1, inv["total"] - inv["reserved"]))
            inventories[rc] = {**inv, "allocation_ratio": ratio}
        if inventories != provider["inventories"]:
            placement.set_inventory(provider["uuid"], inventories)


def start_peers(etcd_url: str, work: str, count: int, ttl: int) -> list[subprocess.Popen]:
    peers = []
    for i in range(count):
        host = f"host{i:02d}"
        log = open(os.path.join(work, f"{host}.log"), "ab")
        peers.append(subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "peerctl.py"), "--etcd", etcd_url,
             "--cluster", "bulk", "peer", "--host", host, "--libvirt", "test:///default",
             "--ttl", str(ttl), "--workers", "8", "--state-dir", os.path.join(work, host)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
    return peers


def measure(store, sizes: list[int], pids: list[int]) -> list[tuple]:
    """``(N, boot s, destroy s, hosts used, CPU s of the boot)`` for each
    N; the CPU is that of ``pids`` (the peers and etcd) while it booted:
    a figure the machine's load changes less than the time."""
    rows = []
    for n in sizes:
        names = [f"n{n}-vm{i:04d}" for i in range(n)]
        cpu = cpu_seconds(pids)
        boot_time, result = run(store, "boot", {"vms": [{"name": name, "resources": VM}
                                                        for name in names]})
        cpu = cpu_seconds(pids) - cpu
        vms = [{"host": v["host"], "name": v["name"], "uuid": v["uuid"]} for v in result["vms"]]
        spread = len({v["host"] for v in vms})
        destroy_time, _ = run(store, "destroy", {"vms": vms})
        rows.append((n, boot_time, destroy_time, spread, cpu))
        print(f"N={n}: boot {boot_time:.2f}s, destroy {destroy_time:.2f}s", flush=True)
    return rows


def report(rows, peers: int, busy: int) -> None:
    print(f"\npeerctl bulk benchmark: {peers} peers on test:///default, one automation per "
          f"action, {busy} CPU-bound process(es) beside\n")
    print(f"{'N':>6} {'boot s':>8} {'boot VMs/s':>11} {'ms/VM':>7} {'CPU ms/VM':>10} "
          f"{'hosts':>6} {'destroy s':>10} {'destroy VMs/s':>14}")
    for n, boot_time, destroy_time, spread, cpu in rows:
        print(f"{n:>6} {boot_time:8.2f} {n / boot_time:11.1f} {1000 * boot_time / n:7.2f} "
              f"{1000 * cpu / n:10.2f} {spread:>6} {destroy_time:10.2f} {n / destroy_time:14.1f}")
    print("\ntargets:")
    # Judged at N=1,000, or at the largest N when that was not run; a
    # smaller N prints its figures unjudged (start-up costs weigh on it).
    n, boot_time = next(((row[0], row[1]) for row in rows if row[0] == TARGET_N),
                        max((row[0], row[1]) for row in rows))
    judged = n >= TARGET_N
    unjudged = f"not judged (N < {TARGET_N:,})"
    print(f"  issue 34: N={n:,} booted at {n / boot_time:.1f} VMs/s (target >= "
          f"{TARGET_RATE:.0f} VMs/s at N={TARGET_N:,}): "
          f"{_verdict(n / boot_time >= TARGET_RATE) if judged else unjudged}")
    print(f"  issue 4: N={n:,} booted in {boot_time:.2f} s (target N={TARGET_N:,} in <= "
          f"{TARGET_S:.0f} s): "
          f"{_verdict(boot_time * TARGET_N / n <= TARGET_S) if judged else unjudged}")
    by_n = sorted((row[0], row[1] / row[0]) for row in rows)
    if len(by_n) >= 2:
        base = next(((n, c) for n, c in by_n if n >= LINEAR_BASE), by_n[0])
        if base == by_n[-1]:
            base = by_n[0]
        (n0, c0), (n1, c1) = base, by_n[-1]
        print(f"  linear: {1000 * c1:.2f} ms/VM at N={n1:,} vs {1000 * c0:.2f} at N={n0:,} "
              f"(target <= x{LINEAR_SLACK}): {_verdict(c1 <= LINEAR_SLACK * c0)}")
    else:
        print("  linear: one N only (--sizes): not judged")


def bench(peers_count: int, sizes: list[int], ttl: int, busy: int) -> None:
    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    processes: list[subprocess.Popen] = []
    etcd = None
    try:
        processes += [subprocess.Popen(BUSY, stdout=subprocess.DEVNULL, cwd=work)
                      for _ in range(busy)]
        etcd = EtcdServer(os.path.join(work, "etcd")).start()
        store = Store(etcd.url, "bulk")
        processes += start_peers(etcd.url, work, peers_count, ttl)
        wait(lambda: len(api.live_hosts(store)) == peers_count, timeout=120)
        wait(lambda: len(store.range("placement/rp/", keys_only=True)[0]) >= peers_count)
        make_room(store, max(sizes), peers_count)
        rows = measure(store, sizes, [p.pid for p in processes[busy:]] + [etcd.process.pid])
        report(rows, peers_count, busy)
        print("\n" + load_line(load_before))
    finally:
        stop_processes(processes)
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = BadInput(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=peers_count, default=20, metavar="P")
    parser.add_argument("--sizes", type=sizes, default=[10, 100, 1000], metavar="N,N",
                        help="VM counts, one boot and one destroy each (default 10,100,1000)")
    parser.add_argument("--ttl", type=ttl_seconds, default=5, metavar="SECONDS",
                        help="the peers' lease TTL, 2 to 30 (default 5)")
    parser.add_argument("--busy", type=busy_count, default=0, metavar="K",
                        help="CPU-bound processes running beside (default 0)")
    parser.add_argument("--smoke", action="store_true", help="3 peers, N=10 then 50")
    options = parser.parse_args()
    peers, counts = ((SMOKE["peers"], SMOKE["sizes"]) if options.smoke
                     else (options.peers, options.sizes))
    # SIGTERM ends the run as Ctrl-C does: through the cleanup.
    signal.signal(signal.SIGTERM, lambda _signo, _frame: sys.exit(
        "bench/bulk.py: terminated (everything it started is gone)"))
    started = time.monotonic()
    try:
        bench(peers, counts, options.ttl, options.busy)
    except KeyboardInterrupt:
        raise SystemExit("bench/bulk.py: interrupted (everything it started is gone)") from None
    except TimeoutError:
        raise SystemExit("bench/bulk.py: timed out waiting for the peers or an automation") from None
    print(f"ran {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
