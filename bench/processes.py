"""A benchmark's own child processes: the CPU they used, and ending them,
by their Popen, politely first (SIGTERM, 15 s), then SIGKILL."""
from __future__ import annotations

import os
import subprocess

__all__ = ["stop_processes", "cpu_seconds"]


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
