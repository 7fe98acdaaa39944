"""HA restart benchmark: from the SIGKILL of a host's peer to every one of
its HA VMs running on other hosts.

    python bench/ha.py [--ttls 5,2] [--vms 1,10,100] [--margin 3] [--survivors 3] [--smoke]

In one run, against its own etcd on loopback: for each TTL and each VM
count, a fresh cluster of ``1 + --survivors`` real peers on libvirt's test
driver (hosts big enough for 100 small VMs), ``boot --ha restart`` of the
VMs on the victim, SIGKILL of the victim's peer, then ``vms/`` read every
50 ms until every VM is listed running on another host.  Printed per case:
when the victim's lease expired (detection), when the recovery automation
started (detection + margin), and when the last VM ran (the figure), beside
the target it chases: at most 15 s for 10 VMs at TTL 5 (PASS/MISS), where
Proxmox's HA takes about 120 s and Masakari minutes (docs/ha.md, FACTS.md).
On the test driver the VMs have no guest to boot: what is measured is
peerctl's part (detection, margin, placement, rebuild), not a guest's boot.

``--smoke``: TTL 2, 2 VMs, margin 1 s, one other host: every path in
seconds (the target's case is not run: its line says so).  Bad options: one
line, exit 2, nothing started.  Work under /var/tmp/peerctl-bha-*, removed
at the end with its peers and etcd, on error too.  Not a test: figures
depend on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

from bench.options import BadInput, numbers, whole  # noqa: E402
from engine.cluster import ready_hosts  # noqa: E402
from engine.core import keys  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.store import Store  # noqa: E402
from tests.support import wait_for  # noqa: E402

PEERCTL = os.path.join(ROOT, "peerctl.py")
WORK = "peerctl-bha-"       # the work directory's prefix, under /var/tmp
TARGET_S = 15.0             # 10 VMs at TTL 5
TARGET_CASE = (5, 10)       # (TTL, VMs)
SMOKE = {"ttls": [2], "vms": [2], "margin": 1.0, "survivors": 1}
PROXMOX_S = 120.0           # its documented failover time
SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"


def margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0 and at most 60 seconds")
    return value


def host_file(path: str) -> str:
    """A test-driver host with room for a hundred small VMs; its URI."""
    with open(path, "w") as f:
        f.write("<node><cpu><nodes>1</nodes><sockets>1</sockets><cores>256</cores>"
                "<threads>1</threads><active>256</active><mhz>2000</mhz>"
                f"<model>i686</model></cpu><memory>{64 << 20}</memory></node>")
    return f"test://{path}"


class Cluster:
    def __init__(self, etcd_url: str, name: str, work: str, ttl: int, margin: float):
        self.etcd_url, self.name, self.work = etcd_url, name, work
        self.ttl, self.margin = ttl, margin
        self.env = {**os.environ, "PEERCTL_ETCD": etcd_url, "PEERCTL_CLUSTER": name,
                    "PYTHONUNBUFFERED": "1"}
        self.env.pop("PEERCTL_FORMAT", None)
        self.peers: dict[str, subprocess.Popen] = {}
        self.store = Store(etcd_url, name)

    def start(self, host: str) -> None:
        log = open(os.path.join(self.work, f"{self.name}-{host}.log"), "ab")
        self.peers[host] = subprocess.Popen(
            [sys.executable, PEERCTL, "peer", "--host", host,
             "--libvirt", host_file(os.path.join(self.work, f"{self.name}-{host}.xml")),
             "--ttl", str(self.ttl), "--ha-margin", str(self.margin),
             "--state-dir", os.path.join(self.work, f"{self.name}-{host}")],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT,
            start_new_session=True)

    def cli(self, *args) -> dict:
        done = subprocess.run([sys.executable, PEERCTL, "--format", "json", *args],
                              capture_output=True, text=True, env=self.env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"peerctl {' '.join(args)}: {done.stderr.strip()}")
        return json.loads(done.stdout)

    def live(self) -> set[str]:
        return {keys.suffix(kv.key, keys.host())
                for kv in self.store.range(keys.host(), keys_only=True)[0]}

    def wait(self, predicate, timeout: float, what: str):
        try:
            return wait_for(predicate, timeout, what=what)
        except AssertionError as exc:
            raise SystemExit(str(exc)) from None

    def close(self) -> None:
        for process in self.peers.values():
            if process.poll() is None:
                process.kill()
                process.wait(30)
        self.store.close()


def one_case(etcd_url: str, work: str, ttl: int, count: int, margin: float,
             survivors: int) -> dict:
    name = f"ha{ttl}x{count}-{os.getpid()}"
    cluster = Cluster(etcd_url, name, work, ttl, margin)
    hosts = ["victim"] + [f"s{i}" for i in range(1, survivors + 1)]
    try:
        for host in hosts:
            cluster.start(host)
        cluster.wait(lambda: ready_hosts(cluster.store, hosts) == set(hosts), 60,
                     "peers alive with their inventory")
        names = [f"vm{i:03d}" for i in range(count)]
        booted = cluster.cli("boot", *names, "--resources", SMALL, "--network", "none",
                             "--on", "victim", "--ha", "restart")
        uuids = {vm["uuid"] for vm in booted["vms"]}
        killed = time.monotonic()
        cluster.peers["victim"].send_signal(signal.SIGKILL)
        expired = started = None
        while True:
            now = time.monotonic()
            if now - killed > 300:
                raise SystemExit(f"TTL {ttl}, {count} VMs: not recovered in 300 s")
            if expired is None and "victim" not in cluster.live():
                expired = now
            if started is None and cluster.store.get(keys.recovery("victim")) is not None:
                started = now
            records = [kv.value for kv in cluster.store.range(keys.vm())[0]]
            moved = {r["uuid"] for r in records
                     if r["host"] != "victim" and r["state"] == "running"}
            if uuids <= moved:
                done = now
                break
            time.sleep(0.05)
        return {"ttl": ttl, "vms": count, "expired": expired - killed,
                "started": (started or done) - killed, "done": done - killed}
    finally:
        cluster.close()


def main() -> int:
    parser = BadInput(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ttls", type=numbers(1, 60, "TTLs"), default=[5, 2], metavar="S,S",
                        help="the peers' lease TTLs, seconds (default 5,2)")
    parser.add_argument("--vms", type=numbers(1, 100, "VM counts"), default=[1, 10, 100],
                        metavar="N,N", help="HA VMs on the victim (default 1,10,100)")
    parser.add_argument("--margin", type=margin, default=3.0, metavar="SECONDS",
                        help="the peers' --ha-margin (default 3)")
    parser.add_argument("--survivors", type=whole(1, 10, "hosts"), default=3,
                        metavar="N", help="hosts besides the victim (default 3)")
    parser.add_argument("--smoke", action="store_true",
                        help="TTL 2, 2 VMs, margin 1 s, one other host")
    args = parser.parse_args()
    ttls, counts, survivors = args.ttls, args.vms, args.survivors
    if args.smoke:
        ttls, counts = SMOKE["ttls"], SMOKE["vms"]
        args.margin, survivors = SMOKE["margin"], SMOKE["survivors"]
    work = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    etcd = None
    try:
        etcd = EtcdServer(os.path.join(work, "etcd")).start()
        print(f"HA restart: SIGKILL of a host's peer -> all its HA VMs running elsewhere "
              f"(margin {args.margin:g} s, {survivors} other host{'s' if survivors > 1 else ''}"
              f", test driver; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        print(f"{'TTL':>4} {'VMs':>5} {'lease expired':>14} {'recovery start':>15} "
              f"{'all running':>12}")
        judged = None
        for ttl in ttls:
            for count in counts:
                row = one_case(etcd.url, work, ttl, count, args.margin, survivors)
                if (ttl, count) == TARGET_CASE:
                    judged = row["done"]
                print(f"{ttl:>4} {count:>5} {row['expired']:>13.1f}s {row['started']:>14.1f}s "
                      f"{row['done']:>11.1f}s", flush=True)
        ttl, count = TARGET_CASE
        if judged is None:
            print(f"target: {count} VMs at TTL {ttl} all running within {TARGET_S:g} s "
                  f"(Proxmox's HA ~{PROXMOX_S:g} s): not run")
        else:
            print(f"target: {count} VMs at TTL {ttl} all running within {TARGET_S:g} s "
                  f"(Proxmox's HA ~{PROXMOX_S:g} s): {judged:.1f} s: "
                  f"{'PASS' if judged <= TARGET_S else 'MISS'}")
    finally:
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
