"""Rolling upgrade benchmark: how long each host is out of service while
its peer hands over to a new release, and how long a whole upgrade takes.

    python bench/upgrade.py [--peers 3,20] [--ttl 5] [--smoke]

In one run, against its own etcd on loopback, for each size: a fresh
cluster of that many real peers on libvirt's test driver (TTL ``--ttl``),
a VM on each host, and a second release (this tree as version 0.2.0, made
by :func:`tests.support.releases.build_release`) stored with ``code add``;
then ``upgrade --to 0.2.0 --yes``, timed, while pings through every host
follow one another until it ends.  Printed beside the target each chases:

- **out of service**, per host: from the old process's last lease renewal
  to the new process's first (what each host's row of the upgrade's
  result says): median and worst, target at most 5 s;
- **whole upgrade**: the command's time, and per host (no reference: it
  grows with the hosts, one at a time);
- **where a hand-over's time goes** (the peers' logs): the new process's
  start up to its first renewal, then up to serving; and the slowest ping
  reply, what a request to a host being handed over waits (no target);
- **failed automations**: the pings and the upgrade, and every other task
  of the cluster, target 0.

``--smoke``: 3 peers and short pings: every path in well under a minute.
Work under /var/tmp/peerctl-bupgrade-*, removed at the end, with every
process the run started (the peers an upgrade handed over to too).  Bad
options: one line, exit 2.  Not a test: the times depend on the machine
and its load.
"""
from __future__ import annotations

import argparse
import datetime
import json
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

from bench.options import BadInput, numbers  # noqa: E402
from engine.cluster import ready_hosts  # noqa: E402
from engine.core import api, keys  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.store import Store  # noqa: E402
from tests.support import PEERCTL, wait_for  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.releases import build_release  # noqa: E402

TARGET_S = 5.0              # per host out of service
SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
ROUNDS = 100                # a ping's rounds; pings follow one another for the whole upgrade
SMOKE_ROUNDS = 20
STAMP = re.compile(r"^(\S+Z) \[\w+\s*\] (\w+)\s")


sizes = numbers(2, 50, "peer counts")


