"""Start, kill and restart a local etcd server (Debian's ``etcd`` binary).

Used by the test suite, the benchmarks and ``peerctl.py up``.  Ports are
picked free on loopback; the election timings are shortened so that a
restart on an existing data directory is healthy in a fraction of a second.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

__all__ = ["EtcdServer", "free_port", "etcd_binary"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def etcd_binary() -> str | None:
    return shutil.which("etcd") or (os.path.exists("/usr/bin/etcd") and "/usr/bin/etcd") or None


class EtcdServer:
    def __init__(self, data_dir: str, client_port: int | None = None,
                 peer_port: int | None = None, log_path: str | None = None):
        self.data_dir = data_dir
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.log_path = log_path or os.path.join(data_dir + ".log")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def command(self) -> list[str]:
        binary = etcd_binary()
        if not binary:
            raise FileNotFoundError("etcd not found: apt-get install etcd-server")
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [binary, "--name", "peerctl", "--data-dir", self.data_dir,
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"peerctl={peer}",
                "--heartbeat-interval", "10", "--election-timeout", "100",
                "--log-level", "warn"]

    def start(self, timeout: float = 15.0) -> "EtcdServer":
        os.makedirs(os.path.dirname(os.path.abspath(self.data_dir)), exist_ok=True)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as reply:
                    if b'"true"' in reply.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"etcd at {self.url} not healthy after {timeout}s")

    def kill(self) -> None:
        """SIGKILL: the data directory stays, as after a crash."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()
