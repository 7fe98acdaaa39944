"""The live view of an automation a command follows: on a terminal one line
per VM or host with its current step and a summary bar, redrawn in place;
otherwise (a pipe, a log file) plain lines that say what happened to each
VM, where, and read well in a CI log::

    10:04:01 web1 on host3: building
    10:04:03 web1 on host3: built
    10:04:09 db1 host1 -> host2: moving (live)  disk 42%
    10:04:30 db1 host1 -> host2: moved (live)
    10:04:31 web2 on host1: build failed: no space left
    10:04:40 web2: failed: host1: no space left; host2: ...

A plain line names a phase a user cares about (:data:`PHASES`: built,
started, stopped, destroyed, moved...), never an automation's bookkeeping
(``lock_vm``, ``unlock_vm``, ``claim``, ``release``, ``disown``,
``note_restart``...): those steps run on whichever member leads, so their
target says nothing about the VM.  The VM's host is the target of its
hypervisor steps (``build``, ``start``...), or the host the command gave
it (the automation's ``args``).  Once the automation ends, each VM its
result reports in error gets one ``NAME: failed: WHY`` line.  The
automation's own ``done``/``failed`` is not printed here: every command
that follows one prints it with its result.

A long step (a VM's copy during a move) may carry ``progress: {phase,
percent, ...}`` in its log entry while it runs: the terminal line shows it
(``move_migrate running  host1 -> host2  disk 42%``) and the plain lines
repeat it only when the phase changes or the percent has moved by
``PLAIN_STEP`` or more, so that a CI log gets a handful of lines per copy,
not one per poll.

A batched step (``evacuate`` moves up to 16 VMs to a step: ``lock_vms``,
``claim_moves``, ``move_redefine_vms``...) is labelled with its VMs' names,
comma-separated: it is read as the single step it stands for, once for each
of them (:data:`BATCHED`), so each VM gets its own lines.

Pure presentation: it is given each new state of the automation (what
``engine.core.api.task_view`` makes: ``log`` entries of ``index, request,
target, status, executor, label, time, error?, progress?``) and writes to a
stream; it reads nothing.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass

from engine.natural import natural_key

__all__ = ["ProgressView", "FINISHED_STEP", "PHASES"]

# step statuses that count as finished in the summary bar
FINISHED_STEP = ("ok", "error", "timeout", "lost", "failed", "done", "skipped")
# percent points a step's progress must move before plain mode prints it again
PLAIN_STEP = 10
ACTIVE = ("running", "paused")

# What a user-facing step does, ``request: (while it runs, once it is ok)``;
# None prints nothing at that stage; ``{target}`` is where the step runs,
# for a step away from the VM's host.  A request not here is bookkeeping.
PHASES = {
    "build": ("building", "built"),
    "start": ("starting", "started"),
    "stop": ("stopping", "stopped"),
    "reboot": ("rebooting", "rebooted"),
    "suspend": ("suspending", "suspended"),
    "resume": ("resuming", "resumed"),
    "destroy": ("destroying", "destroyed"),
    "ha_start": ("starting again in place", None),
    "set_ha": (None, "HA policy set"),
    "aside_delete": ("deleting its disks kept aside", "disks kept aside deleted"),
    "backup_take": ("backing up", "backed up"),
    "backup_verify": (None, "verified on {target}"),
    "restore_disks": ("restoring its disks", "disks restored"),
    "backup_delete": ("deleting its backup on {target}", "backup deleted on {target}"),
    "ping": (None, "ping ok"),
    "lease_warn": (None, "warned"),
    "lease_heal": (None, "healed"),
    "lease_end": (None, "ending"),
    "lease_release": (None, "released"),
}
# The same requests inside a move or a recovery (after ``claim_move``): part
# of that story, not an action of their own.  A ``destroy`` there, or right
# after a failed build, cleans up a copy left behind: news only if it fails.
IN_A_MOVE = {
    "stop": ("stopping for the move", "stopped for the move"),
    "build": ("restarting from its image", "restarted from its image"),
}
# Steps that run on the VM's own host: their target is where the VM is.
ON_ITS_HOST = ("build", "start", "stop", "reboot", "suspend", "resume", "destroy",
               "ha_start", "set_ha", "move_describe", "move_migrate", "aside_delete", "ping",
               "backup_take", "restore_disks")
# A batched step, labelled ``NAME,NAME,...``: the single step it is for each VM.
BATCHED = {"lock_vms": "lock_vm", "unlock_vms": "unlock_vm",
           "move_describe_vms": "move_describe", "claim_moves": "claim_move",
           "move_redefine_vms": "move_prepare", "destroy_vms": "destroy",
           "confirm_moves": "confirm_move"}
# How a failed step is named in its line.
FAILED_NAMES = {"ha_start": "restart", "aside_delete": "delete", "backup_take": "backup",
                "backup_verify": "verify", "restore_disks": "restore",
                "backup_delete": "backup delete"}
FAILED = {"error": "failed", "failed": "failed", "timeout": "timed out", "lost": "lost"}


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


def _label(entry: dict) -> str:
    return str(entry.get("label") or entry.get("target") or "-")


@dataclass
class _Story:
    """What one VM's steps so far tell about it, read in log order."""
    name: str
    host: str | None = None         # where it is
    state: str | None = None        # its state when the command planned it
    offline: bool = False           # a move asked for --offline
    moving: bool = False            # between claim_move and confirm/revert
    source: str | None = None
    dest: str | None = None
    prepared: bool = False          # move_prepare: a move, not a recovery
    copied: bool = False            # move_migrate: libvirt copies it
    stopped: bool = False           # stopped for the move
    cleaning: bool = False          # its build failed: what follows cleans up

    def where(self) -> str:
        """`` on HOST`` or `` SOURCE -> DEST``; nothing where the label is
        the host itself (ping) or nothing is known yet."""
        if self.moving and self.dest:
            return f" {self.source or '?'} -> {self.dest}"
        if self.host and self.host != self.name:
            return f" on {self.host}"
        return ""

    def mode(self) -> str:
        """The move's mode as far as the log tells: `` (redefine)`` without a
        copy, `` (cold)`` when stopped or shut off, `` (live)`` when it ran."""
        if self.prepared and not self.copied:
            return " (redefine)"
        if self.stopped or self.offline or (self.state and self.state not in ACTIVE):
            return " (cold)"
        return " (live)" if self.state in ACTIVE else ""

    def before(self, entry: dict) -> None:
        request, target = entry.get("request"), entry.get("target")
        if request in ("lock_vm", "ha_lock", "claim", "lease_claim"):
            self.moving = self.cleaning = False
        elif request == "claim_move":
            self.moving, self.cleaning, self.source, self.dest = True, False, self.host, None
            self.prepared = self.copied = self.stopped = False
        if request == "revert_move":
            self.moving = False         # it stays where it was: say so on its line
        if self.moving:
            if request in ("move_prepare", "move_adopt", "build") and target:
                self.dest = target
            self.prepared |= request == "move_prepare"
            self.copied |= request == "move_migrate"
        elif request in ON_ITS_HOST and target and not (self.cleaning and request == "destroy"):
            self.host = target

    def after(self, entry: dict) -> None:
        request, ok = entry.get("request"), entry.get("status") == "ok"
        if request == "build" and entry.get("status") in FAILED:
            self.cleaning = True
        elif request == "stop" and ok and self.moving:
            self.stopped = True
        elif request == "confirm_move" and ok:
            self.host, self.moving = self.dest or self.host, False

    def phrases(self, entry: dict) -> tuple[str | None, str | None, str | None]:
        """``(while it runs, once it is ok, its name if it fails)`` for this
        step of this VM; all None for bookkeeping."""
        request = entry.get("request")
        if request == "move_migrate":
            return f"moving{self.mode()}", None, "copy"
        if request == "confirm_move" and self.prepared:
            return None, f"moved{self.mode()}", None
        if request == "revert_move" and self.prepared:
            return None, f"not moved to {self.dest}", None
        if request not in PHASES:
            return None, None, None
        if request == "destroy" and (self.moving or self.cleaning):
            return None, None, "cleanup"        # of the copy left behind: news if it fails
        if self.moving and request in IN_A_MOVE:
            return (*IN_A_MOVE[request], request)
        target = str(entry.get("target"))
        running, done = [text and text.replace("{target}", target) for text in PHASES[request]]
        return running, done, FAILED_NAMES.get(request, request)


