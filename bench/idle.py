"""Idle benchmark: what a peer costs while nothing happens, on the test
driver, beside a bare etcd watch client.

    python bench/idle.py [--sizes 0,200] [--window 60] [--repeats 3] [--smoke]

In one run, against its own etcd on loopback: one real peer (``i1``, the
default TTL of 5 s, the default settings otherwise: no API) on a big test
host file (256 CPUs, 64 GiB), alone, so it holds every cluster singleton
(janitor, reconciler, recoverer, lease guard, balancer, compactor): the
dearest peer of a cluster.  Beside it the reference, a bare etcd
watch client: a small Python process that opens
:class:`engine.core.store.Store` and watches the cluster's whole prefix,
the least any peer must pay to stay informed.  For each N of ``--sizes``,
in increasing order: the VMs missing to make N are booted onto ``i1``
through a ``boot`` automation (each 1 VCPU, 32 MiB, a 1 GiB disk), the run
waits until the peer has published them all, lets it settle, then measures
both processes over the same ``--window``, ``--repeats`` times in a row
(each CPU figure is the median of those windows, all of them printed: one
window on a shared 2-CPU machine moves by 0.1 % of one CPU, the bare watch
as much as the peer):

- CPU: user and system time of the process and of its children (alive,
  and reaped during the window), per minute of wall time, as % of one CPU;
- memory: the largest resident set (RSS) sampled once a second over the
  window, and the unique set (USS, what ending the process would free) at
  its end, of the process and its children, in MiB.

Beside them, over the same window, etcd's own CPU, the requests per
second it served (ranges, transactions: what the idle peer keeps asking)
and the revisions the cluster wrote (what it keeps writing).

Goal (issue 50): a peer idle at 200 VMs uses at most 0.5 % of one CPU and
100 MiB resident; the verdict judges N=200 (or the largest N run, said so).
The machine's load average is printed before and after: figures from a
loaded machine are not comparable (run it under ``flock /tmp/tier.lock``).

``--smoke``: N=0 and 5, a window of a few seconds: every path, in seconds.
Work under /var/tmp/peerctl-bidle-*, removed at the end with every process
the run started, on error, SIGTERM and Ctrl-C too.  Bad options: one line,
exit 2, nothing started.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

import psutil  # noqa: E402

from bench.options import BadInput, numbers, whole  # noqa: E402
from bench.processes import load_line, start_peer, stop_processes  # noqa: E402
from engine.cluster import ready_hosts  # noqa: E402
from engine.core import api, keys  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.store import Store  # noqa: E402
from engine.core.watch import PrefixWatch, Reset  # noqa: E402
from tests.support import wait_for  # noqa: E402
from tests.support.vms import big_test_host  # noqa: E402

CLUSTER, HOST, TTL = "bidle", "i1", 5
VM = {"VCPU": 1, "MEMORY_MB": 32, "DISK_GB": 1}
GOAL_N, GOAL_CPU_PCT, GOAL_RSS_MIB = 200, 0.5, 100.0
SETTLE = 10.0           # seconds between the last VM published and the window
SMOKE = {"sizes": [0, 5], "window": 3, "settle": 1.0}
WORK = "peerctl-bidle-"
MiB = 1 << 20
BARE_WATCH = """
import sys
sys.path.insert(0, {root!r})
from engine.core.store import Store
store = Store({url!r}, {cluster!r})
stream = store.watch_stream("", store.revision() + 1)
print("watching", flush=True)
for events in stream:   # decoded as a peer's watch decodes them, then dropped
    pass
"""


class Gauge:
    """CPU and memory of one process and its children, read with psutil."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)

    def _tree(self) -> list:
        try:
            return [self.process, *self.process.children(recursive=True)]
        except psutil.NoSuchProcess:
            raise SystemExit(f"bench/idle.py: process {self.process.pid} is gone") from None

    def cpu_seconds(self) -> float:
        """User and system CPU so far, children included: those alive, and
        those reaped (counted in their parent's ``children_*``)."""
        total = 0.0
        for process in self._tree():
            try:
                t = process.cpu_times()
            except psutil.NoSuchProcess:
                continue            # a child that ended: its parent now counts it
            total += t.user + t.system + t.children_user + t.children_system
        return total

    def rss(self) -> int:
        return sum(_quietly(lambda p: p.memory_info().rss, p) for p in self._tree())

    def uss(self) -> int | None:
        try:
            return sum(_quietly(lambda p: p.memory_full_info().uss, p) for p in self._tree())
        except (psutil.AccessDenied, AttributeError):
            return None


def _quietly(read, process) -> int:
    try:
        return read(process)
    except psutil.NoSuchProcess:
        return 0


