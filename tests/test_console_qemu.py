"""`console NAME` on a real guest: a real peer on this machine's libvirtd
(``qemu:///system``) boots the busybox guest of :mod:`tests.support.qemu_guest`
through the command line, then the command line attaches to its serial
console, through a pipe (``--no-tty``) and on a pty of its own, directly
and through the peer's API (``--via api``: the websocket, with a token the
command mints for itself).

One guest for the module (it boots in tens of seconds under TCG); the tests
run in file order and the last one shuts it down.  Skipped, saying why,
where no libvirtd runs QEMU (:func:`qemu_guest.skip_reason`).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from engine.core import tokens
from engine.core.store import Store
from tests.support import PEERCTL, ROOT, qemu_guest, wait_for
from tests.support.api_client import api_peer_args, free_port
from tests.support.console_guest import booted_guest
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

ANSWER_TIMEOUT = 30.0


class Guest:
    def __init__(self, cluster, name, host, uuid, console_log, api):
        self.cluster, self.name, self.host, self.uuid = cluster, name, host, uuid
        self.console_log, self.api = console_log, api

    def tokens(self) -> list[dict]:
        store = Store(self.cluster.etcd_url, self.cluster.name)
        try:
            return tokens.list_tokens(store)
        finally:
            store.close()

    def console(self, *args, **popen) -> subprocess.Popen:
        """``python peerctl.py console NAME ARGS`` on pipes (unless ``popen`` says else)."""
        popen = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE,
                 "stderr": subprocess.PIPE, **popen}
        return subprocess.Popen([sys.executable, PEERCTL, "console", self.name, *args],
                                env=self.cluster.env, cwd=ROOT, **popen)


@pytest.fixture(scope="module")
def guest(guest_dir, etcd, tmp_path_factory):
    """A running guest booted by `boot` on peer ``qc<pid>``, its shell up;
    the peer serves its API."""
    port = free_port()
    with booted_guest(guest_dir, etcd.url, tmp_path_factory.mktemp("console"),
                      "console", peer_args=api_peer_args(port)) as booted:
        yield Guest(*booted, api=f"http://127.0.0.1:{port}")


def read_until(fd, wanted: bytes, timeout: float, seen: bytearray) -> bytes:
    """Read ``fd`` into ``seen`` until it holds ``wanted`` (returns all of
    it) or ``timeout`` passes (AssertionError showing what came)."""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} within {timeout}s; got {bytes(seen)!r}"
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:         # EIO: the pty's other side is gone
                chunk = b""
            assert chunk, f"end of output before {wanted!r}; got {bytes(seen)!r}"
            seen += chunk
    return bytes(seen)


def stderr_lines(process) -> list[str]:
    return [line for line in process.stderr.read().decode().splitlines() if line.strip()]


@contextlib.contextmanager
def on_a_terminal(guest, *args):
    """``console NAME ARGS`` with a pty of its own as its controlling
    terminal: yields ``(console, master, cooked)``, the process, the pty's
    side the test types on and reads, and the terminal's settings before."""
    master, slave = pty.openpty()
    cooked = termios.tcgetattr(slave)

    def controlling_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    console = guest.console(*args, stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=controlling_terminal)
    os.close(slave)
    try:
        yield console, master, cooked
    finally:
        end(console)
        os.close(master)


def end(*processes) -> None:
    """Kill what still runs of ``processes`` (None: never started)."""
    for process in processes:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


def test_no_tty_pipes_a_command_in_and_its_answer_out_and_stays_after_eof(guest):
    console = guest.console("--no-tty")
    try:
        read_until(console.stderr.fileno(), b"Plain byte stream", ANSWER_TIMEOUT, bytearray())
        console.stdin.write(b"echo hello-$((6*7))\n")
        console.stdin.close()               # a script's stdin ends at once...
        out = read_until(console.stdout.fileno(), b"hello-42", ANSWER_TIMEOUT, bytearray())
        assert b"echo hello-$((6*7))" in out        # the guest's tty echoed the line
        # ... and the answer still came, the session still on: EOF did not end it.
        assert console.poll() is None
        console.send_signal(signal.SIGINT)
        assert console.wait(30) == 128 + signal.SIGINT
        assert stderr_lines(console)[-1] == \
            f"Left the console on signal {int(signal.SIGINT)} (VM {guest.name} on {guest.host})"
    finally:
        end(console)


def test_timeout_leaves_with_exit_0(guest):
    console = guest.console("--no-tty", "--timeout", "2", stdin=subprocess.DEVNULL)
    assert console.wait(30) == 0
    lines = stderr_lines(console)
    assert lines[0] == (f"Connected to VM {guest.name} on {guest.host} "
                        f"({qemu_guest.QEMU_URI}). Plain byte stream: it ends with the "
                        "console, a signal or --timeout 2")
    assert lines[-1] == f"Left the console: --timeout reached (VM {guest.name} on {guest.host})"