def _stories(task: dict) -> dict[str, _Story]:
    """A story per VM named in the automation's arguments, with its host."""
    args = task.get("args") if isinstance(task.get("args"), dict) else {}
    vms = list(args.get("vms") or args.get("disks") or []) \
        + ([args["vm"]] if isinstance(args.get("vm"), dict) else [])
    stories = {}
    for vm in vms:
        if isinstance(vm, dict) and vm.get("name"):
            name = str(vm["name"])
            stories[name] = _Story(name, host=vm.get("host"), state=vm.get("state"),
                                   offline=bool(args.get("offline")))
    return stories


def _each_vm(entry: dict) -> list[dict]:
    """``entry``, or for a batched step the single step it is for each VM
    its label names."""
    single = BATCHED.get(entry.get("request"))
    if single is None:
        return [entry]
    return [{**entry, "request": single, "label": name}
            for name in _label(entry).split(",") if name]


def _walk(task: dict):
    """Each log entry in order with its VM's story as it stands at that step:
    ``(entry, story)``; the story has taken the step in when the next one
    comes."""
    stories = _stories(task)
    for batched in sorted(task.get("log") or [], key=lambda e: e.get("index") or 0):
        for entry in _each_vm(batched):
            label = _label(entry)
            story = stories.setdefault(label, _Story(label))
            story.before(entry)
            yield entry, story
            story.after(entry)


