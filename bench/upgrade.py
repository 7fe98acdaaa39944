"""Rolling upgrade benchmark: how long each host is out of service while
its peer hands over to a new release, and how long a whole upgrade takes.

    python bench/upgrade.py [--peers 3,20] [--ttl 5] [--smoke]

In one run, against its own etcd on loopback, for each size: a fresh
cluster of that many real peers on libvirt's test driver (TTL ``--ttl``),
a VM on each host, a ping of many rounds running through every host, and
a second release (this tree as version 0.2.0, made by
:func:`tests.support.releases.build_release`) stored with ``code add``;
then ``upgrade --to 0.2.0 --yes``, timed.  Printed beside the target each
chases:

- **out of service**, per host: from the old process's last lease renewal
  to the new process's first (what each host's row of the upgrade's
  result says): median and worst, target at most 5 s;
- **whole upgrade**: the command's time, and per host (no reference: it
  grows with the hosts, one at a time);
- **failed automations**: the ping and the upgrade, and every other task
  of the cluster, target 0.

``--smoke``: 3 peers and a short ping: every path in about half a minute.
Work under /var/tmp/peerctl-bupgrade-*, removed at the end, with every
process the run started.  Bad options: one line, exit 2.  Not a test: the
times depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

from engine.core import api, keys  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.store import Store  # noqa: E402
from tests.support import wait_for  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.releases import build_release  # noqa: E402

TARGET_S = 5.0              # per host out of service
SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"


def sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of peer counts: {text!r}") from None
    if not values or any(v < 2 or v > 50 for v in values):
        raise argparse.ArgumentTypeError(f"peer counts from 2 to 50: {text!r}")
    return values


def one_size(etcd_url: str, work: str, peers: int, ttl: int, rounds: int) -> dict:
    name = f"up{peers}-{os.getpid()}"
    path = pathlib.Path(work) / name
    path.mkdir()
    cluster = Cluster(etcd_url, name, path)
    store = Store(etcd_url, name)
    hosts = [f"host{i}" for i in range(1, peers + 1)]
    try:
        for host in hosts:
            cluster.start_peer(host, ttl=ttl)
        wait_for(lambda: set(hosts) <= set(api.live_hosts(store)), timeout=120,
                 what="peers alive")
        wait_for(lambda: len(store.range(keys.placement("name/"))[0]) >= peers, timeout=120,
                 what="providers registered")
        booted = cluster.cli_json("boot", *[f"vm{i}" for i in range(peers)], "--network",
                                  "none", "--resources", SMALL, timeout=300)
        assert booted["state"] == "done", booted
        release = build_release(str(path / "release"), "0.2.0")
        cluster.cli_json("code", "add", release, timeout=300)
        ping = api.start_automation(store, "ping", {"hosts": hosts, "rounds": rounds})
        started = time.monotonic()
        done = _upgrade(cluster, "0.2.0")
        took = time.monotonic() - started
        pinged = wait_for(lambda: _finished(store, ping), timeout=600, what="the ping")
        tasks = api.list_tasks(store, include_finished=True)
        failed = [t for t in tasks if t["state"] != "done"]
        out = [h["out_of_service_s"] for h in done.get("hosts") or []
               if h.get("out_of_service_s") is not None]
        return {"peers": peers, "state": done.get("state"), "upgraded":
                sum(h["state"] == "upgraded" for h in done.get("hosts") or []),
                "out": out, "took": took, "failed": failed, "ping": pinged["state"]}
    finally:
        cluster.close()
        store.close()


def _upgrade(cluster: Cluster, version: str) -> dict:
    """``upgrade --to version --yes``: its JSON result, which it prints
    whether or not every host made it (exit 0 or 1)."""
    done = cluster.cli("--format", "json", "upgrade", "--to", version, "--yes", timeout=1800)
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"bench/upgrade.py: upgrade --to {version} exited {done.returncode}: "
                         f"{done.stderr.strip()[-300:]}") from None


def _finished(store, automation):
    task = api.get_task(store, automation)
    return task if task["state"] in keys.TERMINAL_STATES else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=sizes, default=[3, 20], metavar="N,N",
                        help="cluster sizes (default 3,20)")
    parser.add_argument("--ttl", type=int, default=5, choices=range(2, 31), metavar="SECONDS",
                        help="the peers' lease TTL (default 5)")
    parser.add_argument("--smoke", action="store_true", help="3 peers, a short ping")
    args = parser.parse_args()
    peers = [3] if args.smoke else args.peers
    rounds = 50 if args.smoke else 2000
    work = tempfile.mkdtemp(prefix="peerctl-bupgrade-", dir="/var/tmp")
    etcd = EtcdServer(os.path.join(work, "etcd")).start()
    try:
        print(f"rolling upgrade to a second release, one host at a time (TTL {args.ttl} s, "
              "test driver, a ping through every host meanwhile)", flush=True)
        for size in peers:
            row = one_size(etcd.url, work, size, args.ttl, rounds)
            out = row["out"]
            worst = max(out) if out else float("inf")
            print(f"{size} peers: {row['upgraded']} of {size} upgraded ({row['state']}); "
                  f"out of service per host median {statistics.median(out) if out else 0:.2f}s, "
                  f"worst {worst:.2f}s (target <= {TARGET_S:g}s): "
                  f"{'PASS' if out and worst <= TARGET_S and row['upgraded'] == size else 'MISS'}",
                  flush=True)
            print(f"{size} peers: whole upgrade {row['took']:.1f}s, "
                  f"{row['took'] / size:.1f}s per host", flush=True)
            print(f"{size} peers: failed automations {len(row['failed'])} "
                  f"(ping {row['ping']}; target 0): "
                  f"{'PASS' if not row['failed'] else 'MISS'}"
                  + "".join(f"\n  {t['kind']} {t['id']} {t['state']}" for t in row["failed"]),
                  flush=True)
    finally:
        etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
