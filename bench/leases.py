"""Lease admission benchmark: creates per second, and what the calendar
check costs as leases grow.

    python bench/leases.py [--hosts 100] [--base 1000] [--creates 200]
                           [--checkpoints 100,300,1000,3000] [--samples 40] [--smoke]

In one run, against its own etcd and the etcd placement backend:
- ``--hosts`` host providers (VCPU 32, 128 GiB, 2 TB) with live host records;
- leases granted over a year (start anywhere in 365 days, 1 hour to 7 days
  long; host leases of 1-2 hosts and capacity leases of 1-8 slots of
  VCPU:2,MEMORY_MB:4096,DISK_GB:20) until ``--base`` are granted, then
  ``--creates`` more timed one after another: creates/s with ``--base``
  leases already granted;
- at each checkpoint (total granted), ``--samples`` checks of a random
  one-day window (the calendar read and the fit, what every grant does
  before writing): the median time, the leases read (those in the window's
  weeks) and the time per lease read.

There is no fixed target; the reference is "the check grows no faster than
the leases that overlap the window": the line at the end compares the time
per lease read at the last checkpoint with the first (PASS within 1.5x the growth of
the leases read, while the total grows many times more).

``--smoke``: 5 hosts, 20 creates after 50 leases, checkpoints 30 and 120,
5 samples each: every path in a few seconds.  Bad options: one line, exit
2, nothing started.  etcd runs in /var/tmp/peerctl-bleases-*, removed at
the end, on error too.  Not a test: figures depend on the machine.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import structlog  # noqa: E402

from bench.options import BadInput, positive  # noqa: E402
from engine.core import keys  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.store import Store  # noqa: E402
from engine.errors import Refused  # noqa: E402
from engine.leases import admission  # noqa: E402
from engine.placement import open_placement  # noqa: E402

WORK = "peerctl-bleases-"   # the work directory's prefix, under /var/tmp
SLOT = {"VCPU": 2, "MEMORY_MB": 4096, "DISK_GB": 20}
YEAR = 365 * 86400
SMOKE = {"hosts": 5, "base": 50, "creates": 20, "checkpoints": [30, 120], "samples": 5}


def checkpoints(text: str) -> list[int]:
    """Two or more totals of leases granted, ascending once sorted."""
    try:
        values = sorted({positive(v) for v in text.split(",")})
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not a list of lease counts: {text!r}") from None
    if len(values) < 2:
        raise argparse.ArgumentTypeError(f"want two lease counts or more: {text!r}")
    return values


def setup_hosts(store, placement, count: int) -> None:
    lease = store.grant(YEAR)       # live hosts are records a lease holds
    for i in range(count):
        name = f"host{i:03d}"
        rp = placement.ensure_provider(name)
        placement.set_inventory(rp["uuid"], {"VCPU": 32, "MEMORY_MB": 131072,
                                             "DISK_GB": 2000})
        store.put(keys.host(name), {"host": name}, lease)


def random_lease(rng: random.Random, name: str, now: float) -> dict:
    start = now + 60 + rng.uniform(0, YEAR - 8 * 86400)
    end = start + rng.uniform(3600, 7 * 86400)
    if rng.random() < 0.5:
        return {"lease": name, "kind": "hosts", "count": rng.randint(1, 2),
                "start": start, "end": end}
    return {"lease": name, "kind": "capacity", "resources": SLOT,
            "amount": rng.randint(1, 8), "start": start, "end": end}


class Granter:
    def __init__(self, store, placement, seed=7):
        self.store, self.placement = store, placement
        self.rng = random.Random(seed)
        self.granted = self.refused = 0
        self.now = time.time()

    def one(self) -> float:
        lease = random_lease(self.rng, f"l{self.granted + self.refused:06d}", self.now)
        began = time.perf_counter()
        try:
            admission.grant(self.store, self.placement, lease, now=self.now)
            self.granted += 1
        except Refused:
            self.refused += 1
        return time.perf_counter() - began

    def up_to(self, total: int) -> None:
        while self.granted < total:
            self.one()


def check_cost(store, placement, rng, samples: int, now: float) -> tuple[float, float]:
    """Median seconds of one window check, and the median leases it read."""
    times, read = [], []
    for _ in range(samples):
        start = now + 60 + rng.uniform(0, YEAR - 8 * 86400)
        lease = {"lease": "probe", "kind": "capacity", "resources": SLOT, "amount": 1,
                 "start": start, "end": start + 86400}
        began = time.perf_counter()
        hosts = admission._cluster(store, placement, lease)
        found, active, _, _ = admission._window(store, start, start + 86400)
        admission._fit(lease, hosts, list(found.values()), active)
        times.append(time.perf_counter() - began)
        weeks = admission._weeks(start, start + 86400)
        read.append(sum(len(store.range(keys.lease_calendar(w), keys_only=True)[0])
                        for w in weeks))
    return statistics.median(times), statistics.median(read)


def timed_creates(granter: Granter, base: int, count: int) -> str:
    granter.up_to(base)
    began = time.perf_counter()
    for _ in range(count):
        granter.one()
    took = time.perf_counter() - began
    return (f"creates: {count} in {took:.2f}s = {count / took:.0f} creates/s with {base} "
            f"leases granted over the hosts ({granter.refused} of "
            f"{granter.granted + granter.refused} refused so far)")


def main() -> int:
    parser = BadInput(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=positive, default=100)
    parser.add_argument("--base", type=positive, default=1000,
                        help="leases granted before the timed creates")
    parser.add_argument("--creates", type=positive, default=200)
    parser.add_argument("--checkpoints", type=checkpoints, default=[100, 300, 1000, 3000],
                        metavar="N,N", help="totals granted at which the check is timed")
    parser.add_argument("--samples", type=positive, default=40,
                        help="window checks timed at each checkpoint")
    parser.add_argument("--smoke", action="store_true",
                        help="5 hosts, 50 + 20 leases, checkpoints 30,120, 5 samples")
    args = parser.parse_args()
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    work = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    server = None
    try:
        server = EtcdServer(os.path.join(work, "etcd")).start()
        store = Store(server.url, "bench")
        placement = open_placement(None, store)
        setup_hosts(store, placement, args.hosts)
        granter = Granter(store, placement)
        rng = random.Random(11)

        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"{'granted':>8} {'check (median)':>15} {'leases read':>12} "
              f"{'per lease read':>15}")
        rows, creates = [], None
        for total in args.checkpoints:
            if creates is None and total > args.base:
                creates = timed_creates(granter, args.base, args.creates)
            granter.up_to(total)
            cost, read = check_cost(store, placement, rng, args.samples, granter.now)
            rows.append((total, cost, read))
            print(f"{total:>8} {cost * 1000:>12.2f} ms {read:>12.0f} "
                  f"{cost / max(read, 1) * 1e6:>12.1f} us")
        if creates is None:
            creates = timed_creates(granter, args.base, args.creates)
        print(creates)
        first, last = rows[0], rows[-1]
        cost_growth = last[1] / first[1]
        read_growth = max(1.0, last[2] / max(first[2], 1))
        verdict = "PASS" if cost_growth <= 1.5 * read_growth else "MISS"
        print(f"\nreference: the check grows no faster than the leases in its window: "
              f"from {first[0]} to {last[0]} leases granted (x{last[0] / first[0]:.0f}) "
              f"the leases read grew x{read_growth:.1f} and the check x{cost_growth:.1f} "
              f"(allowed: x{1.5 * read_growth:.1f}): {verdict}")
        placement.close()
        store.close()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
