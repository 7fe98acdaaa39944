"""bench/backup.py runs, small, from end to end (QEMU/KVM tier).

``--smoke`` takes every path of the benchmark (two private daemons, peers,
a real guest writing to its disk, a full backup against ``qemu-img
convert``, an incremental after 1 % of the disk changed, the first backup
after a live migration beside an incremental without one, a restore of a
full backup + 3 incrementals against ``qemu-img convert`` of the full) and
must end well,
printing a verdict for each target and leaving nothing behind.  Whether a
target is met is the benchmark's answer, never this test's: speed is not
asserted here.
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

BENCH = os.path.join(ROOT, "bench", "backup.py")
TIMEOUT = 480           # the smoke run moves the VM there and back too
VERDICTS = {"full backup rate": re.compile(r"^  full backup rate: .*x[0-9.]+ "
                                           r"\(target >= x0\.8\): (PASS|MISS)$", re.M),
            "incremental": re.compile(r"^  incremental after 1% of the disk changed: .*"
                                      r"\(target <= 10%\): (PASS|MISS)$", re.M),
            "after a move": re.compile(r"^  first backup after a live migration .*"
                                       r"\(target <= x1\.2\): (PASS|MISS)$", re.M),
            "restore": re.compile(r"^  restore of a full \+ 3 incrementals: .*x[0-9.]+ "
                                  r"\(target >= x0\.7\): (PASS|MISS)$", re.M)}


WORK = "peerctl-bbak-"           # the benchmark's work directories, under /var/tmp


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
    assert re.search(r"^round 1: disk data [1-9]\d* MB \| full backup .* incremental ",
                     done.stdout, re.M), done.stdout
    assert re.search(r"^restore round 1: a full \+ 3 incrementals .* restore [0-9.]+ s "
                     r"\(data steps [0-9.]+ s\), [1-9]\d* MB written", done.stdout, re.M), \
        done.stdout
    assert leftovers(WORK) - before == set(), "the benchmark left these behind"


def test_bad_options_give_one_line_and_start_nothing():
    done = subprocess.run([sys.executable, BENCH, "--rounds", "0"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == ["bench/backup.py: argument --rounds: '0' is less than 1"]
