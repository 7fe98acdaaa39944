"""Scale benchmark: etcd's load as hosts grow, and what 1,000 hosts and
50,000 VMs would need.

    python bench/scale.py [--hosts 50,100,200,400] [--vms-per-host 50]
                          [--per-process 25] [--window 65] [--writes 65] [--smoke]

Part 1, light peers.  An etcd of its own, one real peer (``real1``, test
driver) that runs the automations, and light peers added step by step, many
per process: each opens its own client and etcd session (lease kept alive
every TTL/3), writes its host record and host config, registers its
placement provider, publishes ``--vms-per-host`` VM records, stands in the
elections of the cluster singletons, watches its inbox and its duties, and
measures its host record every 5 s, writing it when the real peer's rule
says so (:class:`engine.hypervisor.host.hostinfo.Publication`, the same code).
Its gauges (CPU usage, free memory, network counters) move past their step
on almost every tick: the worst case for that rule.  At each step, over
``--window`` seconds (by default a little more than the rule's
``MOVED_EVERY``, so that each host's write falls in it): keys, revisions
(writes) per second, watchers (etcd's own metrics), bytes per host and per
VM (key + value), the database size, and the latency of ``vmlist`` (a fresh
process, best of 3) and of an automation (``ping`` of real1: start, and
start to done).  The history per hour projected at 1,000 hosts (writes per
second times real1's record size) is printed beside its target, <= 50 MiB/h,
and beside what rewriting every record every 5 s made.

Part 2, write rates of real peers (3 peers on the test driver), over
``--writes`` seconds each: idle with no VM, idle with 30 VMs, and busy
(booting and destroying VMs in a loop): revisions per second per host, per
idle VM, and per VM booted and destroyed, and the history they make; the
idle history by part of the cluster (host records, VM records, providers...),
from a watch of every key.

``--smoke``: one step of 3 light peers with 2 VMs each, 1 s windows, the
real peers idle with 2 VMs and one churn cycle; a few seconds.

Each figure is printed beside the reference it chases, measured in the same
run: a cost per host at the largest step against the same cost at the
smallest step (×1.0 is linear; above ×1.5 is flagged GROWS), and the
projection to 1,000 hosts and 50,000 VMs against etcd's limits (2 GiB
default quota, watchers, writes).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

import msgpack  # noqa: E402

from bench.options import BadInput  # noqa: E402
from engine.core import api, keys  # noqa: E402
from engine.core.election import Candidacy  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.session import Session  # noqa: E402
from engine.core.store import Put, Store, StoreUnavailable  # noqa: E402
from engine.core.watch import PrefixWatch, Reset  # noqa: E402
from engine.hypervisor.host.hostinfo import MOVED_EVERY, Publication  # noqa: E402
from engine.peer import STATS_INTERVAL  # noqa: E402

PEERCTL = os.path.join(ROOT, "peerctl.py")
WORK = "peerctl-bscale-"        # the work directory, under /var/tmp
SINGLETONS = ("janitor", "reconciler", "lease-guard", "compactor", "recoverer", "balancer")
TARGET_HOSTS, TARGET_VMS = 1000, 50000
TARGET_HISTORY_MIB = 50.0       # history per hour at TARGET_HOSTS
REVISION_OVERHEAD = 100         # what etcd keeps per revision beside the key and value
SMOKE = {"hosts": [3], "vms_per_host": 2, "per_process": 3, "window": 1.0, "writes": 1.0,
         "idle_vms": 2, "settle": 0.5, "runs": 1}
FULL = {"idle_vms": 30, "settle": STATS_INTERVAL + 1, "runs": 3}


# -- light peers (run in worker processes) ----------------------------------------

def host_record(host: str, vms: int) -> dict:
    return {"host": host, "enabled": True, "vcpus": 64, "cpu_usage": 0.12,
            "memory_mb": 262144, "free_memory_mb": 131072, "disk_gb": 4000,
            "free_disk_gb": 2000, "net_rx_bytes": 123456789, "net_tx_bytes": 98765432,
            "vms": vms, "hypervisor": "QEMU 7.2.0", "kernel": "6.1.0-18-amd64",
            "cpu_model": "AMD EPYC 7543 32-Core Processor", "libvirt_uri": "qemu:///system",
            "provider_uuid": str(uuid.uuid4()), "updated": time.time(), "pid": os.getpid(),
            "networks": ["default"]}


def vm_record(host: str, n: int) -> dict:
    vm_uuid = str(uuid.uuid4())
    return {"host": host, "name": f"{host}-vm{n}", "uuid": vm_uuid, "state": "running",
            "vcpus": 2, "memory_mb": 2048, "disk_gb": 20, "networks": ["default"],
            "addresses": [{"interface": "vnet0", "mac": "52:54:00:12:34:56",
                           "addr": "10.213.0.17", "prefix": 24}], "ip": "10.213.0.17"}


class LightPeer:
    def __init__(self, url: str, cluster: str, host: str, vms: int):
        from engine.placement import open_placement
        from engine.placement.host import register_host
        self.host = host
        self.store = Store(url, cluster)
        self.session = Session(self.store, 5)
        self.record = host_record(host, vms)
        self.store.txn([], [Put(keys.host(host), self.record, self.session.lease),
                            Put(keys.host_config(host), self.record)])
        register_host(open_placement("etcd", self.store), host, self.record)
        records = [vm_record(host, n) for n in range(vms)]
        for i in range(0, len(records), 100):
            self.store.txn([], [Put(keys.vm(host, r["uuid"]), r) for r in records[i:i + 100]])
        revision = self.store.revision()
        self.watches = [PrefixWatch(self.store, keys.inbox(host), revision).start(),
                        PrefixWatch(self.store, keys.member(host), revision).start()]
        # candidates of every singleton; each waits on the one ahead of it
        for name in SINGLETONS:
            candidacy = Candidacy(self.store, self.session, keys.singleton(name), host)
            candidates, revision = candidacy._candidates()
            ahead = [kv for kv in candidates if kv.create_revision < candidacy.revision]
            if ahead:
                self.watches.append(PrefixWatch(self.store, ahead[-1].key, revision,
                                                exact=True).start())

        self.published = Publication()
        self.published.written(self.record, time.monotonic())
        self.ticks = 0

    def measured(self) -> dict:
        """The record as a tick measures it: CPU usage and free memory
        anywhere in their range (past their step almost every time),
        network counters grown by 1 MB/s."""
        self.ticks += 1
        grown = int(self.ticks * STATS_INTERVAL * 1_000_000)
        return {**self.record, "updated": time.time(), "cpu_usage": random.uniform(0, 100),
                "free_memory_mb": int(self.record["memory_mb"] * random.uniform(0.1, 0.9)),
                "net_rx_bytes": self.record["net_rx_bytes"] + grown,
                "net_tx_bytes": self.record["net_tx_bytes"] + grown}

    def tick(self) -> None:
        """What the real peer does on a stats tick, for its host record."""
        record = self.measured()
        if self.published.due(record, time.monotonic()):
            self.store.put(keys.host(self.host), record, self.session.lease)
            self.published.written(record, time.monotonic())


def light_worker(url: str, cluster: str, first: int, count: int, vms: int) -> None:
    import structlog
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())   # quiet
    peers = [LightPeer(url, cluster, f"light{i}", vms) for i in range(first, first + count)]
    print("ready", flush=True)
    offsets = {peer.host: i * STATS_INTERVAL / count for i, peer in enumerate(peers)}
    started = time.monotonic()
    ticks = {peer.host: 0 for peer in peers}
    while True:
        now = time.monotonic() - started
        for peer in peers:
            due = offsets[peer.host] + (ticks[peer.host] + 1) * STATS_INTERVAL
            if now >= due:
                ticks[peer.host] += 1
                try:
                    peer.tick()
                except StoreUnavailable:
                    pass
        time.sleep(0.05)


# -- measuring --------------------------------------------------------------------

def metrics(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    wanted = {"etcd_debugging_mvcc_keys_total": "keys",
              "etcd_debugging_mvcc_watcher_total": "watchers",
              "etcd_debugging_mvcc_watch_stream_total": "watch_streams",
              "etcd_mvcc_db_total_size_in_bytes": "db_bytes",
              "etcd_debugging_mvcc_db_total_size_in_bytes": "db_bytes",
              "etcd_server_proposals_committed_total": "proposals"}
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+)(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if match and match.group(1) in wanted:
            found[wanted[match.group(1)]] = float(match.group(2))
    return found


def sizes(store: Store) -> dict:
    """Bytes (key + msgpack value) under each top-level part of the cluster."""
    kvs, _ = store.range("")
    parts: dict[str, int] = {}
    for kv in kvs:
        part = kv.key.split("/", 1)[0]
        value = msgpack.packb(kv.value, use_bin_type=True)
        parts[part] = parts.get(part, 0) + len(store.prefix) + len(kv.key) + len(value)
    return parts


def best_vmlist(env: dict, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, PEERCTL, "--format", "json", "vmlist"],
                              capture_output=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-500:]
        best = min(best, time.perf_counter() - started)
    return best


def automation_latency(store: Store, runs: int = 3) -> tuple[float, float]:
    """(start, start to done) of a ping of real1, best of ``runs``."""
    best_start, best_done = float("inf"), float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        automation = api.start_automation(store, "ping", {"hosts": ["real1"], "rounds": 1},
                                          members=1, prefer=["real1"])
        best_start = min(best_start, time.perf_counter() - started)
        deadline = time.monotonic() + 60
        while api.get_task(store, automation)["state"] == "running":
            assert time.monotonic() < deadline, "ping did not finish"
            time.sleep(0.005)
        best_done = min(best_done, time.perf_counter() - started)
    return best_start, best_done


def wait_hosts(store: Store, count: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(store.range(keys.host(), keys_only=True)[0]) < count:
        assert time.monotonic() < deadline, f"{count} hosts not registered"
        time.sleep(0.2)


def light_peers(args, etcd, cluster, store, env, workers) -> list[dict]:
    steps = []
    have = 0
    for target in args.hosts:
        while have < target:
            count = min(args.per_process, target - have)
            # the work directory last: a worker left behind is found by it
            worker = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--light-worker", etcd.url, cluster,
                 str(have + 1), str(count), str(args.vms_per_host), args.workdir],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
                start_new_session=True)
            workers.append(worker)
            for line in worker.stdout:      # its log lines, then "ready"
                if line.strip() == "ready":
                    break
            else:
                raise RuntimeError("a light worker exited before it was ready")
            worker.stdout.close()
            have += count
        wait_hosts(store, have + 1)
        time.sleep(args.settle)             # past the light peers' start-up writes
        before, rev0, t0 = metrics(etcd.url), store.revision(), time.monotonic()
        time.sleep(args.window)
        after, rev1, t1 = metrics(etcd.url), store.revision(), time.monotonic()
        parts = sizes(store)
        vms = have * args.vms_per_host
        vm_bytes = parts.get("vms", 0)
        # what hosts keep (the bench's own automations aside)
        host_bytes = sum(size for part, size in parts.items()
                         if part not in ("vms", "auto", "tasks", "member"))
        vmlist = best_vmlist(env, args.runs)
        range_s = min(timed(lambda: store.range(keys.vm())) for _ in range(args.runs))
        start, done = automation_latency(store, args.runs)
        step = {"hosts": have + 1, "vms": vms, "keys": after.get("keys", 0),
                "writes_per_s": (rev1 - rev0) / (t1 - t0),
                "proposals_per_s": (after.get("proposals", 0) - before.get("proposals", 0))
                / (t1 - t0),
                "watchers": after.get("watchers", 0), "db_bytes": after.get("db_bytes", 0),
                "bytes_per_host": host_bytes / (have + 1), "bytes_per_vm": vm_bytes / max(vms, 1),
                "vmlist_s": vmlist, "range_s": range_s, "start_s": start,
                "automation_s": done, "host_record_bytes": record_bytes(store, "real1"),
                "light_record_bytes": record_bytes(store, "light1")}
        steps.append(step)
        print(f"{step['hosts']:>5} hosts {vms:>6} VMs: {step['keys']:>7.0f} keys "
              f"{step['writes_per_s']:>6.1f} writes/s {step['watchers']:>5.0f} watchers "
              f"db {step['db_bytes'] / 2**20:>6.1f} MiB  {step['bytes_per_host']:>5.0f} B/host "
              f"{step['bytes_per_vm']:>4.0f} B/VM  vmlist {vmlist * 1000:>6.0f} ms "
              f"(read {range_s * 1000:.0f} ms)  "
              f"automation start {start * 1000:>5.1f} ms, done {done * 1000:>5.0f} ms",
              flush=True)
    return steps


def record_bytes(store: Store, host: str) -> int:
    """Key and value of ``host``'s record, as etcd keeps them."""
    record = store.get(keys.host(host))
    return len(store.prefix) + len(record.key) + len(msgpack.packb(record.value,
                                                                   use_bin_type=True))


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def verdict(name: str, small: float, large: float, n_small: float, n_large: float) -> str:
    """Cost per unit at the largest step against the smallest: ×1.0 is linear."""
    ratio = (large / n_large) / (small / n_small) if small and n_small else 0.0
    flag = "GROWS" if ratio > 1.5 else "linear"
    return (f"  {name:<30} {small / n_small:>10.4f} per unit at {n_small:>7.1f}  "
            f"{large / n_large:>10.4f} at {n_large:>7.1f}   ×{ratio:.2f} {flag}")


