"""bench/placement.py runs, small, from end to end.

``--smoke`` takes etcd's paths of the benchmark (its own etcd, claimer
processes racing on fresh providers round after round, the overcommit read
back, candidates timed at 1,000 providers) and must end well, printing each
figure, with its verdict where it has a target, and leave nothing behind:
no work directory, no claimer, no etcd.  OpenStack Placement takes seconds
to start and warm up: the smoke run prints its comparison as skipped.
Whether a target is met is the benchmark's answer, never this test's.
"""
from __future__ import annotations

import os

import pytest

from tests.support import ROOT
from tests.support.bench_runs import VERDICT, run_refused, run_smoke

BENCH = os.path.join(ROOT, "bench", "placement.py")
TIMEOUT = 120
WORK = "peerctl-bplacement-"     # the benchmark's work directory, under /var/tmp
FIGURES = {
    "claims/s": r"^claims/s, median of 2 rounds +[0-9.]+$",
    "rounds": r"^claims/s, round by round +[0-9]+ [0-9]+$",
    "CPU": r"^CPU ms per claim, claimers \(median\) +[0-9.]+$",
    "latency": r"^candidates median ms \(1000 providers\) +[0-9.]+$",
    "load": r"^machine: before load average [0-9. ]+; after load average [0-9. ]+$",
    "claims verdict": r"^  claims: etcd [0-9]+/s, Placement not run \(target >= 30x\): skipped$",
    "candidates verdict": r"^  candidates: etcd median [0-9.]+ ms at 1000 providers "
                          r"\(target <= 2 ms\): " + VERDICT,
    "overcommit verdict": r"^  overcommit: etcd worst [+-][0-9]+ over capacity in 2 race\(s\) "
                          r"\(target 0\): " + VERDICT,
}


def test_the_smoke_run_prints_every_figure_with_its_verdict_and_leaves_nothing_behind():
    printed = run_smoke(BENCH, FIGURES, WORK, TIMEOUT)
    assert "overcommit: etcd worst +0 " in printed, printed     # a wrong answer, not a speed


@pytest.mark.parametrize("args, line", [
    (["--rounds", "0"], "bench/placement.py: argument --rounds: '0' is less than 1"),
    (["--big", "1000,x"], "bench/placement.py: argument --big: not a list of provider counts "
                          "of at least 20 (the query's limit): '1000,x'"),
    (["--smokes"], "bench/placement.py: unrecognized arguments: --smokes")])
def test_bad_options_give_one_line_and_start_nothing(args, line):
    run_refused(BENCH, args, line, WORK)


def test_the_postgresql_the_full_run_compares_with_starts_in_a_root_only_directory(tmp_path):
    """The full run's PostgreSQL (tests/support/postgres_server.py), in a
    work directory only root may enter, as the benchmark's and pytest's
    temporary directories are: initdb runs as ``postgres`` and must reach
    its data directory all the same."""
    from tests.support.postgres_server import PostgresServer, postgres_bin
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install -y postgresql)")
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    server = PostgresServer(str(work / "postgres")).start()
    try:
        assert server.create_database("placement").endswith(f":{server.port}/placement")
    finally:
        server.stop()
