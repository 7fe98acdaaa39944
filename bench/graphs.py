"""graphs benchmark: what a peer's graphs (engine/hypervisor/host/graphs.py)
cost in memory per VM and per host, and in time per sample and per read.

    python bench/graphs.py [--vms 1000] [--runs 11] [--smoke]

In this process, no peer, no libvirt: a book of one host and --vms VMs,
filled with an hour of synthetic samples (the hour's ring wrapped; the
memory is fixed when a VM's rings are made), then:

- memory: what the book holds (tracemalloc, after a collection), per VM
  (the book of --vms VMs less the book of none, over --vms) and per host
  (the book of none: the host's own series and the book itself), beside
  the values alone (the rings' floats);
- time: one sample of the host and every VM put (what the sampler's
  thread does every 10 s besides reading psutil and libvirt), and one
  VM's hour and day read as the API answers them; medians over --runs.

Targets, each printed with PASS or MISS: at most 20 KB per VM, and a
sample of 1,000 VMs put in under 1 % of the 10 s step (100 ms; the figure
for --vms VMs is scaled to 1,000).  ``--smoke``: 50 VMs, 3 runs.  Bad
options: one line, exit 2.  It starts no process and writes no file.
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

from bench.options import BadInput, positive  # noqa: E402
from engine.hypervisor.host.graphs import STEP, Graphs, Reading  # noqa: E402

PER_VM_TARGET = 20 * 1024       # bytes
PUT_TARGET = 0.01 * STEP        # seconds for a sample of 1,000 VMs
SMOKE = {"vms": 50, "runs": 3}
T0 = 1_800_000_000.0


def reading(i: int, n: int) -> Reading:
    return Reading(cpu_s=n * 3.0, cpus=2, mem_bytes=(1 << 30) + n, disk_read=n * 4096.0,
                   disk_written=n * 8192.0, net_rx=n * 1500.0, net_tx=n * 900.0 + i)


def sample(graphs: Graphs, uuids: list[str], n: int) -> None:
    graphs.put(T0 + STEP * n, reading(0, n), {u: reading(i, n) for i, u in enumerate(uuids)})


def book(vms: int, samples: int) -> Graphs:
    uuids = [f"{i:08d}-0000-4000-8000-000000000000" for i in range(vms)]
    graphs = Graphs("host1")
    for n in range(samples):
        sample(graphs, uuids, n)
    return graphs


def held(vms: int) -> int:
    """Bytes a book of ``vms`` VMs holds once made and filled (two samples:
    its size is fixed when made)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        graphs = book(vms, 2)
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del graphs
    return size


def main() -> int:
    parser = BadInput(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=positive, default=1000)
    parser.add_argument("--runs", type=positive, default=11,
                        help="medians over them (default 11)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"{SMOKE['vms']} VMs, {SMOKE['runs']} runs")
    options = parser.parse_args()
    if options.smoke:
        options.vms, options.runs = SMOKE["vms"], SMOKE["runs"]
    host = held(0)
    per_vm = (held(options.vms) - host) / options.vms
    values = Graphs("host1")._host.history.bytes()
    samples = int(3600 // STEP) + 1     # an hour and a step: the hour's ring wrapped
    graphs = book(options.vms, samples)
    uuids = sorted(graphs.vms())
    puts, reads = [], []
    for run in range(options.runs):
        n = samples + run
        started = time.perf_counter()
        sample(graphs, uuids, n)
        puts.append(time.perf_counter() - started)
        started = time.perf_counter()
        for span in ("hour", "day"):
            graphs.vm_series(uuids[0], span, T0 + STEP * n)
        reads.append(time.perf_counter() - started)
    put = statistics.median(puts)
    scaled = put * 1000 / options.vms
    print(f"1 host and {options.vms} VMs, the hour wrapped; medians of {options.runs} runs")
    print(f"  memory per VM {per_vm / 1024:.1f} KB ({values / 1024:.1f} KB of it values)")
    print(f"  memory per host {host / 1024:.1f} KB (its own series and the book)")
    print(f"  a sample of {options.vms} VMs put {put * 1000:.2f} ms "
          f"({scaled * 1000:.2f} ms for 1,000)")
    print(f"  a VM's hour and day read {statistics.median(reads) * 1000:.2f} ms")
    print("targets:")
    print(f"  at most {PER_VM_TARGET // 1024} KB per VM ({per_vm / 1024:.1f} KB): "
          f"{'PASS' if per_vm <= PER_VM_TARGET else 'MISS'}")
    print(f"  a sample of 1,000 VMs under {PUT_TARGET * 1000:.0f} ms ({scaled * 1000:.1f} ms): "
          f"{'PASS' if scaled < PUT_TARGET else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
