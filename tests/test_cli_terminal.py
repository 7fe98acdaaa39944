"""The progress view on a real terminal (a pty that is the command's
controlling terminal), and Ctrl-C, typed as ^C on that terminal, detaching
from an automation without stopping it."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from tests.cluster import PEERCTL, ROOT, wait_for


class Terminal:
    """A command running on a pty of its own, as in a terminal window."""

    def __init__(self, argv, env, columns=120, lines=40):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))

        def controlling_terminal():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        env = {**env, "TERM": "xterm"}
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                        env=env, cwd=ROOT, preexec_fn=controlling_terminal)
        os.close(slave)
        self.master = master
        self.output = b""

    def read(self, timeout=0.1) -> None:
        while select.select([self.master], [], [], timeout)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:         # EIO: the other side is closed
                return
            if not chunk:
                return
            self.output += chunk
            timeout = 0

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def wait_for_text(self, pattern, timeout=60):
        def seen():
            self.read()
            return re.search(pattern, self.text())
        return wait_for(seen, timeout=timeout, interval=0, what=f"{pattern!r} on the terminal")

    def frames(self) -> list[str]:
        """The progress view's frames so far.  Each redraw moves the cursor up
        over exactly the previous frame and clears to the end of the screen;
        an AssertionError says where that was not so."""
        parts = re.split(r"\x1b\[(\d+)F\x1b\[J", self.text().replace("\r\n", "\n"))
        frames = [parts[0]]
        for up, frame in zip(parts[1::2], parts[2::2]):
            assert int(up) == frames[-1].count("\n"), \
                f"moved up {up} lines over a frame of {frames[-1].count(chr(10))}"
            frames.append(frame)
        return frames

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def finish(self, timeout=30) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self.read()
        self.read()
        code = self.process.wait(max(deadline - time.monotonic(), 1))
        os.close(self.master)
        return code


def alive(cluster) -> set:
    done = cluster.cli("--format", "json", "hostlist")
    if done.returncode != 0:
        return set()
    return {h["host"] for h in json.loads(done.stdout) if h["alive"]}


@pytest.fixture
def peers(cluster):
    names = ["host1", "host2", "host3"]
    for name in names:
        cluster.start_peer(name)
    wait_for(lambda: set(names) <= alive(cluster), timeout=30, what="three peers alive")
    return names


def test_ctrl_c_detaches_without_stopping_the_automation(cluster, peers):
    terminal = Terminal([sys.executable, PEERCTL, "ping", "--rounds", "60"], cluster.env)
    terminal.wait_for_text(r"\[[#-]+\] \d+/\d+ steps")
    automation = re.search(r"steps\s+\d+ targets?\s+\w+\s+[\d.]+s\s+(\S+)",
                           terminal.text()).group(1)
    terminal.type(b"\x03")       # Ctrl-C on the terminal: SIGINT to the command
    code = terminal.finish()
    text = terminal.text()
    assert code == 130, text
    assert "Traceback" not in text
    assert f"Re-attach with: python peerctl.py wait {automation}" in text
    task = json.loads(subprocess.run(
        [sys.executable, PEERCTL, "--format", "json", "wait", automation],
        capture_output=True, text=True, env=cluster.env, cwd=ROOT, timeout=120).stdout)
    assert task["state"] == "done"
    assert len(task["result"]["replies"]) == 3 * 60


def test_wait_on_a_terminal_shows_the_view_to_the_end(cluster, peers):
    doc = cluster.cli_json("ping", "--rounds", "3", "--detach")
    terminal = Terminal([sys.executable, PEERCTL, "wait", doc["automation"]], cluster.env)
    code = terminal.finish(60)
    text = terminal.text()
    assert code == 0, text
    assert re.search(r"\[#+\] 9/9 steps\s+3 targets\s+done", text), text
    for host in peers:
        assert re.search(rf"{host}\s+ping\s+ok", text)


def test_destructive_action_asks_on_a_terminal(cluster, peers):
    booted = cluster.cli_json("boot", "web1", "web2", "--resources",
                              "VCPU:1,MEMORY_MB:128,DISK_GB:1")
    assert booted["state"] == "done", booted
    wait_for(lambda: len(cluster.cli_json("vmlist")) == 2, what="two VMs listed")
    hosts = {vm["name"]: vm["host"] for vm in booted["vms"]}

    terminal = Terminal([sys.executable, PEERCTL, "destroy", "web*"], cluster.env)
    terminal.wait_for_text(r"Destroy these 2 VMs\? \[y/N\]")
    for name in ("web1", "web2"):
        assert f"{hosts[name]}/{name}" in terminal.text()
    terminal.type(b"n\r")
    assert terminal.finish() == 1
    assert "nothing done" in terminal.text()
    assert [t["kind"] for t in cluster.cli_json("tasks", "--all")] == ["boot"]
    assert len(cluster.cli_json("vmlist")) == 2

    terminal = Terminal([sys.executable, PEERCTL, "destroy", "web*"], cluster.env)
    terminal.wait_for_text(r"Destroy these 2 VMs\? \[y/N\]")
    terminal.type(b"y\r")
    code = terminal.finish(60)
    text = terminal.text()
    assert code == 0, text
    assert re.search(r"automation \S+ done", text), text
    kinds = [t["kind"] for t in cluster.cli_json("tasks", "--all")]
    assert sorted(kinds) == ["boot", "destroy"]
    wait_for(lambda: cluster.cli_json("vmlist") == [], what="both VMs gone")
