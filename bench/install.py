"""From ``apt install ./peerctl_*.deb`` to the host listed alive, on a fresh
Debian machine under a real systemd.

    python bench/install.py [--runs N] [--smoke]

Builds the package once with its one command (``packaging/deb/build``),
then for each run boots a throw-away copy of a debootstrapped bookworm
under ``systemd-nspawn`` (tests/support/nspawn.py: systemd is its PID 1, it
shares this machine's loopback), and times, from ``apt-get install`` of
the .deb: apt done; ``systemctl enable --now peerctl`` returned (the unit
is ``Type=notify``, so that is the peer's ``READY=1``); and the host listed
alive by ``peerctl hostlist`` run inside it.  The peer joins an etcd this
bench starts on loopback and drives libvirt's test driver, so nothing but
the package is measured.  Each figure is printed beside the package's size
(issue 50 asks for the seconds beside it) and beside the run's own
``apt-get install`` share, measured in the same run.

``--smoke``: one run; every path, for tests/test_bench_install.py.  The
bookworm tree must have been built (``python -m tests.support.nspawn
build``, done by .ci/setup.sh); without it the bench says why in one line
and exits 1.  Everything it starts (etcd, the container) is gone at the
end, Ctrl-C and SIGTERM included.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

from bench.options import BadInput, whole  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from tests.support.nspawn import Machine, why_not  # noqa: E402

BUILD = os.path.join(ROOT, "packaging", "deb", "build")
WORK = "peerctl-binstall-"
HOST = "benchhost"
CLUSTER = "binstall"


def build(out: str) -> str:
    done = subprocess.run(["bash", BUILD, out], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"bench/install.py: packaging/deb/build failed: "
                         f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return done.stdout.strip().splitlines()[-1]


def one_run(deb: str, etcd_url: str) -> dict:
    """Boot a fresh machine, install, start, wait until listed: the times."""
    with Machine(name="peerctl-bench") as machine:
        inside = "/root/" + os.path.basename(deb)
        machine.copy_in(deb, inside)
        began = time.monotonic()
        machine.run("apt-get install -y -q --no-install-recommends " + shlex.quote(inside),
                    timeout=300)
        installed = time.monotonic()
        machine.run("cat > /etc/peerctl/peerctl.conf", input=(
            f"[peerctl]\netcd = {etcd_url}\ncluster = {CLUSTER}\nhost = {HOST}\n"
            "libvirt = test:///default\nttl = 5\n"))
        machine.run("systemctl enable --now peerctl.service", timeout=180)
        ready = time.monotonic()
        deadline = ready + 120
        while True:
            done = machine.run(f"peerctl --format json hostlist {HOST}", check=False,
                               timeout=60)
            if done.returncode == 0 and any(h.get("alive") for h in json.loads(done.stdout)):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"bench/install.py: {HOST} not listed alive 120 s after "
                                 "its unit was ready")
            time.sleep(0.1)
        listed = time.monotonic()
        machine.run("systemctl stop peerctl.service", timeout=200)
    return {"apt": installed - began, "ready": ready - began, "listed": listed - began}


def report(deb: str, rows: list[dict]) -> None:
    size = os.path.getsize(deb) / 2 ** 20
    print(f"\n.deb {os.path.basename(deb)}: {size:.1f} MiB "
          f"(installed size in its control file: {installed_size(deb)})")
    print(f"\n{'run':>4} {'apt install s':>14} {'unit ready s':>13} {'listed alive s':>15}")
    for i, r in enumerate(rows, 1):
        print(f"{i:>4} {r['apt']:14.1f} {r['ready']:13.1f} {r['listed']:15.1f}")
    median = {k: statistics.median(r[k] for r in rows) for k in ("apt", "ready", "listed")}
    print(f"\nfrom apt install to {HOST} listed alive: {median['listed']:.1f} s (median of "
          f"{len(rows)}), beside the package's {size:.1f} MiB; apt's own share "
          f"{median['apt']:.1f} s, the peer's start to listed "
          f"{median['listed'] - median['apt']:.1f} s (same run)")


def installed_size(deb: str) -> str:
    done = subprocess.run(["dpkg-deb", "-f", deb, "Installed-Size"], capture_output=True,
                          text=True)
    kib = done.stdout.strip()
    return f"{int(kib) / 1024:.0f} MiB" if kib.isdigit() else "?"


def main() -> int:
    parser = BadInput(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=whole(1, 20, "fresh machines"), default=3, metavar="N",
                        help="fresh machines, one install each (1 to 20, default 3)")
    parser.add_argument("--smoke", action="store_true", help="one run: every path")
    args = parser.parse_args()
    reason = why_not()
    if reason:
        print(f"bench/install.py: cannot boot a machine here: {reason}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda _signo, _frame: sys.exit(
        "bench/install.py: terminated (everything it started is gone)"))
    work = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    etcd = None
    try:
        deb = build(os.path.join(work, "dist"))
        etcd = EtcdServer(os.path.join(work, "etcd")).start()
        rows = []
        for n in range(1 if args.smoke else args.runs):
            rows.append(one_run(deb, etcd.url))
            print(f"run {n + 1}: listed alive {rows[-1]['listed']:.1f} s after apt install",
                  flush=True)
        report(deb, rows)
    except KeyboardInterrupt:
        raise SystemExit("bench/install.py: interrupted (everything it started is gone)") \
            from None
    except AssertionError as exc:       # a command in the machine failed
        raise SystemExit(f"bench/install.py: {str(exc).splitlines()[0]}") from None
    finally:
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