def test_on_a_terminal_it_is_raw_and_ctrl_bracket_leaves_restoring_the_terminal(guest):
    with on_a_terminal(guest) as (console, master, cooked):
        seen = bytearray()
        read_until(master, b"Escape character is ^]", ANSWER_TIMEOUT, seen)
        wait_for(lambda: not termios.tcgetattr(master)[3] & (
            termios.ICANON | termios.ECHO | termios.ISIG), timeout=10, what="a raw terminal")
        os.write(master, b"echo pty-$((6*7))\r")        # Enter on a raw terminal is CR
        read_until(master, b"pty-42", ANSWER_TIMEOUT, seen)
        assert b"echo pty-$((6*7))" in seen            # echoed by the guest, not by us
        os.write(master, b"\x1d")
        assert console.wait(30) == 0
        read_until(master, b"Left the console", ANSWER_TIMEOUT, seen)
        assert termios.tcgetattr(master) == cooked      # the terminal is as it was


def test_a_second_console_takes_over_and_the_first_says_so(guest):
    first = guest.console("--no-tty")
    second = None
    try:
        read_until(first.stderr.fileno(), b"Connected to VM", ANSWER_TIMEOUT, bytearray())
        second = guest.console("--no-tty", "--timeout", "3", stdin=subprocess.DEVNULL)
        assert first.wait(30) == 1
        assert stderr_lines(first) == [
            f"peerctl: the console of VM {guest.name} on {guest.host} closed while the VM "
            "runs (another client may have taken it over)"]
        assert second.wait(30) == 0
    finally:
        end(first, second)


def test_through_the_peers_api_a_piped_command_gets_its_answer(guest):
    console = guest.console("--no-tty", "--via", "api")
    try:
        said = read_until(console.stderr.fileno(), b"Plain byte stream", ANSWER_TIMEOUT,
                          bytearray()).decode()
        assert said.startswith(f"Connected to VM {guest.name} on {guest.host} (through the "
                               f"API at {guest.api}). Plain byte stream")
        console.stdin.write(b"echo api-$((6*7))\n")
        console.stdin.close()
        out = read_until(console.stdout.fileno(), b"api-42", ANSWER_TIMEOUT, bytearray())
        assert b"echo api-$((6*7))" in out          # the guest's tty echoed the line
        assert [token["role"] for token in guest.tokens()] == ["operator"]   # its own
        console.send_signal(signal.SIGINT)
        assert console.wait(30) == 128 + signal.SIGINT
        assert stderr_lines(console)[-1] == \
            f"Left the console on signal {int(signal.SIGINT)} (VM {guest.name} on {guest.host})"
        assert guest.tokens() == []                 # deleted as the console ended
    finally:
        end(console)


def test_through_the_api_on_a_terminal_ctrl_bracket_leaves_restoring_it(guest):
    with on_a_terminal(guest, "--via", "api") as (console, master, cooked):
        seen = bytearray()
        read_until(master, b"Escape character is ^]", ANSWER_TIMEOUT, seen)
        wait_for(lambda: not termios.tcgetattr(master)[3] & (
            termios.ICANON | termios.ECHO | termios.ISIG), timeout=10, what="a raw terminal")
        os.write(master, b"echo apipty-$((6*7))\r")
        read_until(master, b"apipty-42", ANSWER_TIMEOUT, seen)
        os.write(master, b"\x1d")
        assert console.wait(30) == 0
        read_until(master, b"Left the console", ANSWER_TIMEOUT, seen)
        assert termios.tcgetattr(master) == cooked


def test_a_direct_console_takes_over_one_through_the_api_which_says_so(guest):
    first = guest.console("--no-tty", "--via", "api")
    second = None
    try:
        read_until(first.stderr.fileno(), b"Connected to VM", ANSWER_TIMEOUT, bytearray())
        second = guest.console("--no-tty", "--timeout", "3", stdin=subprocess.DEVNULL)
        assert first.wait(30) == 1
        assert stderr_lines(first)[-1] == (
            f"peerctl: the console of VM {guest.name} on {guest.host} closed while the VM "
            "runs (another client may have taken it over)")
        assert second.wait(30) == 0
    finally:
        end(first, second)


def test_the_session_ends_with_exit_0_when_the_vm_stops(guest):
    """Last: the guest is gone afterwards."""
    console = guest.console("--no-tty")
    try:
        read_until(console.stderr.fileno(), b"Connected to VM", ANSWER_TIMEOUT, bytearray())
        stopped = guest.cluster.cli_json("stop", guest.name, timeout=120)  # ACPI: a real shutdown
        assert stopped["state"] == "done", stopped
        code, lines = console.wait(30), stderr_lines(console)
        assert code == 0, lines
        assert lines[-1] == f"Console closed: the VM stopped (VM {guest.name} on {guest.host})"
    finally:
        end(console)
