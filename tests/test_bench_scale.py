"""bench/scale.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, a real peer and
3 light peers that write their host records by the real peer's rule, the
costs per host, the projection to 1,000 hosts with the history per hour
beside its target, then 3 real peers idle, with VMs and booting, and the
idle history by part from a watch of every key) and must end well, printing
each figure, and leave nothing behind: no work directory, no peer, no light
worker, no etcd.  Whether the target is met is the benchmark's answer, never
this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "scale.py")
TIMEOUT = 120
WORK = "peerctl-bscale-"        # the benchmark's work directory, under /var/tmp
NUMBER = r"[0-9.]+"
FIGURES = {
    "step": rf"^ +4 hosts +6 VMs: +{NUMBER} keys +{NUMBER} writes/s +{NUMBER} watchers db "
            rf"+{NUMBER} MiB +{NUMBER} B/host +{NUMBER} B/VM +vmlist +{NUMBER} ms",
    "linear": r"^  writes_per_s .* ×[0-9.]+ (linear|GROWS)$",
    "history": rf"^  history per hour +{NUMBER} MiB/h projected at 1000 hosts \(target <= 50 "
               rf"MiB/h; reference: every record rewritten every 5 s, {NUMBER} MiB/h; host "
               rf"records of [0-9]+ B, light ones [0-9]+ B; gauges moving every tick\): "
               + VERDICT,
    "idle": rf"^  idle, no VM +{NUMBER} writes/s per host +\(reference: the record rewritten "
            r"every 5 s, 0\.20\)$",
    "lifecycle": rf"^  busy +{NUMBER} writes/s, -?[0-9]+ writes per VM booted and destroyed",
    "by part": r"^  idle history by part \(2 VMs, 1 s; key, value and 100 B a revision\), "
               r"per host per hour: ",
}


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_the_smoke_run_prints_every_figure_and_leaves_nothing_behind():
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--hosts", "3,x"], "bench/scale.py: argument --hosts: not a rising list of host counts: "
                         "'3,x'"),
    (["--hosts", "100,50"], "bench/scale.py: argument --hosts: not a rising list of host "
                            "counts: '100,50'"),
    (["--window", "0"], "bench/scale.py: argument --window: not a positive number: '0'"),
    (["--smokes"], "bench/scale.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