def project(steps: list[dict]) -> None:
    small, large = steps[0], steps[-1]
    print("\nCost per host (reference: the same cost at the smallest step; ×1.0 = linear)")
    for name in ("keys", "writes_per_s", "watchers"):
        print(verdict(name, small[name], large[name], small["hosts"], large["hosts"]))
    print(verdict("vms/ read s per 1,000 VMs", small["range_s"], large["range_s"],
                  small["vms"] / 1000, large["vms"] / 1000))
    print(verdict("automation start s per host", small["start_s"], large["start_s"],
                  small["hosts"], large["hosts"]))
    # per-unit costs of the largest step, scaled to the target (the verdicts
    # above say whether growing linearly holds)
    hosts_factor = TARGET_HOSTS / large["hosts"]
    vms_factor = TARGET_VMS / max(large["vms"], 1)
    vms_bytes = TARGET_VMS * large["bytes_per_vm"]
    host_bytes = TARGET_HOSTS * large["bytes_per_host"]
    writes = large["writes_per_s"] * hosts_factor
    watchers = large["watchers"] * hosts_factor
    read = large["range_s"] * vms_factor
    vmlist = large["vmlist_s"] - large["range_s"] + read
    start = large["start_s"] * hosts_factor
    live = vms_bytes + host_bytes
    # each revision keeps the key and value it wrote (plus etcd's own ~100 B);
    # a real peer's record, not a light one's
    revision_bytes = large["host_record_bytes"] + REVISION_OVERHEAD
    history = writes * 3600 * revision_bytes / 2**20
    every_tick = TARGET_HOSTS / STATS_INTERVAL * 3600 * revision_bytes / 2**20
    print(f"\nProjected for {TARGET_HOSTS} hosts and {TARGET_VMS} VMs "
          f"(from {large['hosts']} hosts, ×{hosts_factor:.1f}):")
    print(f"  live data          {live / 2**20:8.1f} MiB   (reference: etcd quota 2048 MiB)")
    print(f"  writes             {writes:8.0f} /s    (reference: one client's sequential "
          f"transactions here, FACTS: 920-1,390/s)")
    print(f"  history per hour   {history:8.1f} MiB/h projected at {TARGET_HOSTS} hosts "
          f"(target <= {TARGET_HISTORY_MIB:g} MiB/h; reference: every record rewritten every "
          f"{STATS_INTERVAL:g} s, {every_tick:.1f} MiB/h; host records of "
          f"{large['host_record_bytes']} B, light ones {large['light_record_bytes']} B; "
          f"gauges moving every tick): {'PASS' if history <= TARGET_HISTORY_MIB else 'MISS'}")
    print(f"  watchers           {watchers:8.0f}        (reference: etcd handles 100,000s)")
    print(f"  vmlist             {vmlist:8.2f} s      (a fresh process; the range read of "
          f"every VM in it: {read:.2f} s)")
    print(f"  automation start   {start * 1000:8.1f} ms     (at most: it reads the live "
          f"hosts, {large['start_s'] * 1000:.1f} ms at {large['hosts']})")


