"""bench/page.py runs, small, from end to end.

``--smoke`` takes every path of the benchmark (its own etcd, two peers on
the test driver, one serving the page, 50 VMs booted through the API,
chromium through Playwright timing the first render beside a fetch of the
list, the idle page's main thread and scroll, then VMs stopped and started
through the API while the same figures are taken again with the tab's
heap) and must end well, printing each figure beside its reference with
the verdict of each target, and leave nothing behind.  Whether a target is
met is the benchmark's answer, never this test's.  Skipped, saying why,
without chromium or Playwright.  A run stopped by SIGTERM once its peers
run says so in one line and leaves nothing behind either.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.api_server import browser_skip_reason
from tests.support.bench_runs import VERDICT, run_refused, run_smoke, run_terminated

BENCH = os.path.join(ROOT, "bench", "page.py")
TIMEOUT = 120
WORK = "peerctl-bpage-"         # the benchmark's work directory, under /var/tmp
N = r"[0-9]+\.[0-9]+"
FRAMES = rf"{N} ms \([0-9]+ frames at 60 Hz\) over [0-9]+ frames"
NONE = r"no frame \(the page did not answer in 60 s\)"
FIGURES = {
    "size": r"^50 VMs on [12] of 2 hosts, booted through the API in [0-9.]+ s; chromium "
            r"headless, 1 navigation\(s\), idle 2 s, then 10 VMs stopped or started a second",
    "first render": rf"^first render: 1 navigation\(s\) to a list of 50 VMs, the rows in "
                    rf"view drawn, in {N} s median \(fastest {N}, slowest {N}\) vs fetch and parse "
                    rf"GET /v1/vms in the same page {N} s \(target <= 1 s\): " + VERDICT,
    "main thread": rf"^main thread: busy {N}% over [0-9]+ s of 10 VMs stopped or started a "
                   rf"second \({N} VM record changes/s, {N} changes in {N} messages/s on the "
                   rf"stream, .*\) vs idle {N}% over [0-9]+ s at "
                   rf"{N} changes/s \(target <= 25%\): " + VERDICT,
    "scroll": rf"^scroll: p95 frame interval ({FRAMES} \([0-9]+ spanning more than 2\)|{NONE}) "
              rf"during the events vs idle ({FRAMES}|{NONE}) \(target <= 2 frames at 60 Hz, "
              rf"33\.3 ms, an interval counted to the nearest frame\): " + VERDICT,
    "memory": rf"^tab memory: JS heap ({N} MiB after [0-9]+ s of events vs {N} MiB (after the "
              rf"warm-up \([-+]{N}%; before any event {N} MiB|before the events \([-+]{N}%; "
              rf"none measured after the warm-up: no answer in 60 s); after GC; the page "
              rf"(caught up|still behind) [0-9]+ s after the events stopped\)|not measured "
              rf"after [0-9]+ s of events \(.*\)) \(target within ±10%\): " + VERDICT,
    "duration": r"^the issue asks for 60 minutes of events; this run had [0-9.]+ ",
    "cluster": r"^cluster: 2 peers on test:///default, host01 serving the page; 50 VMs",
    "load": r"^ran [0-9]+ s; load average \(1, 5, 15 min\): before ",
}


@pytest.mark.slow      # peers, a boot and a browser: 20 s or more here
def test_the_smoke_run_prints_every_figure_beside_its_reference_and_leaves_nothing_behind():
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    run_smoke(BENCH, FIGURES, WORK, TIMEOUT)


def test_a_run_terminated_midway_says_so_and_leaves_nothing_behind():
    run_terminated(BENCH, WORK, " peer ", TIMEOUT)


@pytest.mark.parametrize("args, line", [
    (["--peers", "0"], "bench/page.py: argument --peers: peers from 1 to 50: '0'"),
    (["--minutes", "x"], "bench/page.py: argument --minutes: 'x' is not a whole number"),
    (["--vms", "10", "--rate", "20"], "bench/page.py: --rate 20 is more than the 10 VMs"),
    (["--smokes"], "bench/page.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
