"""bench/api.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, 200 VM records,
the API served in its process with the metrics cache, a fresh ``vmlist``
process, a client following ``/v1/events`` while VM records change, scrapes
of ``/metrics``, two peers on the test driver booting through the API and
through ``boot``) and must end well, printing each figure with its
verdict, the API's listing the same as the command line's, every event
received, and nothing left behind.  Whether a speed target is met is the
benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "api.py")
TIMEOUT = 120
WORK = "peerctl-bapi-"           # the benchmark's work directory, under /var/tmp
FIGURES = {
    "list": r"^list: GET /v1/vms [0-9.]+s vs vmlist --format json, fresh process [0-9.]+s "
            r"\(best of 2 each\) = x[0-9.]+ \(target <= x0\.5\): " + VERDICT,
    "same answer": r"^list: same answer, 200 rows: PASS$",
    "events": r"^events: 20 puts, etcd write -> SSE client p50 [0-9.]+ ms, p99 [0-9.]+ ms, "
              r"max [0-9.]+ ms vs a bare etcd watch in process p50/p99 [0-9.]+ / [0-9.]+ ms "
              r"\(target p99 <= 200 ms\): " + VERDICT,
    "metrics": r"^metrics: GET /metrics best [0-9.]+ ms, p99 [0-9.]+ ms over 5 scrapes vs "
               r"render\(\) in process [0-9.]+ ms \(target p99 <= 50 ms\): " + VERDICT,
    "boots": r"^boots: 1 boot\(s\) of 1 VM\(s\) each way: API [0-9.]+ VMs/s \(median boot "
             r"[0-9.]+s\) vs boot, fresh process [0-9.]+ VMs/s \(median [0-9.]+s\) = x[0-9.]+ "
             r"\(target >= x1\): " + VERDICT,
}


def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    printed = run_smoke(BENCH, FIGURES, WORK, TIMEOUT)
    assert "never arrived" not in printed, printed


@pytest.mark.parametrize("args, line", [
    (["--events", "0"], "bench/api.py: argument --events: '0' is less than 1"),
    (["--hosts", "1", "--vms-per-host", "5", "--events", "10"],
     "bench/api.py: --events 10 is more than the 5 VMs written")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
