"""Request hooks for tests: count executions, record payloads, fail or slow
requests down.  Every hook is written by :func:`write_hook`."""
from __future__ import annotations

import collections
import fcntl
import json
import os
import stat
import sys

__all__ = ["write_hook", "counting_hook", "executions", "assert_each_index_ran_once",
           "recording_hook", "recorded", "failing_hook", "serial_hook", "Gate", "gated_hook"]


def write_hook(directory, request, phase, body: str) -> str:
    """Write the ``phase`` hook of ``request`` into ``directory``: a Python
    script that reads its payload (one JSON object on stdin) as ``event``,
    then runs ``body``.  Returns the hook's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{request}.{phase}")
    with open(path, "w") as hook:
        hook.write("#!" + sys.executable + "\nimport json, os, sys, time\n"
                   "event = json.load(sys.stdin)\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def counting_hook(directory, request="ping", sleep=0.0, log_name="executions.log"):
    """A pre hook that appends ``automation index host`` to a log, then sleeps."""
    log = os.path.join(directory, log_name)
    write_hook(directory, request, "pre", f"""
with open({log!r}, "a") as log:
    log.write(f"{{event['automation']}} {{event['index']}} {{event['host']}}\\n")
time.sleep({sleep})
""")
    return log


def executions(log_path):
    """The ``(automation, index, host)`` lines a counting hook wrote."""
    if not os.path.exists(log_path):
        return []
    with open(log_path) as log:
        return [tuple(line.split()) for line in log if line.strip()]


def assert_each_index_ran_once(log_path, automation_id):
    """No step of the automation ran twice; returns its ``(automation, index)`` runs."""
    runs = [(a, i) for a, i, _ in executions(log_path) if a == automation_id]
    doubled = [key for key, n in collections.Counter(runs).items() if n > 1]
    assert not doubled, f"executed twice: {doubled}"
    return runs


def recording_hook(directory, request, phase, script=""):
    """A ``phase`` hook that appends its stdin (one JSON object) to
    ``<request>.<phase>.jsonl``, then runs ``script`` (Python, with the
    payload as ``event``), which may write to stderr and exit non-zero."""
    record = os.path.join(directory, f"{request}.{phase}.jsonl")
    write_hook(directory, request, phase, f"""
with open({record!r}, "a") as out:
    out.write(json.dumps(event) + "\\n")
{script}
""")
    return record


def recorded(record_path):
    """The payloads a recording hook saw, in order."""
    if not os.path.exists(record_path):
        return []
    with open(record_path) as record:
        return [json.loads(line) for line in record if line.strip()]


def failing_hook(directory, request, message):
    """A pre hook that fails every ``request`` with ``message`` on stderr."""
    return write_hook(directory, request, "pre",
                      f"sys.stderr.write({message + chr(10)!r})\nsys.exit(1)\n")


def serial_hook(directory, request, seconds):
    """A pre hook that lets one ``request`` at a time through, each taking
    ``seconds``: the peers sharing ``directory`` work through them in turn."""
    lock = os.path.join(directory, request + ".lock")
    return write_hook(directory, request, "pre", f"""
import fcntl
with open({lock!r}, "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    time.sleep({seconds})
""")


class Gate:
    """A gate the test holds shut: an exclusive lock on a file, taken here
    and kept until :meth:`open` (or this process's end).  A gated hook waits
    on it, so the requests it gates stay running exactly as long as the
    test wants, however fast or slow the machine is."""

    def __init__(self, path):
        self.path = str(path)
        self._file = open(self.path, "a")
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def open(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()


def gated_hook(directory, request, log_name="executions.log") -> Gate:
    """A pre hook that appends ``automation index host`` to a log (as
    :func:`counting_hook` does), then waits until the returned gate opens."""
    os.makedirs(directory, exist_ok=True)
    gate = Gate(os.path.join(directory, f"{request}.gate"))
    log = os.path.join(directory, log_name)
    write_hook(directory, request, "pre", f"""
import fcntl
with open({log!r}, "a") as log:
    log.write(f"{{event['automation']}} {{event['index']}} {{event['host']}}\\n")
with open({gate.path!r}) as gate:
    fcntl.flock(gate, fcntl.LOCK_SH)
""")
    return gate