# -- write rates of real peers -----------------------------------------------------

def by_part(store: Store, first: int, last: int) -> dict[str, list[int]]:
    """``{part: [key versions, bytes]}`` of revisions ``first`` to ``last``
    under the cluster (a part: ``hosts``, ``vms``, ``placement``...)."""
    watch = PrefixWatch(store, "", first - 1).start()
    parts: dict[str, list[int]] = {}
    try:
        seen, deadline = first - 1, time.monotonic() + 30
        while seen < last:
            assert time.monotonic() < deadline, f"revisions {first}-{last} not all watched"
            for batch in watch.drain(timeout=1):
                if isinstance(batch, Reset):    # this etcd is never compacted
                    raise RuntimeError(f"revisions {first}-{last} compacted away")
                for event in batch:
                    kv = event.kv
                    seen = max(seen, kv.mod_revision)
                    if kv.mod_revision > last:
                        continue
                    value = b"" if kv.value is None else msgpack.packb(kv.value,
                                                                       use_bin_type=True)
                    part = parts.setdefault(kv.key.split("/", 1)[0], [0, 0])
                    part[0] += 1
                    part[1] += len(store.prefix) + len(kv.key) + len(value) + REVISION_OVERHEAD
    finally:
        watch.stop()
    return parts


def real_write_rates(args, etcd, workdir) -> None:
    cluster = "writes"
    store = Store(etcd.url, cluster)
    env = {**os.environ, "PEERCTL_ETCD": etcd.url, "PEERCTL_CLUSTER": cluster,
           "PEERCTL_CONF": os.devnull, "PEERCTL_ETCD_HISTORY": "0"}
    peers = [subprocess.Popen([sys.executable, PEERCTL, "peer", "--host", f"w{i}", "--libvirt",
                               "test:///default", "--state-dir", f"{workdir}/w{i}"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True) for i in (1, 2, 3)]

    def cli(*argv):
        done = subprocess.run([sys.executable, PEERCTL, *argv], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-500:]

    def window(seconds):
        """(writes per second, first revision, last revision) over ``seconds``."""
        rev0, t0 = store.revision(), time.monotonic()
        time.sleep(seconds)
        rev1 = store.revision()
        return (rev1 - rev0) / (time.monotonic() - t0), rev0 + 1, rev1
    try:
        wait_hosts(store, 3)
        time.sleep(args.settle)     # past start-up's writes
        idle, _, _ = window(args.writes)
        cli("boot", *[f"idle{i}" for i in range(args.idle_vms)], "--resources",
            "VCPU:1,MEMORY_MB:64,DISK_GB:1")
        time.sleep(args.settle)
        idle_vms, first, last = window(args.writes)
        parts = by_part(store, first, last) if last >= first else {}
        cycles, failed = [0], []
        stop = threading.Event()

        def churn():
            try:
                while True:
                    names = [f"b{cycles[0]}v{i}" for i in range(3)]
                    cli("boot", *names, "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
                    cli("destroy", *names, "--yes")
                    cycles[0] += 1
                    if stop.is_set():
                        return
            except BaseException as exc:        # said by the main thread, which cleans up
                failed.append(exc)
        thread = threading.Thread(target=churn)
        rev0, t0 = store.revision(), time.monotonic()
        thread.start()
        time.sleep(args.writes)
        stop.set()
        thread.join()
        if failed:
            raise RuntimeError(f"booting and destroying VMs failed: {failed[0]!r}")
        busy_revisions, busy_time = store.revision() - rev0, time.monotonic() - t0
        per_lifecycle = (busy_revisions - idle_vms * busy_time) / max(cycles[0] * 3, 1)
        kvs, _ = store.range("")
        average = sum(len(kv.key) + len(msgpack.packb(kv.value, use_bin_type=True))
                      for kv in kvs) / max(len(kvs), 1)
        print("\nWrite rates of real peers (3 hosts, test driver):")
        print(f"  idle, no VM        {idle / 3:6.3f} writes/s per host  (reference: the record "
              f"rewritten every {STATS_INTERVAL:g} s, {1 / STATS_INTERVAL:.2f})")
        print(f"  idle, {args.idle_vms} VMs {'':<{6 - len(str(args.idle_vms))}}"
              f"{max(idle_vms - idle, 0) / args.idle_vms:6.3f} writes/s per VM")
        print(f"  busy               {busy_revisions / busy_time:6.1f} writes/s, "
              f"{per_lifecycle:.0f} writes per VM booted and destroyed "
              f"({cycles[0] * 3} VMs in {busy_time:.0f} s)")
        print(f"  history            {idle / 3 * 3600 * average / 2**20:6.2f} MiB per host "
              f"per hour idle, {per_lifecycle * average / 1024:.1f} KiB per VM lifecycle "
              f"(average key+value {average:.0f} B)")
        seconds = args.writes
        total = sum(size for _, size in parts.values()) or 1
        print(f"  idle history by part ({args.idle_vms} VMs, {seconds:g} s; key, value and "
              f"{REVISION_OVERHEAD} B a revision), per host per hour: "
              + (", ".join(f"{part}/ {count * 3600 / seconds / 3:.0f} writes "
                           f"{size * 3600 / seconds / 3 / 1024:.1f} KiB ({size / total:.0%})"
                           for part, (count, size) in sorted(parts.items(),
                                                             key=lambda p: -p[1][1]))
                 or "nothing written"))
    finally:
        for peer in peers:
            peer.send_signal(signal.SIGKILL)
            peer.wait()
        store.close()


def host_counts(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or counts != sorted(counts):
        raise argparse.ArgumentTypeError(f"not a rising list of host counts: {text!r}")
    return counts


def positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
        return value
    return parse


def options() -> argparse.Namespace:
    parser = BadInput(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default=[50, 100, 200, 400], type=host_counts,
                        metavar="N,N", help="light peers at each step (default 50,100,200,400)")
    parser.add_argument("--vms-per-host", type=positive(int), default=50)
    parser.add_argument("--per-process", type=positive(int), default=25)
    parser.add_argument("--window", type=positive(float), default=MOVED_EVERY + STATS_INTERVAL,
                        metavar="SECONDS", help="measured at each step (default one host "
                        "record's longest wait and a tick)")
    parser.add_argument("--writes", type=positive(float), default=MOVED_EVERY + STATS_INTERVAL,
                        metavar="SECONDS", help="each window of part 2")
    parser.add_argument("--smoke", action="store_true",
                        help="3 light peers, 1 s windows: every path in a few seconds")
    args = parser.parse_args()
    for name, value in {**FULL, **(SMOKE if args.smoke else {})}.items():
        setattr(args, name, value)
    return args


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--light-worker":
        url, cluster, first, count, vms = sys.argv[2:7]
        light_worker(url, cluster, int(first), int(count), int(vms))
        return
    args = options()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # clean up below on kill
    workdir = args.workdir = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    etcd = EtcdServer(os.path.join(workdir, "etcd")).start()
    cluster = "scale"
    env = {**os.environ, "PEERCTL_ETCD": etcd.url, "PEERCTL_CLUSTER": cluster,
           "PEERCTL_CONF": os.devnull, "PEERCTL_ETCD_HISTORY": "0"}
    store = Store(etcd.url, cluster)
    real = subprocess.Popen([sys.executable, PEERCTL, "peer", "--host", "real1", "--libvirt",
                             "test:///default", "--state-dir", f"{workdir}/real1"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    workers: list[subprocess.Popen] = []
    try:
        wait_hosts(store, 1)
        print(f"light peers: {args.vms_per_host} VMs each, {args.per_process} per process, "
              f"{args.window:.0f} s per step; etcd {etcd.url}")
        steps = light_peers(args, etcd, cluster, store, env, workers)
        project(steps)
        for process in [real, *workers]:        # part 2 has etcd to itself
            process.send_signal(signal.SIGKILL)
            process.wait()
        quiet = EtcdServer(os.path.join(workdir, "etcd-writes")).start()
        try:
            real_write_rates(args, quiet, workdir)
        finally:
            quiet.stop()
        print("\n" + json.dumps({"steps": steps}))
    finally:
        for process in [real, *workers]:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()
        store.close()
        etcd.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