def ttl(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 2 <= value <= 30:
        raise argparse.ArgumentTypeError(f"{text!r} is not from 2 to 30 seconds")
    return value


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
        wait_for(lambda: ready_hosts(store, hosts) == set(hosts), timeout=120,
                 what="peers alive with their inventory")
        booted = cluster.cli_json("boot", *[f"vm{i}" for i in range(peers)], "--network",
                                  "none", "--resources", SMALL, timeout=300)
        assert booted["state"] == "done", booted
        release = build_release(str(path / "release"), "0.2.0")
        cluster.cli_json("code", "add", release, timeout=300)
        started = time.monotonic()
        done, pings = _upgrade_under_pings(cluster, store, "0.2.0", hosts, rounds)
        took = time.monotonic() - started
        pinged = [wait_for(lambda: _finished(store, ping), timeout=600, what="the pings")
                  for ping in pings]
        tasks = api.list_tasks(store, include_finished=True)
        failed = [t for t in tasks if t["state"] != "done"]
        out = [h["out_of_service_s"] for h in done.get("hosts") or []
               if h.get("out_of_service_s") is not None]
        return {"peers": peers, "state": done.get("state"), "upgraded":
                sum(h["state"] == "upgraded" for h in done.get("hosts") or []),
                "out": out, "took": took, "failed": failed, "pings": pinged,
                "slowest": _slowest_reply(pinged), "handovers": _handovers(path, hosts)}
    finally:
        cluster.close()
        store.close()


def _upgrade_under_pings(cluster: Cluster, store, version: str, hosts: list[str],
                         rounds: int) -> tuple[dict, list[str]]:
    """``upgrade --to version --yes``, its JSON result (printed whether or
    not every host made it: exit 0 or 1), while pings of ``rounds`` rounds
    through every host follow one another until it ends; and their ids."""
    pings = [api.start_automation(store, "ping", {"hosts": hosts, "rounds": rounds})]
    command = subprocess.Popen([sys.executable, PEERCTL, "--format", "json", "upgrade", "--to",
                                version, "--yes"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=cluster.env, cwd=ROOT)
    try:
        while command.poll() is None:
            if _finished(store, pings[-1]):
                pings.append(api.start_automation(store, "ping",
                                                  {"hosts": hosts, "rounds": rounds}))
            time.sleep(0.05)
        stdout, stderr = command.communicate()
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    try:
        return json.loads(stdout), pings
    except ValueError:
        raise SystemExit(f"bench/upgrade.py: upgrade --to {version} exited "
                         f"{command.returncode}: {stderr.strip()[-300:]}") from None


def _finished(store, automation):
    task = api.get_task(store, automation)
    return task if task["state"] in keys.TERMINAL_STATES else None


def _slowest_reply(pings: list[dict]) -> float | None:
    """The slowest ping reply, seconds: what a request to a host being
    handed over waits."""
    latencies = [r["latency_ms"] for p in pings for r in (p.get("result") or {}).get("replies", [])
                 if r.get("latency_ms") is not None]
    return max(latencies) / 1000 if latencies else None


def _handovers(path: pathlib.Path, hosts: list[str]) -> dict[str, list[float]]:
    """Per host, from its peer's log (old and new process write to it):
    ``start``, from ``handing_over`` to the new process's ``session_started``
    (its Python start, imports, carried domains: the lease's gap), and
    ``serve``, from there to ``handed_over`` (host record, guard, first
    publication, and the old process noticing)."""
    found = {"start": [], "serve": []}
    for host in hosts:
        seen = {}
        try:
            lines = (path / f"{host}.log").read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            match = STAMP.match(line)
            if match is None:
                continue
            event = match[2]
            if event == "session_started" and "adopted=True" not in line:
                continue
            if event in ("handing_over", "session_started", "handed_over"):
                seen.setdefault(event, datetime.datetime.fromisoformat(
                    match[1].replace("Z", "+00:00")).timestamp())
        if "handing_over" in seen and "session_started" in seen:
            found["start"].append(seen["session_started"] - seen["handing_over"])
        if "session_started" in seen and "handed_over" in seen:
            found["serve"].append(seen["handed_over"] - seen["session_started"])
    return found


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}s" if values else "-"


def report(row: dict, ttl: int) -> None:
    size, out = row["peers"], row["out"]
    worst = max(out) if out else float("inf")
    print(f"{size} peers: {row['upgraded']} of {size} upgraded ({row['state']}); "
          f"out of service per host median {_median(out)}, worst {worst:.2f}s "
          f"(target <= {TARGET_S:g}s, TTL {ttl}s): "
          f"{'PASS' if out and worst <= TARGET_S and row['upgraded'] == size else 'MISS'}")
    print(f"{size} peers: whole upgrade {row['took']:.1f}s, {row['took'] / size:.1f}s per host "
          "(no target)")
    handovers, slowest = row["handovers"], row["slowest"]
    print(f"{size} peers: hand-over per host (peer logs), median: new process up to its first "
          f"renewal {_median(handovers['start'])}, then serving {_median(handovers['serve'])}; "
          f"slowest ping reply {'-' if slowest is None else f'{slowest:.2f}s'} (no target)")
    rounds = sum((p.get("args") or {}).get("rounds", 0) for p in row["pings"])
    print(f"{size} peers: failed automations {len(row['failed'])} "
          f"({len(row['pings'])} pings of {rounds} rounds in all through the upgrade; "
          f"target 0): {'PASS' if not row['failed'] else 'MISS'}"
          + "".join(f"\n  {t['kind']} {t['id']} {t['state']}: {t.get('error')}"
                    for t in row["failed"]))
    sys.stdout.flush()


def main() -> int:
    parser = BadInput(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=sizes, default=[3, 20], metavar="N,N",
                        help="cluster sizes (default 3,20)")
    parser.add_argument("--ttl", type=ttl, default=5, metavar="SECONDS",
                        help="the peers' lease TTL, 2 to 30 (default 5)")
    parser.add_argument("--smoke", action="store_true", help="3 peers, short pings")
    args = parser.parse_args()
    peers = [3] if args.smoke else args.peers
    rounds = SMOKE_ROUNDS if args.smoke else ROUNDS
    # SIGTERM ends the run as Ctrl-C does: through the cleanup.
    signal.signal(signal.SIGTERM, lambda _signo, _frame: sys.exit(
        "bench/upgrade.py: terminated (everything it started is gone)"))
    began = time.monotonic()
    work = tempfile.mkdtemp(prefix="peerctl-bupgrade-", dir="/var/tmp")
    try:
        etcd = EtcdServer(os.path.join(work, "etcd")).start()
        try:
            print(f"rolling upgrade to a second release, one host at a time (TTL {args.ttl} s, "
                  "test driver, pings through every host meanwhile)", flush=True)
            for size in peers:
                report(one_size(etcd.url, work, size, args.ttl, rounds), args.ttl)
        finally:
            etcd.stop()
    except KeyboardInterrupt:
        raise SystemExit("bench/upgrade.py: interrupted (everything it started is gone)") from None
    except AssertionError as exc:       # a wait timed out, a command failed: the run stops
        raise SystemExit(f"bench/upgrade.py: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"ran {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
