"""bench/install.py runs, small, from end to end.

``--smoke`` builds the .deb with its one command, boots one fresh bookworm
under systemd-nspawn, installs the package, starts its unit and waits for
the host listed alive: it must end well, print its row and the figure
beside the package's size, and leave nothing behind (no work directory,
no container, no etcd).  How fast it is stays the bench's answer.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import run_refused, run_smoke
from tests.support.nspawn import why_not

BENCH = os.path.join(ROOT, "bench", "install.py")
WORK = "peerctl-binstall-"
NUMBER = r"[0-9]+\.[0-9]+"
FIGURES = {
    "size": r"^\.deb peerctl_\S+_amd64\.deb: " + NUMBER + r" MiB \(installed size in its "
            r"control file: [0-9]+ MiB\)$",
    "row": rf"^ +1 +{NUMBER} +{NUMBER} +{NUMBER}$",
    "figure": rf"^from apt install to benchhost listed alive: {NUMBER} s \(median of 1\), "
              rf"beside the package's {NUMBER} MiB; apt's own share {NUMBER} s, the peer's "
              rf"start to listed -?{NUMBER} s \(same run\)$",
}


@pytest.mark.qemu
def test_the_smoke_run_prints_every_figure_and_leaves_nothing_behind():
    reason = why_not()
    if reason:
        pytest.skip(reason)
    run_smoke(BENCH, FIGURES, WORK, 600)


@pytest.mark.parametrize("args, line", [
    (["--runs", "0"], "bench/install.py: argument --runs: fresh machines from 1 to 20: '0'"),
    (["--runs", "x"], "bench/install.py: argument --runs: 'x' is not a whole number"),
    (["--smokes"], "bench/install.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)
