"""HTTP API benchmark: the API (issue 30) measured against the command line,
in one run.

    python bench/api.py [--hosts 100] [--vms-per-host 100] [--runs 5] [--events 500]
                        [--scrapes 100] [--peers 3] [--boots 4] [--per-boot 5] [--smoke]

Starts an etcd of its own and writes H host records and H*V VM records into
one cluster as bench/vmlist.py does, serves that cluster's API in this
process (``engine.web``: ``ApiServer`` with the metrics cache of
``engine.web.metrics``) and measures, each figure beside its reference:

- **list**: ``GET /v1/vms`` through a keep-alive ``requests`` session (the
  body received, not parsed), best of --runs, against ``--format json
  vmlist`` as a fresh process, best of --runs; the two answers must be the
  same JSON, row for row.  Target: at most 0.5x (no process start);
- **events**: a client follows ``/v1/events`` (SSE over http.client); the
  bench puts --events VM records (each an existing VM's, state changed),
  one every 5 ms, the time taken just before each put; lag = when the
  client read the event's data line - that time.  Beside: the same lag
  through a bare etcd watch in this process.  Target: p99 at most 200 ms;
- **metrics**: ``GET /metrics`` (the cache read once and followed by
  watches), best and p99 of --scrapes after one unmeasured scrape; beside:
  ``render()`` in process, the HTTP left out.  Target: p99 at most 50 ms;
- **boots**: --peers peers on libvirt's test driver in a second cluster of
  the same etcd; --boots boots of --per-boot VMs through the API (``POST
  /v1/vms``, then ``GET /v1/automations/ID/wait``), alternating with as
  many ``boot`` commands as fresh processes.  Target: the API boots at least
  as many VMs a second as the command line.

``--smoke``: 200 VMs, 20 events, 5 scrapes, 2 peers, 1 boot of 1 VM each
way: every path in well under 40 s.  Everything it starts (etcd, peers, the
API's servers, its work directory under /var/tmp) is stopped or removed at
the end, on error too; the processes it ends are its own, by PID.  Exits 1
when the two listings differ or an event never arrived.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

import requests  # noqa: E402

from engine.core import api, tokens  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.store import Store  # noqa: E402
from engine.web.app import Api  # noqa: E402
from engine.web.server import ApiServer  # noqa: E402

from bench.options import BadInput, positive  # noqa: E402
from bench.bulk import wait  # noqa: E402  (one polling loop for the benchmarks)
from bench.processes import start_peer  # noqa: E402
from bench.processes import stop_processes  # noqa: E402
from bench.vmlist import best_of, populate  # noqa: E402

PEERCTL = os.path.join(ROOT, "peerctl.py")
WORK = "peerctl-bapi-"              # the work directory's prefix, under /var/tmp
LISTED, BOOTED = "bench", "bench-boot"      # the two clusters
LIST_RATIO = 0.5            # GET /v1/vms over a fresh vmlist process, at most
LAG_P99_MS = 200.0          # events: etcd write to the SSE client, p99 at most
SCRAPE_P99_MS = 50.0        # /metrics, p99 at most
BOOT_RATIO = 1.0            # API VMs/s over the command line's, at least
PACE_S = 0.005              # between two event puts
RESOURCES = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
SMOKE = {"hosts": 2, "vms_per_host": 100, "runs": 2, "events": 20, "scrapes": 5,
         "peers": 2, "boots": 1, "per_boot": 1}


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of them at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def verdict(met: bool) -> str:
    return "PASS" if met else "MISS"


def cli_env(etcd_url: str, cluster: str) -> dict:
    """A fresh command's environment: this cluster, no configuration file,
    bytecode cached as on an operator's machine."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PEERCTL_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PEERCTL_ETCD=etcd_url, PEERCTL_CLUSTER=cluster, PEERCTL_CONF=os.devnull)
    return env


@dataclasses.dataclass
class Served:
    """A cluster's API served by this process, and a client of it."""
    server: ApiServer
    session: requests.Session       # keep-alive, with the token's header
    secret: str                     # the token's secret
    no_metrics: str | None = None   # why it serves no metrics, if it does not

    @property
    def url(self) -> str:
        return self.server.url + "/"

    def stop(self) -> None:
        self.session.close()
        self.server.stop()


def serve(etcd_url: str, cluster: str, role: str, with_metrics: bool) -> Served:
    """The cluster's API on a free loopback port (with its metrics cache if
    asked and there is one), and a session holding a ``role`` token."""
    served_api = Api(etcd_url, cluster, placement={"backend": "etcd"})
    why = None
    if with_metrics:
        try:
            from engine.web.metrics import ClusterMetrics
            served_api.metrics = ClusterMetrics(served_api.context().store()).start()
        except ImportError as exc:
            why = f"no metrics cache ({exc})"
    server = ApiServer(served_api, "127.0.0.1:0")
    try:
        server.start()
    except BaseException:
        if served_api.metrics is not None:
            served_api.metrics.stop()
        served_api.close()
        raise
    token = tokens.create(served_api.context().store(), role)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token['secret']}"
    return Served(server, session, token["secret"], why)


