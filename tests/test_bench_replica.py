"""bench/replica.py runs, small, from end to end (QEMU/KVM tier).

``--smoke`` takes every path of the benchmark (two private daemons, peers,
a real guest writing to its disk and replicated every 10 s, two SIGKILLs of
its host's peer with HA restarts from its replica, one way then the other,
an HA restart of a second guest from its image, the killed peers started
again and their disks kept aside deleted) and must end well, printing a
verdict for each target and leaving nothing behind.  Whether a target is
met is the benchmark's answer, never this test's: speed is not asserted
here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support import qemu_guest
from tests.support.bench_leftovers import leftovers
from tests.support.libvirtd_pair import cannot_run_reason

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

BENCH = os.path.join(ROOT, "bench", "replica.py")
TIMEOUT = 420
VERDICTS = {"recovery point": re.compile(r"^  recovery point: median [0-9.]+ s, max [0-9.]+ s "
                                         r"over 2 kill\(s\) \(target <= 15 s, .*\): "
                                         r"(PASS|MISS)$", re.M),
            "restart": re.compile(r"^  restart from a replica: [0-9.]+ s vs from the image "
                                  r"[0-9.]+ s, .*\(target <= x1\.5\): (PASS|MISS)$", re.M),
            "bytes per update": re.compile(r"^  bytes per update: .* = x[0-9.]+ ", re.M),
            "update back": re.compile(r"^  replica update after an HA restart from the replica: "
                                      r"[0-9.]+ MB sent for [0-9.]+ MB .*\(target <= x1\.1\): "
                                      r"(PASS|MISS)$", re.M),
            "after a move": re.compile(r"^  replica update after a move onto the replica's "
                                       r"host: (delta|full|incremental), [0-9.]+ MB sent", re.M)}
WORK = "peerctl-brep-"           # the benchmark's work directories, under /var/tmp


def test_the_smoke_run_prints_a_verdict_for_each_target_and_leaves_nothing_behind():
    why = qemu_guest.skip_reason() or cannot_run_reason()
    if why is not None:
        pytest.skip(why)
    before = leftovers(WORK)
    done = subprocess.run([sys.executable, BENCH, "--smoke"], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    for target, verdict in VERDICTS.items():
        assert verdict.search(done.stdout), f"no verdict for {target}: {done.stdout[-2000:]}"
    kills = re.findall(r"^kill \d: (host\d) -> (host\d) .* recovery point [0-9.]+ s ",
                       done.stdout, re.M)
    assert kills == [("host1", "host2"), ("host2", "host1")], done.stdout
    assert re.search(r"^image restart 1: (host\d) -> (host\d) \| fenced [0-9.]+ s, running "
                     r"[0-9.]+ s, ready ", done.stdout, re.M), done.stdout
    assert leftovers(WORK) - before == set(), "the benchmark left these behind"


@pytest.mark.parametrize("args, line", [
    (["--kills", "0"], "bench/replica.py: argument --kills: '0' is less than 1"),
    (["--every", "5s"], "bench/replica.py: argument --every: '5s' is less than 10 s, "
                        "replicas' shortest interval"),
    (["--every", "soon"], "bench/replica.py: argument --every: 'soon' is not a number of "
                          "seconds")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    done = subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [line]
