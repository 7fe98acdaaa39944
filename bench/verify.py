"""``cluster verify``: how long it takes, at 3 and at 20 hosts.

    python bench/verify.py [--sizes 3,20] [--runs 5] [--smoke]

Against a 3-member etcd of its own on loopback, for each size N (in
increasing order) the run starts the peers missing to make N (test driver,
TTL 5 s), each publishing a libvirt endpoint on loopback where the run
listens (``test+tcp://127.0.0.1:PORT/default``) and a migration port of its
own, so that verify's pair checks probe every pair (N x (N-1) x 2
connections, every host's at once); waits until every one is alive with
its inventory, then times
``peerctl cluster verify`` (a fresh process each time, as a user runs it)
``--runs`` times, and beside it, in the same run and interleaved with it,
``peerctl hostlist``: the listing an operator reads instead, which reads the
same host records in one range read.  Each figure is the median, printed
with the fastest and the slowest.  Goal (issue 51): ``cluster verify`` on
20 hosts within 5 s.

``--smoke``: N=3, 2 runs.  Work under /var/tmp/peerctl-bverify-*, removed at
the end with every process the run started, on error, SIGTERM and Ctrl-C
too.  Bad options: one line, exit 2, nothing started.
"""
from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

from bench.options import BadInput, ends_in_one_line, held, numbers, whole  # noqa: E402
from bench.processes import load_line, start_peer, stop_processes  # noqa: E402
from engine.cluster import ready_hosts  # noqa: E402
from engine.core.etcd_server import EtcdCluster  # noqa: E402
from engine.core.store import Store  # noqa: E402
from tests.support import wait_for  # noqa: E402

CLUSTER, TTL = "bverify", 5
GOAL_N, GOAL_S = 20, 5.0
SMOKE = {"sizes": [3], "runs": 2}
WORK = "peerctl-bverify-"


def endpoint() -> socket.socket:
    """A TCP listener on loopback standing in for a host's libvirtd (the
    kernel completes the probes' connections to it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def timed(urls: str, *args: str) -> tuple[float, int]:
    """Seconds a fresh ``peerctl ARGS`` took, and its exit code."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, os.path.join(ROOT, "peerctl.py"), "--etcd", urls,
                           "--cluster", CLUSTER, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={**os.environ, "PEERCTL_CONF": os.devnull})
    took = time.monotonic() - began
    if done.returncode not in (0, 1):       # verify's 1 is an answer: problems found
        raise SystemExit(f"bench/verify.py: peerctl {' '.join(args)} failed "
                         f"({done.returncode}): {done.stderr.strip()[-400:]}")
    return took, done.returncode


def one_size(n: int, urls: str, runs: int) -> dict:
    verify, listing, codes = [], [], set()
    for _ in range(runs):
        took, code = timed(urls, "cluster", "verify")
        verify.append(took)
        codes.add(code)
        listing.append(timed(urls, "hostlist")[0])
    return {"n": n, "verify": verify, "hostlist": listing, "clean": codes == {0}}


def figure(values: list[float]) -> str:
    return (f"{statistics.median(values):6.2f} s (fastest {min(values):.2f}, slowest "
            f"{max(values):.2f})")


def report(rows: list[dict], runs: int) -> None:
    print(f"\n{'hosts':>5}  {'cluster verify':<36} {'hostlist (same run)':<36} verdict")
    for r in rows:
        clean = "clean" if r["clean"] else "problems found"
        print(f"{r['n']:>5}  {figure(r['verify']):<36} {figure(r['hostlist']):<36} {clean}")
    print(f"\n(median of {runs} runs each, a fresh process each time, interleaved)")
    judged = [r for r in rows if r["n"] == GOAL_N] or rows[-1:]
    for r in judged:
        small = "" if r["n"] == GOAL_N else f" (N={r['n']}, not {GOAL_N})"
        took = statistics.median(r["verify"])
        print(f"goal (issue 51): cluster verify on {GOAL_N} hosts within {GOAL_S:g} s: "
              f"{took:.2f} s{small}: {'PASS' if took <= GOAL_S else 'MISS'}")


@ends_in_one_line("verify")
def main() -> int:
    parser = BadInput(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=numbers(1, 100, "host counts"), default=[3, GOAL_N],
                        metavar="N,N", help=f"hosts (default 3,{GOAL_N})")
    parser.add_argument("--runs", type=whole(1, 50, "runs"), default=5, metavar="K",
                        help="timed runs of each command per size (default 5)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"N={SMOKE['sizes'][0]}, {SMOKE['runs']} runs: every path")
    args = parser.parse_args()
    sizes = SMOKE["sizes"] if args.smoke else sorted(set(args.sizes))
    runs = SMOKE["runs"] if args.smoke else args.runs
    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    members = store = None
    peers: list = []
    listeners: list[socket.socket] = []
    try:
        with held():
            members = EtcdCluster(os.path.join(work, "etcd"), 3)
            members.start()
        store = Store(members.urls, CLUSTER)
        rows = []
        for n in sizes:
            names = [f"v{i:02d}" for i in range(1, n + 1)]
            for name in names[len(peers):]:
                listeners.append(endpoint())
                remote = f"test+tcp://127.0.0.1:{listeners[-1].getsockname()[1]}/default"
                with held():
                    peers.append(start_peer(members.urls, CLUSTER, work, name,
                                            "test:///default",
                                            env={"PEERCTL_CONF": os.devnull,
                                                 "PEERCTL_LIBVIRT_REMOTE": remote,
                                                 "PEERCTL_MIGRATION_PORTS": str(free_port())},
                                            ttl=TTL))
            wait_for(lambda: ready_hosts(store, names) == set(names)
                     or any(p.poll() is not None for p in peers), timeout=300,
                     what=f"{n} peers alive with their inventories")
            if any(p.poll() is not None for p in peers):
                raise SystemExit("bench/verify.py: a peer exited; see its log in " + work)
            rows.append(one_size(n, members.urls, runs))
            print(f"N={n}: cluster verify {statistics.median(rows[-1]['verify']):.2f} s",
                  flush=True)
        report(rows, runs)
    finally:
        stop_processes(peers)
        for sock in listeners:
            sock.close()
        if store is not None:
            store.close()
        if members is not None:
            members.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(load_line(load_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
