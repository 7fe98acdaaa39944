"""The live view of an automation a command follows: on a terminal one line
per VM or host with its current step and a summary bar, redrawn in place;
otherwise (a pipe, a log file) plain lines, one per change, that read well
in a CI log.

A long step (a VM's copy during a move) may carry ``progress: {phase,
percent, ...}`` in its log entry while it runs: the terminal line shows it
(``move_migrate running on host1  disk 42%``) and the plain lines repeat it
only when the phase changes or the percent has moved by ``PLAIN_STEP`` or
more, so that a CI log gets a handful of lines per copy, not one per poll.

Pure presentation: it is given each new state of the automation (what
``engine.core.api.follow`` yields) and writes to a stream; it reads nothing.
"""
from __future__ import annotations

import shutil
import time

from engine import table

__all__ = ["ProgressView", "FINISHED_STEP"]

# step statuses that count as finished in the summary bar
FINISHED_STEP = ("ok", "error", "timeout", "lost", "failed", "done", "skipped")
# percent points a step's progress must move before plain mode prints it again
PLAIN_STEP = 10


def _progress(entry: dict) -> tuple[str | None, int | None]:
    """A running step's ``(phase, percent)``, or ``(None, None)``."""
    progress = entry.get("progress")
    if not isinstance(progress, dict):
        return None, None
    phase = progress.get("phase")
    percent = progress.get("percent")
    if not isinstance(percent, (int, float)) or isinstance(percent, bool):
        percent = None
    return (str(phase) if phase is not None else None,
            None if percent is None else int(percent))


def _progress_text(phase: str | None, percent: int | None) -> str:
    shown = " ".join(part for part in (phase, None if percent is None else f"{percent}%")
                     if part)
    return f"  {shown}" if shown else ""


def _latest_by_label(task: dict) -> list[tuple[str, dict]]:
    latest: dict[str, dict] = {}
    for entry in sorted(task.get("log") or [], key=lambda e: e.get("index") or 0):
        label = str(entry.get("label") or entry.get("target") or "-")
        latest.pop(label, None)
        latest[label] = entry
    order = sorted(latest, key=lambda label: table.natural_key(label))
    return [(label, latest[label]) for label in order]


def _result_by_name(task: dict) -> dict:
    result = task.get("result") or {}
    return {str(vm.get("name")): vm for vm in result.get("vms") or [] if isinstance(vm, dict)}


class ProgressView:
    """Shows an automation while it runs: on a terminal one line per VM or host
    with its current step and a summary bar, redrawn in place; otherwise plain
    lines, one per change."""

    def __init__(self, stream, automation: str, tty: bool):
        self.stream, self.automation, self.tty = stream, automation, tty
        self.started = time.monotonic()
        self.drawn = 0
        self.seen: dict[str, tuple] = {}
        self.shown: dict[str, tuple] = {}     # label -> (phase, percent) last printed
        self.state = None

    def update(self, task: dict) -> None:
        if self.tty:
            self._redraw(task)
        else:
            self._plain(task)
        self.state = task.get("state")

    def _plain(self, task: dict) -> None:
        stamp = time.strftime("%H:%M:%S")
        for label, entry in _latest_by_label(task):
            key = (entry.get("request"), entry.get("status"), entry.get("index"))
            phase, percent = _progress(entry)
            if self.seen.get(label) != key or self._moved(label, phase, percent):
                self.seen[label] = key
                self.shown[label] = (phase, percent)
                where = f" on {entry['executor']}" if entry.get("executor") else ""
                self.stream.write(f"{stamp} {label}: {entry.get('request')} "
                                  f"{entry.get('status') or 'pending'}{where}"
                                  f"{_progress_text(phase, percent)}\n")
        if task.get("state") != self.state and (self.state or task.get("state") != "running"):
            self.stream.write(f"{stamp} automation {self.automation} {task.get('state')}"
                              + (f": {task['error']}" if task.get("error") else "") + "\n")
        self.stream.flush()

    def _moved(self, label: str, phase, percent) -> bool:
        """Whether a step's progress changed enough for another plain line."""
        if phase is None and percent is None:
            return False
        last_phase, last_percent = self.shown.get(label, (None, None))
        if phase != last_phase:
            return True
        if percent is None or last_percent is None:
            return percent != last_percent
        return abs(percent - last_percent) >= PLAIN_STEP

    def lines(self, task: dict, width: int, height: int) -> list[str]:
        rows = _latest_by_label(task)
        results = _result_by_name(task) if task.get("state") != "running" else {}
        label_width = min(max([len(label) for label, _ in rows] + [4]), 32)
        # the moves' steps (move_describe, confirm_move...) are longer than 8
        request_width = min(max([len(str(e.get("request"))) for _, e in rows] + [8]), 16)
        out = []
        for label, entry in rows:
            status = entry.get("status") or "pending"
            line = (f"  {label:<{label_width}}  {str(entry.get('request')):<{request_width}} "
                    f"{status:<8}")
            if entry.get("executor"):
                line += f" on {entry['executor']}"
            line += _progress_text(*_progress(entry))
            vm = results.get(label)
            if vm:
                line += f"  -> {vm.get('state')}" + (f" ({vm['error']})" if vm.get("error") else "")
            out.append(line[:width - 1])
        room = max(height - 3, 3)
        if len(out) > room:
            out = out[:room - 1] + [f"  ... and {len(out) - room + 1} more"]
        log = task.get("log") or []
        done = sum(1 for e in log if (e.get("status") or "") in FINISHED_STEP)
        bar_width = max(min(width - 60, 30), 10)
        filled = int(bar_width * done / len(log)) if log else 0
        elapsed = time.monotonic() - self.started
        out.append(f"[{'#' * filled}{'-' * (bar_width - filled)}] {done}/{len(log)} steps  "
                   f"{len(rows)} {'targets' if len(rows) != 1 else 'target'}  "
                   f"{task.get('state')}  {elapsed:.1f}s  {self.automation}"[:width - 1])
        return out

    def _redraw(self, task: dict) -> None:
        size = shutil.get_terminal_size((100, 40))
        out = self.lines(task, size.columns, size.lines)
        if self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[J")
        self.stream.write("\n".join(out) + "\n")
        self.stream.flush()
        self.drawn = len(out)
