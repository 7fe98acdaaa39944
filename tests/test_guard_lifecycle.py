"""The guard's own life (engine/hypervisor/ha/guard.py): it backs off while
libvirt does not answer and says so once, not at every poll; it exits once
its peer is gone for good (a zombie included) and nothing is left to fence;
``down`` stops it by its recorded PID, never another process.

The peer is a stand-in (``sleep``) named by a heartbeat file the test
writes, as a peer does after each lease renewal; the hypervisor is a
private libvirtd serving libvirt's test driver, stopped and started again
under the guard."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from urllib.parse import quote

import pytest

from engine.hypervisor.ha import guard
from engine.hypervisor.local.daemons import PrivateLibvirtd
from tests.support import wait_for
from tests.support.libvirtd_pair import cannot_run_reason

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def beat(state_dir, pid, until):
    """What a peer writes after a renewal: its lease holds until ``until``."""
    os.makedirs(os.path.join(state_dir, "guard"), exist_ok=True)
    with open(os.path.join(state_dir, "guard", "heartbeat"), "w") as f:
        json.dump({"pid": pid, "started": guard._start_time(pid), "until": until}, f)


def start_guard(state_dir, uri):
    log = open(os.path.join(state_dir, "guard.out"), "ab")
    process = subprocess.Popen([sys.executable, "-m", "engine.hypervisor.ha.guard",
                                "--state-dir", state_dir, "--host", "h1", "--libvirt", uri],
                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    log.close()
    wait_for(lambda: "guard started" in said(state_dir), what="the guard started")
    return process


def said(state_dir) -> str:
    try:
        with open(os.path.join(state_dir, "guard.out")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def events(state_dir, event) -> list[str]:
    return [line for line in said(state_dir).splitlines() if f" guard {event}" in line]


@pytest.fixture
def daemon():
    why = cannot_run_reason()
    if why is not None:
        pytest.skip(why)
    base = os.path.realpath(tempfile.mkdtemp(prefix="pc-guard-", dir="/var/tmp"))
    daemon = PrivateLibvirtd(base, "d").start()
    daemon.test_uri = f"test+unix:///default?socket={quote(daemon.socket, safe='/')}"
    yield daemon
    daemon.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow       # a long scenario: libvirt away for a backoff's whole climb
def test_a_guard_backs_off_while_libvirt_is_away_and_exits_once_its_peer_is_a_zombie(
        daemon, tmp_path):
    state_dir = str(tmp_path / "h1")
    peer = subprocess.Popen(["sleep", "300"])           # reaped only at the end
    try:
        beat(state_dir, peer.pid, time.monotonic() - 1)     # the lease may lapse: fence duty
        watchdog = start_guard(state_dir, daemon.test_uri)
        daemon.stop()
        wait_for(lambda: events(state_dir, "libvirt_unreachable"), timeout=10,
                 what="the guard noticing libvirt is gone")
        time.sleep(4)       # an observation window: a guard polling every 0.2 s tries 20 times
        assert len(events(state_dir, "libvirt_unreachable")) == 1, said(state_dir)
        assert watchdog.poll() is None      # its peer lives (hung, say): it stays on duty
        daemon.start()
        (back,) = wait_for(lambda: events(state_dir, "libvirt_reachable"), timeout=10,
                           what="the guard reaching libvirt again")
        attempts = int(re.search(r"attempts=(\d+)", back).group(1))
        assert 3 <= attempts <= 8, back         # 0.2, 0.4, 0.8, 1.6, 2, 2 s apart

        # the peer dies and its parent never reaps it: a zombie is no peer
        peer.kill()
        assert watchdog.wait(timeout=20) == 0
        assert events(state_dir, "peer_gone") and \
            "no peer and nothing to fence" in events(state_dir, "exiting")[0], said(state_dir)
        assert len(events(state_dir, "libvirt_unreachable")) == 1
    finally:
        peer.kill()
        peer.wait()


def test_down_stops_a_guard_by_its_pid_and_nothing_else(tmp_path):
    state_dir = str(tmp_path / "h1")
    beat(state_dir, os.getpid(), time.monotonic() + 600)
    unreachable = f"qemu+unix:///system?socket={tmp_path}/no-such-socket"
    watchdog = start_guard(state_dir, unreachable)
    # another process behind the recorded pid is never signalled
    stranger = subprocess.Popen(["sleep", "300"])
    pid_file = os.path.join(state_dir, "guard", "pid")
    try:
        with open(pid_file, "w") as f:
            json.dump(stranger.pid, f)
        assert guard.stop_guard(state_dir) == (stranger.pid, "not running")
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
    with open(pid_file, "w") as f:
        json.dump(watchdog.pid, f)
    assert guard.stop_guard(state_dir) == (watchdog.pid, "stopped")
    assert watchdog.wait(timeout=5) == 0
    assert "guard stopped why=SIGTERM" in said(state_dir)
    assert guard.stop_guard(state_dir) == (watchdog.pid, "not running")