def _latest_by_label(task: dict) -> list[tuple[str, dict, _Story]]:
    latest: dict[str, tuple] = {}
    for entry, story in _walk(task):
        label = _label(entry)
        latest.pop(label, None)
        latest[label] = (entry, story)
    order = sorted(latest, key=lambda label: natural_key(label))
    return [(label, *latest[label]) for label in order]


def _result_rows(task: dict) -> list[dict]:
    result = task.get("result") if isinstance(task.get("result"), dict) else {}
    rows = result.get("vms") or result.get("disks") or result.get("backups") or []
    return [row for row in rows if isinstance(row, dict)]


def _name(row: dict) -> str:
    """The VM a result row is about (a backup's row names it ``vm``)."""
    return str(row.get("name") or row.get("vm"))


def _failed_line(row: dict) -> str | None:
    """``NAME: failed: WHY`` for a result row in error; a row that ended
    well but has something to say (a move reverted) says it as it is."""
    if not row.get("error") and row.get("state") != "error":
        return None
    why = row.get("error") or "error"
    if row.get("state") in ("error", "unknown"):
        return f"{_name(row)}: failed: {why}"
    return f"{_name(row)}: {why}"


class ProgressView:
    """Shows an automation while it runs: on a terminal one line per VM or host
    with its current step and a summary bar, redrawn in place; otherwise plain
    lines, one per phase of a VM (see the module's docstring).

    ``stamp`` makes the time in front of each plain line."""

    def __init__(self, stream, automation: str, tty: bool, *, stamp=None):
        self.stream, self.automation, self.tty = stream, automation, tty
        self.stamp = stamp or (lambda: time.strftime("%H:%M:%S"))
        self.started = time.monotonic()
        self.drawn = 0
        self.said: dict[tuple, str] = {}     # (index, VM) -> "running" or "finished", printed
        self.shown: dict[tuple, tuple] = {}  # (index, VM) -> (phase, percent) last printed
        self.ended = False

    def update(self, task: dict) -> None:
        if self.tty:
            self._redraw(task)
        else:
            self._plain(task)

    # -- plain lines ------------------------------------------------------------------

    def _plain(self, task: dict) -> None:
        stamp = self.stamp()
        for entry, story in _walk(task):
            for line in self._news(entry, story):
                self.stream.write(f"{stamp} {line}\n")
        if task.get("state") not in (None, "running") and not self.ended:
            self.ended = True
            for row in _result_rows(task):
                line = _failed_line(row)
                if line:
                    self.stream.write(f"{stamp} {line}\n")
        self.stream.flush()

    def _news(self, entry: dict, story: _Story) -> list[str]:
        """The lines this step has not printed yet."""
        index, status = (entry.get("index"), story.name), entry.get("status") or "queued"
        running, done, failed_name = story.phrases(entry)
        head = f"{story.name}{story.where()}"
        lines = []
        if status == "running" and running:
            phase, percent = _progress(entry)
            if index not in self.said or self._moved(index, phase, percent):
                self.shown[index] = (phase, percent)
                lines.append(f"{head}: {running}{_progress_text(phase, percent)}")
            self.said[index] = "running"
        elif status in FINISHED_STEP and self.said.get(index) != "finished":
            self.said[index] = "finished"
            if status == "ok" and done:
                lines.append(f"{head}: {done}")
            elif status in FAILED and failed_name:
                if failed_name == "cleanup":
                    head = f"{story.name} on {entry.get('target')}"     # the copy's host
                why = f": {entry['error']}" if entry.get("error") else ""
                lines.append(f"{head}: {failed_name} {FAILED[status]}{why}")
        return lines

    def _moved(self, index: tuple, phase, percent) -> bool:
        """Whether a step's progress changed enough for another plain line."""
        if phase is None and percent is None:
            return False
        last_phase, last_percent = self.shown.get(index, (None, None))
        if phase != last_phase:
            return True
        if percent is None or last_percent is None:
            return percent != last_percent
        return abs(percent - last_percent) >= PLAIN_STEP

    # -- the terminal -----------------------------------------------------------------

    def lines(self, task: dict, width: int, height: int) -> list[str]:
        rows = _latest_by_label(task)
        results = {_name(row): row for row in _result_rows(task)} \
            if task.get("state") != "running" else {}
        label_width = min(max([len(label) for label, _, _ in rows] + [4]), 32)
        # the moves' steps (move_describe, confirm_move...) are longer than 8
        request_width = min(max([len(str(e.get("request"))) for _, e, _ in rows] + [8]), 16)
        out = []
        for label, entry, story in rows:
            status = entry.get("status") or "pending"
            line = (f"  {label:<{label_width}}  {str(entry.get('request')):<{request_width}} "
                    f"{status:<8}")
            line += story.where() + _progress_text(*_progress(entry))
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
