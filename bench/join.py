"""``join``: from the token to a host serving, beside a plain peer start.

    python bench/join.py [--runs 3] [--smoke]

Against a TLS etcd of its own with roles (loopback), one peer ``h1`` serving
its API over HTTPS, each run: ``host add jN`` (as root) prints a token, and
``peerctl join TOKEN`` (a fresh process, as on a new machine) is timed from
its start until it exits with the host serving: the bundle redeemed, the
files written, the peer started drained, registered, ``cluster verify`` run
and the host undrained.  Beside it, in the same run and interleaved, the
reference: a plain ``peerctl peer`` of a host whose certificate and etcd
user were made beforehand, timed from its start until it is registered.
Each figure is the median, printed with the fastest and the slowest, and
the difference is join's own cost.

``--smoke``: 1 run.  Work under /var/tmp/peerctl-bjoin-*, removed at the end
with every process the run started, on error, SIGTERM and Ctrl-C too.  Bad
options: one line, exit 2, nothing started.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

from bench.options import BadInput, ends_in_one_line, held, whole  # noqa: E402
from bench.processes import load_line  # noqa: E402
from engine.core import api, certs  # noqa: E402
from tests.support import wait_for  # noqa: E402
from tests.support.cluster import stop_guard  # noqa: E402
from tests.support.secured_etcd import SecuredEtcd  # noqa: E402

SMOKE = {"runs": 1}
WORK = "peerctl-bjoin-"
PEERCTL = os.path.join(ROOT, "peerctl.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def stop(pid: int) -> None:
    """End a peer this run started, politely first."""
    for sig, within in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and not ended(pid):
            time.sleep(0.05)
        if ended(pid):
            return


def reference(secured, work: str, host: str, started: list) -> float:
    """Seconds from a plain peer's start to its host registered."""
    certs.issue(secured.tls, f"peer-{host}", "peer")
    from engine.core import auth
    auth.setup(secured.root, {f"peer-{host}": "peer"})
    began = time.monotonic()
    with held():
        process = secured.cluster.start_peer(host, env=secured.env(f"peer-{host}"), ttl=5)
        started.append(process.pid)
    wait_for(lambda: host in api.live_hosts(secured.root) or process.poll() is not None,
             timeout=120, what=f"{host} registered")
    took = time.monotonic() - began
    if process.poll() is not None:
        raise SystemExit(f"bench/join.py: the reference peer exited; see {work}/{host}.log")
    stop(process.pid)
    return took


def joined(secured, work: str, host: str, url: str, started: list) -> float:
    """Seconds from ``join TOKEN``'s start to its exit, the host serving."""
    added = secured.cli("root", "--format", "json", "host", "add", host, "--api", url)
    if added.returncode != 0:
        raise SystemExit(f"bench/join.py: host add failed: {added.stderr.strip()}")
    token = json.loads(added.stdout)["token"]
    where = os.path.join(work, host)
    env = {k: v for k, v in secured.cluster.env.items()
           if k not in ("PEERCTL_CACERT", "PEERCTL_CERT", "PEERCTL_KEY")}
    began = time.monotonic()
    with held():        # the peer join starts is on the list before the run can end
        done = subprocess.run([sys.executable, PEERCTL, "--format", "json", "join", token,
                               "--conf", os.path.join(where, "peerctl.conf"), "--state-dir",
                               os.path.join(where, "state"), "--libvirt", "test:///default"],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        took = time.monotonic() - began
        doc = json.loads(done.stdout) if done.stdout.strip() else {}
        pid = (doc.get("peer") or {}).get("pid")
        if pid:
            started.append(pid)
    if done.returncode != 0 or doc.get("state") != "serving":
        raise SystemExit(f"bench/join.py: join failed ({done.returncode}): "
                         f"{done.stderr.strip()[-400:]} {doc.get('problems')}")
    stop(pid)
    return took


def figure(values: list[float]) -> str:
    return (f"{statistics.median(values):6.2f} s (fastest {min(values):.2f}, slowest "
            f"{max(values):.2f})")


@ends_in_one_line("join")
def main() -> int:
    parser = BadInput(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=whole(1, 20, "runs"), default=3, metavar="K",
                        help="timed joins, and as many reference starts (default 3)")
    parser.add_argument("--smoke", action="store_true", help="1 run: every path")
    args = parser.parse_args()
    runs = SMOKE["runs"] if args.smoke else args.runs
    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    secured = None
    started: list[int] = []
    try:
        with held():
            secured = SecuredEtcd(pathlib.Path(work), peers=("h1",))
        port = free_port()
        with held():
            h1 = secured.cluster.start_peer("h1", env=secured.env("peer-h1"), ttl=5,
                                            extra_args=["--api", f"127.0.0.1:{port}",
                                                        "--api-cert", f"{secured.tls}/etcd.pem",
                                                        "--api-key",
                                                        f"{secured.tls}/etcd-key.pem"])
            started.append(h1.pid)
        wait_for(lambda: "h1" in api.live_hosts(secured.root) or h1.poll() is not None,
                 timeout=120, what="h1 alive")
        if h1.poll() is not None:
            raise SystemExit(f"bench/join.py: h1 exited; see {work}/h1.log")
        plain, joins = [], []
        for run in range(1, runs + 1):
            plain.append(reference(secured, work, f"r{run}", started))
            joins.append(joined(secured, work, f"j{run}", f"https://127.0.0.1:{port}",
                                started))
            print(f"run {run}: join {joins[-1]:.2f} s, plain peer start {plain[-1]:.2f} s",
                  flush=True)
        print(f"\n{'join, token to serving':<28} {figure(joins)}")
        print(f"{'plain peer start (same run)':<28} {figure(plain)}")
        print(f"join's own cost: {statistics.median(joins) - statistics.median(plain):.2f} s "
              f"(median of {runs} run{'s' if runs != 1 else ''} each, interleaved)")
    finally:
        for pid in started:
            stop(pid)
        for guard in pathlib.Path(work).glob("**/guard/pid"):     # each peer's HA guard
            stop_guard(guard.parent.parent)
        if secured is not None:
            secured.close()
        shutil.rmtree(work, ignore_errors=True)
    print(load_line(load_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
