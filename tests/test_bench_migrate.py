"""bench/migrate.py runs, small, from end to end (QEMU/KVM tier).

``--smoke`` takes every path of the benchmark (two private daemons, a peer
on each, a real guest moved by peerctl's ``migrate`` and a second one by
libvirt's migrateToURI3 with the same downtime plan and once more with the
ceiling alone, one hop each way, peerctl's default maximum downtime on
all) and must end well, printing each hop and a verdict for
each target, and leave nothing behind.  Whether a target is met is the
benchmark's answer, never this test's: speed is not asserted here.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support import qemu_guest
from tests.support.bench_runs import VERDICT, run_refused, run_smoke
from tests.support.libvirtd_pair import cannot_run_reason

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

BENCH = os.path.join(ROOT, "bench", "migrate.py")
WORK = "peerctl-bmig-"           # the benchmark's work directories, under /var/tmp
TIMEOUT = 300
FIGURES = {
    "hop": r"^hop 1 -> host2: peerctl [\d.]+s .* \d+ ms down, .* \| direct [\d.]+s \d+ ms down"
           r".* \| direct at the ceiling \d+ ms down",
    "total time": r"^  total time: peerctl [\d.]+ s vs direct libvirt [\d.]+ s = x[\d.]+ "
                  r"\(target <= x1\.1\): " + VERDICT,
    "downtime": r"^  downtime: peerctl \d+ ms with --max-downtime 100 .*"
                r"\(target <= 50 ms\): " + VERDICT,
    "downtime against direct": r"^  downtime against direct: peerctl \d+ ms vs direct "
                               r"libvirt \d+ ms, same run, same max downtime "
                               r"\(target <= direct \+ 10 ms\): " + VERDICT,
    "reference at the ceiling": r"^  \(reference: direct libvirt with 100 ms as QEMU's only "
                                r"limit from the start, no plan: \d+ ms, same run\)",
    "load": r"^load average before [\d.]+ [\d.]+ [\d.]+, after ",
}


def test_the_smoke_run_moves_both_guests_each_way_and_prints_every_verdict():
    why = qemu_guest.skip_reason() or cannot_run_reason()
    if why is not None:
        pytest.skip(why)
    out = run_smoke(BENCH, FIGURES, WORK, TIMEOUT)
    assert "hop 2 -> host1: " in out, out


@pytest.mark.parametrize("args, line", [
    (["--rounds", "0"], "bench/migrate.py: argument --rounds: '0' is less than 1"),
    (["--max-downtime", "0"], "bench/migrate.py: argument --max-downtime: must be a whole "
                              "number of milliseconds from 1 to 10000: '0'"),
    (["--sizes", "10"], "bench/migrate.py: unrecognized arguments: --sizes 10"),
])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