# -- 1. the list -----------------------------------------------------------------------

def list_figure(served: Served, etcd_url: str, count: int, runs: int) -> dict:
    best, answer = float("inf"), None
    for _ in range(runs):
        started = time.perf_counter()
        reply = served.session.get(served.url + "v1/vms")
        body = reply.content
        best = min(best, time.perf_counter() - started)
        if reply.status_code != 200:
            raise SystemExit(f"GET /v1/vms answered {reply.status_code}: {body[:300]!r}")
        answer = body
    printed = []
    cli_wall, _ = best_of(runs, [sys.executable, PEERCTL, "--format", "json", "vmlist"],
                          cli_env(etcd_url, LISTED), printed.append)
    api_rows, cli_rows = json.loads(answer), json.loads(printed[-1])
    first_difference = next((f"row {i}: API {a} vs command line {c}"
                             for i, (a, c) in enumerate(zip(api_rows, cli_rows)) if a != c),
                            None)
    if first_difference is None and len(api_rows) != len(cli_rows):
        first_difference = f"{len(api_rows)} rows vs {len(cli_rows)}"
    return {"api": best, "cli": cli_wall, "rows": len(api_rows), "count": count,
            "difference": first_difference}


# -- 2. the events ---------------------------------------------------------------------

class EventFollower(threading.Thread):
    """A client of ``/v1/events``: when it read each watched key's event."""

    def __init__(self, url: str, secret: str, wanted: set[str]):
        super().__init__(daemon=True, name="sse-client")
        host, _, port = url.split("/")[2].rpartition(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.secret, self.wanted = secret, wanted
        self.received: dict[str, float] = {}
        self.ready, self.error = threading.Event(), None
        self.closing = False

    def run(self):
        try:
            self.conn.request("GET", "/v1/events", headers={
                "Authorization": f"Bearer {self.secret}", "Accept": "text/event-stream"})
            reply = self.conn.getresponse()
            if reply.status != 200:
                raise RuntimeError(f"/v1/events answered {reply.status}: {reply.read(300)!r}")
            kind = None
            while line := reply.readline():
                if line.startswith(b"event: "):
                    kind = line[7:].strip()
                elif line.startswith(b"data: "):
                    now = time.perf_counter()
                    if kind == b"hello":
                        self.ready.set()
                    for change in json.loads(line[6:])["changes"]:
                        if change["key"] in self.wanted:
                            self.received.setdefault(change["key"], now)
        except Exception as exc:   # reported by the figure, closed or not
            if self.error is None and not self.closing:
                self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()

    def close(self):
        self.closing = True
        if self.conn.sock is not None:
            try:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conn.close()


def event_figure(served: Served, store: Store, puts: int) -> dict:
    kvs, _ = store.range("vms/")
    chosen = kvs[:puts]
    wanted = {kv.key for kv in chosen}
    follower = EventFollower(served.url, served.secret, wanted)
    follower.start()
    watched: dict[str, float] = {}

    def on_events(events, _revision):
        now = time.perf_counter()
        if not isinstance(events, Exception):
            for event in events:
                watched.setdefault(event.kv.key, now)
    cancel = None
    try:
        if not follower.ready.wait(15) or follower.error:
            raise SystemExit(f"no hello from /v1/events: {follower.error or 'in 15 s'}")
        cancel = store.watch("vms/", store.revision() + 1, on_events)
        written = {}
        for kv in chosen:
            record = dict(kv.value, state="paused")
            written[kv.key] = time.perf_counter()
            store.put(kv.key, record)
            time.sleep(PACE_S)      # the pace of the writes, not a wait for anything
        try:
            wait(lambda: len(follower.received) == len(wanted) == len(watched) or
                 follower.error, timeout=30, interval=0.01)
        except TimeoutError:
            pass
    finally:
        if cancel:
            cancel()
        follower.close()
        follower.join(10)
    lags = [1000 * (follower.received[k] - t) for k, t in written.items()
            if k in follower.received]
    bare = [1000 * (watched[k] - t) for k, t in written.items() if k in watched]
    return {"puts": len(written), "lags": lags, "bare": bare, "error": follower.error,
            "lost": len(written) - len(lags)}


# -- 3. the metrics --------------------------------------------------------------------

def metrics_figure(served: Served, scrapes: int) -> dict:
    url, session, metrics = served.url, served.session, served.server.api.metrics
    if not metrics.wait_ready(60):
        raise SystemExit("the metrics cache did not read the cluster in 60 s")
    first = session.get(url + "metrics")        # unmeasured: connection and first pass
    if first.status_code != 200 or b"peerctl_vms" not in first.content:
        raise SystemExit(f"GET /metrics answered {first.status_code}: {first.content[:300]!r}")
    times = []
    for _ in range(scrapes):
        started = time.perf_counter()
        session.get(url + "metrics")        # the body read: requests reads it all
        times.append(1000 * (time.perf_counter() - started))
    renders = []
    for _ in range(min(scrapes, 20)):
        started = time.perf_counter()
        metrics.render()
        renders.append(1000 * (time.perf_counter() - started))
    return {"best": min(times), "p99": percentile(times, 0.99), "render": min(renders),
            "scrapes": scrapes}


# -- 4. the boots ----------------------------------------------------------------------

def start_peers(etcd_url: str, workdir: str, store: Store, count: int, peers: list) -> None:
    """``count`` peers on the test driver, each added to ``peers`` as it
    starts (the cleanup stops what is there), alive with their placement
    providers."""
    env = {"PEERCTL_CONF": os.devnull}
    for i in range(1, count + 1):
        peers.append(start_peer(etcd_url, BOOTED, workdir, f"host{i}", "test:///default", env))
    try:
        wait(lambda: len(api.live_hosts(store)) == count, timeout=90, interval=0.1)
        wait(lambda: len(store.range("placement/rp/", keys_only=True)[0]) >= count,
             timeout=60, interval=0.1)
    except TimeoutError:
        with open(os.path.join(workdir, "host1.log"), errors="replace") as log:
            tail = log.read()[-600:]
        raise SystemExit(f"{count} peers did not come up in time; host1's log ends: "
                         f"{tail}") from None


def boot_through_api(served: Served, names: list[str]) -> float:
    url, session = served.url, served.session
    started = time.perf_counter()
    reply = session.post(url + "v1/vms", json={"names": names, "resources": RESOURCES})
    if reply.status_code != 202:
        raise SystemExit(f"POST /v1/vms answered {reply.status_code}: {reply.text[:300]}")
    done = session.get(url + reply.headers["Location"].lstrip("/") + "/wait",
                       params={"timeout": "240"})
    elapsed = time.perf_counter() - started
    if done.status_code != 200 or done.json().get("state") != "done":
        raise SystemExit(f"the API's boot of {names} ended {done.status_code}: "
                         f"{done.text[:300]}")
    return elapsed


def boot_through_cli(env: dict, names: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, PEERCTL, "--format", "json", "boot", *names,
                           "--resources", RESOURCES], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or json.loads(done.stdout).get("state") != "done":
        raise SystemExit(f"boot {' '.join(names)} exited {done.returncode}: "
                         f"{done.stdout[-300:]} {done.stderr[-300:]}")
    return elapsed


def boot_figure(served: Served, etcd_url: str, boots: int, per_boot: int) -> dict:
    env = cli_env(etcd_url, BOOTED)
    through_api, through_cli = [], []
    for b in range(boots):      # alternating, so that both see the same cluster
        through_api.append(boot_through_api(served, [f"api-{b}-{v}" for v in range(per_boot)]))
        through_cli.append(boot_through_cli(env, [f"cli-{b}-{v}" for v in range(per_boot)]))
    return {"api": through_api, "cli": through_cli, "per_boot": per_boot}


# -- the run -----------------------------------------------------------------------------

def report(sizes: dict, listing: dict, events: dict, scrape: dict | str, boots: dict) -> bool:
    """Print each figure beside its reference and target; whether every
    answer was right (the same listing, every event received)."""
    print(f"{listing['count']:,} VMs on {sizes['hosts']} hosts; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    ratio = listing["api"] / listing["cli"]
    print(f"list: GET /v1/vms {listing['api']:.3f}s vs vmlist --format json, fresh process "
          f"{listing['cli']:.3f}s (best of {sizes['runs']} each) = x{ratio:.2f} "
          f"(target <= x{LIST_RATIO}): {verdict(ratio <= LIST_RATIO)}")
    same = listing["difference"] is None and listing["rows"] == listing["count"]
    print(f"list: same answer, {listing['rows']:,} rows: "
          f"{'PASS' if same else 'MISS (' + str(listing['difference']) + ')'}")
    lags, bare = events["lags"], events["bare"]
    if lags:
        p99 = percentile(lags, 0.99)
        bare_text = (f"{statistics.median(bare):.1f} / {percentile(bare, 0.99):.1f} ms"
                     if bare else "n/a")
        print(f"events: {events['puts']} puts, etcd write -> SSE client p50 "
              f"{statistics.median(lags):.1f} ms, p99 {p99:.1f} ms, max {max(lags):.1f} ms "
              f"vs a bare etcd watch in process p50/p99 {bare_text} (target p99 <= "
              f"{LAG_P99_MS:g} ms): {verdict(p99 <= LAG_P99_MS)}")
    else:
        print(f"events: {events['puts']} puts, none received "
              f"({events['error'] or 'no error'}): MISS")
    if events["lost"]:
        print(f"events: {events['lost']} of {events['puts']} never arrived "
              f"({events['error'] or 'no error'}): MISS")
    if isinstance(scrape, str):
        print(f"metrics: skipped: {scrape}")
    else:
        print(f"metrics: GET /metrics best {scrape['best']:.1f} ms, p99 {scrape['p99']:.1f} ms "
              f"over {scrape['scrapes']} scrapes vs render() in process {scrape['render']:.1f} "
              f"ms (target p99 <= {SCRAPE_P99_MS:g} ms): "
              f"{verdict(scrape['p99'] <= SCRAPE_P99_MS)}")
    vms = len(boots["api"]) * boots["per_boot"]
    api_rate, cli_rate = vms / sum(boots["api"]), vms / sum(boots["cli"])
    print(f"boots: {len(boots['api'])} boot(s) of {boots['per_boot']} VM(s) each way: API "
          f"{api_rate:.1f} VMs/s (median boot {statistics.median(boots['api']):.2f}s) vs boot, "
          f"fresh process {cli_rate:.1f} VMs/s (median {statistics.median(boots['cli']):.2f}s)"
          f" = x{api_rate / cli_rate:.2f} (target >= x{BOOT_RATIO:g}): "
          f"{verdict(api_rate >= BOOT_RATIO * cli_rate)}")
    return same and not events["lost"]


def bench(sizes: dict) -> bool:
    workdir = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    etcd = EtcdServer(os.path.join(workdir, "etcd"))
    served, peers, stores = [], [], []
    try:
        etcd.start()
        listed = Store(etcd.url, LISTED)
        stores.append(listed)
        count = populate(listed, sizes["hosts"], sizes["vms_per_host"])
        served.append(serve(etcd.url, LISTED, "viewer", with_metrics=True))
        listing = list_figure(served[-1], etcd.url, count, sizes["runs"])
        events = event_figure(served[-1], listed, sizes["events"])
        scrape = served[-1].no_metrics or metrics_figure(served[-1], sizes["scrapes"])
        booted = Store(etcd.url, BOOTED)
        stores.append(booted)
        start_peers(etcd.url, workdir, booted, sizes["peers"], peers)
        served.append(serve(etcd.url, BOOTED, "operator", with_metrics=False))
        boots = boot_figure(served[-1], etcd.url, sizes["boots"], sizes["per_boot"])
        return report(sizes, listing, events, scrape, boots)
    finally:
        for each in served:
            each.stop()
        stop_processes(peers)
        for store in stores:
            store.close()
        etcd.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = BadInput(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=positive, default=100)
    parser.add_argument("--vms-per-host", type=positive, default=100)
    parser.add_argument("--runs", type=positive, default=5,
                        help="best of this many listings each way")
    parser.add_argument("--events", type=positive, default=500,
                        help="VM records put while a client follows /v1/events")
    parser.add_argument("--scrapes", type=positive, default=100)
    parser.add_argument("--peers", type=positive, default=3)
    parser.add_argument("--boots", type=positive, default=4, help="boots each way")
    parser.add_argument("--per-boot", type=positive, default=5, help="VMs a boot")
    parser.add_argument("--smoke", action="store_true",
                        help="200 VMs, 20 events, 5 scrapes, 2 peers, 1 boot of 1 VM each "
                             "way: every path, quickly")
    options = parser.parse_args()
    sizes = dict(SMOKE) if options.smoke else {
        k: getattr(options, k) for k in SMOKE}
    if sizes["events"] > sizes["hosts"] * sizes["vms_per_host"]:
        parser.error(f"--events {sizes['events']} is more than the "
                     f"{sizes['hosts'] * sizes['vms_per_host']} VMs written")
    # SIGTERM ends the run as Ctrl-C does: through the cleanup.
    signal.signal(signal.SIGTERM, lambda _signo, _frame: sys.exit(
        "bench/api.py: terminated (everything it started is gone)"))
    started = time.monotonic()
    try:
        right = bench(sizes)
    except KeyboardInterrupt:
        raise SystemExit("bench/api.py: interrupted (everything it started is gone)") from None
    print(f"ran {time.monotonic() - started:.0f} s")
    if not right:
        print("bench/api.py: a wrong answer (see MISS above)", file=sys.stderr)
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