def etcd_requests(url: str) -> float:
    """The unary requests etcd has served (its ``/metrics``): ranges,
    transactions, lease grants...; not the watch and keep-alive streams."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(float(count) for count in re.findall(
        r'^grpc_server_handled_total\{[^}]*grpc_type="unary"[^}]*\} (\S+)$', text, re.M))


def measure(gauges: dict[str, Gauge], store: Store, etcd_url: str, window: float) -> dict:
    """Every gauge over the same ``window`` seconds: ``{name: {cpu_pct,
    rss, uss}}``, the revisions etcd wrote meanwhile (``writes``) and the
    requests it served per second (``requests``)."""
    requests = etcd_requests(etcd_url)
    revision = store.revision()
    started = time.monotonic()
    cpu = {name: gauge.cpu_seconds() for name, gauge in gauges.items()}
    peak = {name: 0 for name in gauges}
    deadline = started + window
    while True:
        for name, gauge in gauges.items():
            peak[name] = max(peak[name], gauge.rss())
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(1.0, left))
    wall = time.monotonic() - started
    figures = {name: {"cpu_pct": 100 * (gauge.cpu_seconds() - cpu[name]) / wall,
                      "rss": peak[name], "uss": gauge.uss()}
               for name, gauge in gauges.items()}
    figures["writes"] = store.revision() - revision
    figures["requests"] = (etcd_requests(etcd_url) - requests) / wall
    figures["wall"] = wall
    return figures


def boot(store: Store, names: list[str]) -> float:
    """Boot ``names`` onto the host through one ``boot`` automation, seen
    to its end through a watch; its seconds.  One that does not end
    ``done`` stops the benchmark, saying why."""
    before = store.revision()
    started = time.monotonic()
    automation_id = api.start_automation(store, "boot", {"vms": [
        {"name": name, "resources": VM, "on": HOST} for name in names]})
    watch = PrefixWatch(store, keys.status(automation_id), before, exact=True).start()
    try:
        status = None
        while status is None:
            batch = watch.get(timeout=600)
            if batch is None:
                raise SystemExit("bench/idle.py: the boot did not end within 600 s")
            kvs = batch.kvs if isinstance(batch, Reset) else \
                [event.kv for event in batch if event.kind == "put"]
            status = next((kv.value for kv in kvs
                           if kv.value.get("state") in keys.TERMINAL_STATES), None)
    finally:
        watch.stop()
    if status["state"] != "done" or any(v.get("error") for v in status["result"]["vms"]):
        raise SystemExit(f"bench/idle.py: the boot of {len(names)} VMs ended "
                         f"{status['state']}: {status.get('error')}")
    return time.monotonic() - started


def published(store: Store) -> int:
    return len(store.range(keys.vm(HOST, ""), keys_only=True)[0])


def start_bare_watch(work: str, url: str) -> subprocess.Popen:
    """The reference, once it has opened its watch."""
    log = os.path.join(work, "bare-watch.log")
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", BARE_WATCH.format(root=ROOT, url=url, cluster=CLUSTER)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    wait_for(lambda: "watching" in pathlib.Path(log).read_text() or process.poll() is not None,
             timeout=60, what="the bare watch client to open its watch")
    if process.poll() is not None:
        raise SystemExit(f"bench/idle.py: the bare watch client exited: "
                         f"{pathlib.Path(log).read_text()[-800:]}")
    return process


def one_size(n: int, booted: int, store: Store, etcd_url: str, gauges: dict,
             window: float, settle: float, repeats: int) -> dict:
    """Boot what ``n`` needs beyond the ``booted`` VMs, let the peer settle,
    measure ``repeats`` windows in a row: each CPU figure is their median
    (``cpu_runs`` keeps them all), memory the largest."""
    boot_s = boot(store, [f"idle-vm{i:04d}" for i in range(booted, n)]) if n > booted else 0.0
    wait_for(lambda: published(store) == n, timeout=300,
             what=f"the peer to publish its {n} VMs")
    time.sleep(settle)      # what a boot leaves (publication, accounting) is not idle
    runs = [measure(gauges, store, etcd_url, window) for _ in range(repeats)]
    row = {"n": n, "boot_s": boot_s, "repeats": repeats,
           "writes": sum(r["writes"] for r in runs), "wall": sum(r["wall"] for r in runs),
           "requests": statistics.median(r["requests"] for r in runs)}
    for name in gauges:
        row[name] = {"cpu_pct": statistics.median(r[name]["cpu_pct"] for r in runs),
                     "cpu_runs": [r[name]["cpu_pct"] for r in runs],
                     "rss": max(r[name]["rss"] for r in runs), "uss": runs[-1][name]["uss"]}
    return row


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:.1f}"


def report(rows: list[dict], window: float, settle: float) -> None:
    for r in rows:
        peer, bare = r["peer"], r["bare watch"]
        booted = f", booted in {r['boot_s']:.1f} s" if r["boot_s"] else ""
        windows = f"{r['repeats']} window{'s' if r['repeats'] > 1 else ''}"
        print(f"\nN={r['n']} VMs on {HOST}{booted}: idle over {r['wall']:.1f} s "
              f"({windows}), {settle:g} s after the last VM was published")
        print(f"  {'':<24} {'peer':>10} {'bare watch':>11}")
        print(f"  {'CPU, % of one CPU':<24} {peer['cpu_pct']:10.3f} {bare['cpu_pct']:11.3f}")
        print(f"  {'CPU s per minute':<24} {peer['cpu_pct'] * 0.6:10.3f} "
              f"{bare['cpu_pct'] * 0.6:11.3f}")
        print(f"  {'RSS MiB (peak)':<24} {mib(peer['rss']):>10} {mib(bare['rss']):>11}")
        print(f"  {'USS MiB (at the end)':<24} {mib(peer['uss']):>10} {mib(bare['uss']):>11}")
        print(f"  CPU in each window, % of one CPU (the median above): peer "
              f"{', '.join(f'{c:.3f}' for c in peer['cpu_runs'])}; bare watch "
              f"{', '.join(f'{c:.3f}' for c in bare['cpu_runs'])}")
        print(f"  beside: etcd {r['etcd']['cpu_pct']:.3f} % of one CPU, serving "
              f"{r['requests']:.1f} requests/s; {r['writes']} revisions written in the "
              f"{windows.split(' ', 1)[1]}")
    print("\n(CPU: user + system of the process and its children over the window; the bare "
          "watch: one Store,\n one watch on the cluster's whole prefix, every event decoded)")
    judged = [r for r in rows if r["n"] == GOAL_N] or rows[-1:]
    print(f"\ngoal (issue 50): a peer idle at N={GOAL_N} VMs uses <= {GOAL_CPU_PCT} % of one "
          f"CPU and <= {GOAL_RSS_MIB:.0f} MiB resident")
    for r in judged:
        peer, bare = r["peer"], r["bare watch"]
        small = "" if r["n"] == GOAL_N else f" (N={r['n']}, not {GOAL_N})"
        print(f"  N={r['n']}: CPU {peer['cpu_pct']:.3f} % of one CPU (bare watch "
              f"{bare['cpu_pct']:.3f} %){small}: "
              f"{'PASS' if peer['cpu_pct'] <= GOAL_CPU_PCT else 'MISS'}")
        print(f"  N={r['n']}: RSS {mib(peer['rss'])} MiB (bare watch {mib(bare['rss'])} "
              f"MiB){small}: {'PASS' if peer['rss'] / MiB <= GOAL_RSS_MIB else 'MISS'}")


def main() -> int:
    parser = BadInput(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=numbers(0, 1000, "VM counts"), default=[0, GOAL_N],
                        metavar="N,N", help=f"VMs on the peer, one window each "
                                            f"(default 0,{GOAL_N})")
    parser.add_argument("--window", type=whole(1, 3600, "seconds"), default=60,
                        metavar="SECONDS", help="how long each size is measured (default 60)")
    parser.add_argument("--repeats", type=whole(1, 20, "windows"), default=3,
                        metavar="K", help="windows in a row per size; each CPU figure is "
                                          "their median (default 3)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"N={','.join(map(str, SMOKE['sizes']))}, a {SMOKE['window']} s "
                             "window: every path, in seconds")
    args = parser.parse_args()
    sizes = SMOKE["sizes"] if args.smoke else sorted(set(args.sizes))
    window = SMOKE["window"] if args.smoke else args.window
    settle = SMOKE["settle"] if args.smoke else SETTLE
    repeats = 1 if args.smoke else args.repeats
    # SIGTERM ends the run as Ctrl-C does: through the cleanup.
    signal.signal(signal.SIGTERM, lambda _signo, _frame: sys.exit(
        "bench/idle.py: terminated (everything it started is gone)"))
    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    etcd = store = None
    started: list[subprocess.Popen] = []
    try:
        etcd = EtcdServer(os.path.join(work, "etcd")).start()
        store = Store(etcd.url, CLUSTER)
        started.append(start_bare_watch(work, etcd.url))
        uri = big_test_host(pathlib.Path(work) / f"{HOST}.xml", cpus=256, memory_gib=64)
        started.append(start_peer(etcd.url, CLUSTER, work, HOST, uri, ttl=TTL,
                                  env={"PEERCTL_CONF": os.devnull}))
        wait_for(lambda: ready_hosts(store, [HOST]) == {HOST} or started[-1].poll() is not None,
                 timeout=120, what="the peer alive with its inventory")
        if started[-1].poll() is not None:
            raise SystemExit(f"bench/idle.py: the peer exited: "
                             f"{pathlib.Path(work, HOST + '.log').read_text()[-800:]}")
        gauges = {"peer": Gauge(started[1].pid), "bare watch": Gauge(started[0].pid),
                  "etcd": Gauge(etcd.process.pid)}
        rows, booted = [], 0
        for n in sizes:
            rows.append(one_size(n, booted, store, etcd.url, gauges, window, settle, repeats))
            booted = n
            print(f"N={n}: peer {rows[-1]['peer']['cpu_pct']:.3f} % of one CPU, "
                  f"{mib(rows[-1]['peer']['rss'])} MiB", flush=True)
        report(rows, window, settle)
    except KeyboardInterrupt:
        raise SystemExit("bench/idle.py: interrupted (everything it started is gone)") from None
    except AssertionError as exc:       # a wait timed out: the run stops
        raise SystemExit(f"bench/idle.py: {exc}") from None
    finally:
        stop_processes(started)
        if store is not None:
            store.close()
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + load_line(load_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
