"""Ending what a benchmark started: its own child processes, by their
Popen, politely first (SIGTERM, 15 s), then SIGKILL."""
from __future__ import annotations

import subprocess

__all__ = ["stop_processes"]


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
