"""A benchmark's own child processes: a peer started (its output in the
work directory's ``HOST.log``), a command line run for its JSON, the CPU
they used, and ending them, by their Popen, politely first (SIGTERM,
15 s), then SIGKILL."""
from __future__ import annotations

import json
import os
import subprocess
import sys

__all__ = ["start_peer", "cli_json", "stop_processes", "cpu_seconds", "load_line"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_peer(etcd_url, cluster, workdir, host, uri, env=None, ttl=2, remote=None, args=()):
    """``remote``: the URI other hosts reach its libvirt by (--libvirt-remote);
    ``args``: more of ``peer``'s options (``--api ADDR:PORT``...)."""
    log = open(os.path.join(workdir, f"{host}.log"), "ab")
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "peerctl.py"), "--etcd", etcd_url,
         "--cluster", cluster, "peer", "--host", host, "--libvirt", uri, "--ttl", str(ttl),
         *(["--libvirt-remote", remote] if remote else []),
         "--workers", "8", "--state-dir", os.path.join(workdir, f"state-{host}"), *args],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
        env={**os.environ, **(env or {})})


def cli_json(etcd_url, cluster, *args, timeout=300):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "peerctl.py"), "--etcd", etcd_url,
                           "--cluster", cluster, "--format", "json", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"peerctl {' '.join(args)} failed ({done.returncode}): "
                         f"{done.stdout[-800:]} {done.stderr[-800:]}")
    return json.loads(done.stdout)


def stop_processes(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU the processes ``pids`` have used so far."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def load_line(before: tuple[float, float, float]) -> str:
    """The machine's load average before a run (``os.getloadavg()``) and
    now: the line every benchmark ends with, so its figures can be judged."""
    def shown(load):
        return " ".join(f"{x:.2f}" for x in load)
    return (f"load average (1, 5, 15 min): before {shown(before)}, "
            f"after {shown(os.getloadavg())} ({os.cpu_count()} CPUs)")
