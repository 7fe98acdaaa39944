"""systemd's notify protocol, as a peer speaks it under ``Type=notify``
(docs/install.md, Units), and the unit files systemd would load.

The test binds a real AF_UNIX datagram socket and hands it to a real peer
as ``$NOTIFY_SOCKET``, as systemd does; ``SO_PASSCRED`` gives each message
its sender's PID, as systemd sees it.  The units under packaging/systemd/
are checked by ``systemd-analyze verify`` (systemd is installed here, not
PID 1: the booted-systemd proof is the .deb's)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from engine.core import api, keys
from engine.core import service_notify as notify
from engine.placement import open_placement
from tests.support import ROOT, TEST_AUTOMATIONS, wait_for
from tests.support.daemon_hosts import daemon_hosts  # noqa: F401  (a fixture)
from tests.support.releases import build_release

UNITS = os.path.join(ROOT, "packaging", "systemd")


class NotifySocket:
    """What systemd listens on: every message kept as ``(sender_pid,
    {KEY: value})``, in order."""

    def __init__(self, abstract: bool = False):
        self.dir = tempfile.mkdtemp(prefix="notify-", dir="/tmp")    # short: sun_path is 108 bytes
        self.name = (f"@peerctl-test-{uuid.uuid4().hex[:12]}" if abstract
                     else os.path.join(self.dir, "notify"))
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind("\0" + self.name[1:] if abstract else self.name)
        self.messages: list[tuple[int, dict]] = []

    @property
    def env(self) -> dict:
        return {"NOTIFY_SOCKET": self.name}

    def _receive(self, timeout: float) -> bool:
        self.sock.settimeout(max(timeout, 0.01))
        try:
            data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            return False
        pid = None
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("3i", value[:12])[0]
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.messages.append((pid, fields))
        return True

    def wait(self, match, timeout: float = 30, what: str = "a message",
             since: int = 0) -> tuple[int, dict]:
        """The first message from the ``since``-th on (kept or to come)
        that ``match(fields)`` accepts."""
        seen = since
        deadline = time.monotonic() + timeout
        while True:
            for pid, fields in self.messages[seen:]:
                if match(fields):
                    return pid, fields
            seen = len(self.messages)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} within {timeout} s: {self.messages}")
            self._receive(left)

    def drain(self, during: float) -> None:
        """Keep what arrives for ``during`` seconds (a window to observe)."""
        until = time.monotonic() + during
        while time.monotonic() < until:
            self._receive(until - time.monotonic())

    def statuses(self) -> list[str]:
        return [fields["STATUS"] for _, fields in self.messages if "STATUS" in fields]

    def close(self):
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def listener():
    sock = NotifySocket()
    yield sock
    sock.close()


# -- the protocol, in this process ------------------------------------------------

def test_without_a_notify_socket_nothing_is_sent(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.ready("serving") is False
    assert notify.watchdog() is False


def test_an_abstract_socket_gets_ready_and_status_in_one_message(monkeypatch):
    sock = NotifySocket(abstract=True)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", sock.name)
        assert notify.ready("serving h: 0 VMs") is True
        pid, fields = sock.wait(lambda f: "READY" in f)
        assert (pid, fields) == (os.getpid(), {"READY": "1", "STATUS": "serving h: 0 VMs"})
    finally:
        sock.close()


def test_the_watchdog_is_pinged_at_half_its_interval_and_only_by_its_process(
        monkeypatch, listener):
    monkeypatch.setenv("NOTIFY_SOCKET", listener.name)
    monkeypatch.setenv("WATCHDOG_USEC", "400000")      # 0.4 s: a ping every 0.2 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < 1.0:
        sent += notify.watchdog()       # called far more often than it pings
        time.sleep(0.01)
    assert 4 <= sent <= 6, sent
    listener.drain(0.2)
    assert sum("WATCHDOG" in f for _, f in listener.messages) == sent
    monkeypatch.setenv("WATCHDOG_PID", "1")             # meant for another process
    time.sleep(0.25)
    assert notify.watchdog() is False
    assert notify.main_pid() is True                    # made the main one: it is ours now
    assert os.environ["WATCHDOG_PID"] == str(os.getpid())
    assert notify.watchdog() is True


# -- a real peer -----------------------------------------------------------------

def test_a_peer_says_ready_once_its_host_serves_then_stopping_on_sigterm(
        cluster, store, listener):
    peer = cluster.start_peer("host1", env=listener.env)
    pid, ready = listener.wait(lambda f: "READY" in f, what="READY=1")
    # ready means served: its record under its lease, its provider, its inbox
    assert pid == peer.pid
    assert "host1" in api.live_hosts(store)
    assert store.get(keys.host("host1")).lease
    assert "host1" in {p["name"] for p in open_placement("etcd", store).providers()}
    assert re.fullmatch(r"serving host1: 0 VMs, etcd http://\S+, \S+", ready["STATUS"]), ready
    assert listener.statuses()[0] == f"starting host1: etcd {cluster.etcd_url}"
    assert cluster.cli_json("ping", "host1")["state"] == "done"

    booted = cluster.cli_json("boot", "v1", "--on", "host1", "--network", "none",
                              "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done", booted
    listener.wait(lambda f: f.get("STATUS", "").startswith("serving host1: 1 VMs"),
                  what="a status counting the VM")

    peer.send_signal(signal.SIGTERM)
    _, stopping = listener.wait(lambda f: "STOPPING" in f, what="STOPPING=1")
    assert stopping == {"STOPPING": "1", "STATUS": "stopping host1: letting running "
                        "requests finish"}
    assert peer.wait(30) == 0
    assert sum("READY" in f for _, f in listener.messages) == 1


def test_a_peer_pings_its_watchdog_while_it_serves(cluster, listener):
    cluster.start_peer("host1", env={**listener.env, "WATCHDOG_USEC": "1000000"})
    listener.wait(lambda f: "READY" in f, what="READY=1")
    first = len(listener.messages)
    listener.drain(2.2)
    pings = sum("WATCHDOG" in f for _, f in listener.messages[first:])
    assert 3 <= pings <= 6, listener.messages[first:]      # every 0.5 s


def test_a_peer_the_watchdog_aborts_leaves_every_threads_stack_in_its_log(cluster, listener):
    """systemd's watchdog ends a stuck peer with SIGABRT: the log (the
    journal) then holds where each thread was, to say why it was stuck."""
    cluster.start_peer("host1", env=listener.env)
    listener.wait(lambda f: "READY" in f, what="READY=1")
    cluster.kill("host1", signal.SIGABRT)
    cluster.peers["host1"].wait(30)
    log = cluster.log("host1")
    assert "Fatal Python error: Aborted" in log, log[-2000:]
    assert re.search(r"Thread 0x[0-9a-f]+ \(most recent call first\)", log), log[-2000:]


def test_a_peer_pings_no_watchdog_meant_for_another_process(cluster, listener):
    cluster.start_peer("host1", env={**listener.env, "WATCHDOG_USEC": "1000000",
                                     "WATCHDOG_PID": "1"})
    listener.wait(lambda f: "READY" in f, what="READY=1")
    listener.drain(1.5)
    assert not [f for _, f in listener.messages if "WATCHDOG" in f]


def test_a_peer_without_etcd_says_since_when_and_is_not_ready(cluster, listener):
    with socket.socket() as probe:          # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    peer = cluster.start_peer("host1", env={**listener.env, "PEERCTL_ETCD": dead,
                                            "WATCHDOG_USEC": "1000000"})
    _, said = listener.wait(lambda f: "unreachable" in f.get("STATUS", ""),
                            what="etcd unreachable")
    assert re.fullmatch(rf"etcd unreachable since \d\d:\d\d:\d\d \({dead}\): host1 not "
                        r"serving", said["STATUS"]), said
    listener.wait(lambda f: "WATCHDOG" in f, what="a watchdog ping while it waits")
    assert not [f for _, f in listener.messages if "READY" in f]
    peer.send_signal(signal.SIGTERM)
    assert peer.wait(30) == 0


def test_an_upgrade_makes_the_new_process_the_units_main_one(cluster, store, listener,
                                                              tmp_path):
    """The new release's process sends MAINPID=<its pid> and READY=1
    itself, before the old one exits: systemd follows the upgrade."""
    old = cluster.start_peer("host1", ttl=5, env={**listener.env, "WATCHDOG_USEC": "2000000"})
    listener.wait(lambda f: "READY" in f, what="READY=1")
    cluster.start_peer("host2", ttl=5)      # an upgrade's automation outlives its hosts' turns
    wait_for(lambda: {"host1", "host2"} <= set(api.live_hosts(store)), what="two peers")
    cluster.cli_json("code", "add", build_release(str(tmp_path / "releases"), "0.2.0"))
    done = cluster.cli_json("upgrade", "--to", "0.2.0", "host1", "--yes", timeout=300)
    assert [(h["host"], h["state"]) for h in done["hosts"]] == [("host1", "upgraded")], done

    new = cluster.successor("host1")
    assert new is not None and new != old.pid
    sender, said = listener.wait(lambda f: "MAINPID" in f, what="MAINPID=")
    assert (sender, said["MAINPID"], said["READY"]) == (new, str(new), "1")
    assert said["STATUS"].startswith("serving host1: 0 VMs")
    assert any(f.get("STATUS", "").startswith("handing host1 over to release 0.2.0")
               for pid, f in listener.messages if pid == old.pid)
    assert old.wait(30) == 0
    # the watchdog is the new process's now: its pings come from it
    first = len(listener.messages)
    listener.wait(lambda f: "WATCHDOG" in f, timeout=5, what="a ping from the new process",
                  since=first)
    assert {pid for pid, f in listener.messages[first:] if "WATCHDOG" in f} == {new}
    cluster.kill("host1", signal.SIGTERM)
    listener.wait(lambda f: "STOPPING" in f, what="STOPPING=1 from the new process")


def test_a_rolled_back_hand_over_makes_the_old_process_main_again(cluster, store, listener,
                                                                   tmp_path):
    """A release that cannot start: the old process serves again and says
    so itself, whatever the failed one may have told systemd."""
    old = cluster.start_peer("host1", ttl=5, env=listener.env)
    listener.wait(lambda f: "READY" in f, what="READY=1")
    cluster.start_peer("host2", ttl=5)
    wait_for(lambda: {"host1", "host2"} <= set(api.live_hosts(store)), what="two peers")
    broken = build_release(str(tmp_path / "releases"), "0.2.1", files={
        "engine/peer.py": "raise SystemExit('peerctl 0.2.1 cannot start: broken on purpose')\n"})
    cluster.cli_json("code", "add", broken)
    done = cluster.cli_json("upgrade", "--to", "0.2.1", "host1", "--deadline", "20", "--yes",
                            expect_rc=1, timeout=300)
    assert done["hosts"][0]["state"] == "failed", done
    sender, said = listener.wait(lambda f: "MAINPID" in f, what="MAINPID=")
    assert (sender, said["MAINPID"], said["READY"]) == (old.pid, str(old.pid), "1")
    assert "rolled back" in said["STATUS"] and "broken on purpose" in said["STATUS"], said
    listener.wait(lambda f: f.get("STATUS", "").startswith("serving host1"),
                  what="serving again", since=listener.messages.index((sender, said)))
    assert old.poll() is None


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_a_stop_during_a_hand_over_stops_the_new_process_too(cluster, store, listener,
                                                             tmp_path):
    """SIGTERM (``systemctl stop``) while the new release starts: once it
    serves, the old process stops it as well, so no peer is left behind a
    unit systemd counts as stopping."""
    old = cluster.start_peer("host1", ttl=5, env=listener.env)
    listener.wait(lambda f: "READY" in f, what="READY=1")
    cluster.start_peer("host2", ttl=5)
    wait_for(lambda: {"host1", "host2"} <= set(api.live_hosts(store)), what="two peers")
    with open(os.path.join(ROOT, "engine", "peer.py")) as f:
        slow_peer = f.read().replace("from __future__ import annotations\n",
                                     "from __future__ import annotations\nimport time as _t\n"
                                     "_t.sleep(3)\n", 1)
    cluster.cli_json("code", "add", build_release(str(tmp_path / "releases"), "0.2.2",
                                                  files={"engine/peer.py": slow_peer}))
    upgrading = threading.Thread(target=cluster.cli, args=(
        "upgrade", "--to", "0.2.2", "host1", "--yes"), kwargs={"timeout": 120}, daemon=True)
    upgrading.start()
    listener.wait(lambda f: f.get("STATUS", "").startswith("handing host1 over"),
                  what="the hand-over under way")
    old.send_signal(signal.SIGTERM)
    sender, said = listener.wait(lambda f: "MAINPID" in f, what="MAINPID= from the new one")
    assert sender == int(said["MAINPID"]) != old.pid
    stopper, _ = listener.wait(lambda f: "STOPPING" in f, what="the new process stopping",
                               since=listener.messages.index((sender, said)))
    assert stopper == sender
    assert old.wait(30) == 0
    wait_for(lambda: not os.path.exists(f"/proc/{sender}") or
             open(f"/proc/{sender}/stat").read().split(") ")[1][0] == "Z",
             timeout=30, what="the new process gone")


# -- the guard under systemd -----------------------------------------------------

def test_a_planned_stop_renews_the_lease_last_and_tells_the_guard(
        cluster, store, listener, daemon_hosts, tmp_path):  # noqa: F811
    """A peer with an HA VM, under a journal (``JOURNAL_STREAM`` names its
    stderr): the guard writes there, speaks no notify, and a SIGTERM
    renews the lease one last time, marks the heartbeat ``stopping`` and
    the guard says so; a peer back at once keeps the VM running."""
    uri = daemon_hosts[0]
    log_path = tmp_path / "g.log"           # where start_peer sends its stderr
    log_path.touch()
    stat = os.stat(log_path)
    env = {**listener.env, "JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}",
           "PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS}
    cluster.start_peer("g", libvirt=uri, ttl=5, env=env)
    listener.wait(lambda f: "READY" in f, what="READY=1")
    state = cluster.state_dir("g")
    guard = int((state / "guard" / "pid").read_text())
    guard_env = open(f"/proc/{guard}/environ", "rb").read().split(b"\0")
    assert not [v for v in guard_env if v.startswith((b"NOTIFY_SOCKET=", b"WATCHDOG_"))]
    assert not (state / "guard" / "guard.log").exists()
    wait_for(lambda: "guard started" in cluster.log("g"), what="the guard's line in the log")

    name = f"ha{uuid.uuid4().hex[:6]}"
    booted = cluster.cli_json("boot", name, "--on", "g", "--network", "none", "--ha", "restart",
                              "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done", booted
    lease = store.get(keys.host("g")).lease
    stopped = time.monotonic()
    cluster.kill("g", signal.SIGTERM)
    beat = json.loads((state / "guard" / "heartbeat").read_text())
    assert beat["stopping"] is True
    assert beat["until"] >= stopped + 5 - 1, (beat, stopped)     # renewed at the stop
    assert store.get(keys.host("g")).lease == lease             # left to run out
    wait_for(lambda: "guard peer_stopping" in cluster.log("g"), what="the guard told")

    cluster.start_peer("g", libvirt=uri, ttl=5, env=env)
    wait_for(lambda: store.get(keys.host("g")) is not None
             and store.get(keys.host("g")).lease != lease, what="a new lease")
    assert "fenced" not in cluster.log("g")
    assert int((state / "guard" / "pid").read_text()) == guard
    vm = {v["name"]: v for v in cluster.cli_json("vmlist")}[name]
    assert (vm["host"], vm["state"]) == ("g", "running")


# -- the unit files --------------------------------------------------------------

def unit_files() -> list[str]:
    return sorted(os.path.join(UNITS, name) for name in os.listdir(UNITS)
                  if name.endswith((".service", ".target", ".socket", ".timer")))


def test_the_units_pass_systemd_analyze_verify(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    assert unit_files()
    for path in unit_files():
        text = open(path).read()
        # verify wants the command to exist: this checkout's, as installed
        local = re.sub(r"(?m)^ExecStart=/usr/bin/peerctl ",
                       f"ExecStart={sys.executable} {os.path.join(ROOT, 'peerctl.py')} ", text)
        copy = tmp_path / os.path.basename(path)
        copy.write_text(local)
        done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)],
                              capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), path


def test_the_peer_unit_keeps_its_guard_and_follows_a_new_main_process():
    with open(os.path.join(UNITS, "peerctl.service")) as f:
        settings = dict(line.split("=", 1) for line in f.read().splitlines()
                        if "=" in line and not line.startswith("#"))
    assert settings["Type"] == "notify"
    assert settings["NotifyAccess"] == "all"        # MAINPID= from the upgrade's new process
    assert settings["KillMode"] == "process"        # the guard outlives stop, restart, crash
    assert settings["Restart"] == "on-failure"
    assert settings["ExecStart"] == "/usr/bin/peerctl peer"
    assert int(settings["StartLimitBurst"]) > 0 and settings["WatchdogSec"]
