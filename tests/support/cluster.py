"""Real peer processes and the real command line, driven from tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERCTL = os.path.join(ROOT, "peerctl.py")


def wait_for(predicate, timeout=20.0, interval=0.05, what="condition"):
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Cluster:
    def __init__(self, etcd_url: str, name: str, tmp_path):
        self.etcd_url = etcd_url
        self.name = name
        self.tmp_path = tmp_path
        self.peers: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict:
        env = dict(os.environ)
        env.update(PEERCTL_ETCD=self.etcd_url, PEERCTL_CLUSTER=self.name,
                   PYTHONUNBUFFERED="1")
        env.pop("PEERCTL_FORMAT", None)
        return env

    def start_peer(self, host: str, libvirt: str = "test:///default", ttl: int = 2,
                   extra_args=(), env=None) -> subprocess.Popen:
        log = open(self.tmp_path / f"{host}.log", "ab")
        process = subprocess.Popen(
            [sys.executable, PEERCTL, "peer", "--host", host, "--libvirt", libvirt,
             "--ttl", str(ttl), "--state-dir", str(self.tmp_path / f"state-{host}"),
             *extra_args],
            stdout=log, stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
            cwd=ROOT, start_new_session=True)
        self.peers[host] = process
        return process

    def kill(self, host: str, sig=signal.SIGKILL) -> None:
        process = self.peers[host]
        if process.poll() is None:
            process.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                process.wait(30)

    def log(self, host: str) -> str:
        return (self.tmp_path / f"{host}.log").read_text(errors="replace")

    def cli(self, *args, input=None, timeout=120, env=None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, PEERCTL, *args], capture_output=True,
                              text=True, env={**self.env, **(env or {})}, cwd=ROOT,
                              input=input, timeout=timeout)

    def cli_json(self, *args, expect_rc=0, **kwargs):
        done = self.cli("--format", "json", *args, **kwargs)
        assert done.returncode == expect_rc, (done.returncode, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def close(self) -> None:
        for process in self.peers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(30)
