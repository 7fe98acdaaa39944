"""The peers' log lines: configure_logging's renderer writes, for each
event, the very line structlog's ConsoleRenderer writes (bench/upgrade.py
and tests read them), and leaves tracebacks to ConsoleRenderer."""
from __future__ import annotations

import structlog

from engine.commandline.context import OneLine

STAMP = "2026-11-26T13:30:49.322799Z"
EVENTS = [
    {"timestamp": STAMP, "level": "info", "event": "vm_defined", "vm": "vm0",
     "uuid": "9a918f0d-8576-460d-b011-6a4a810b9dfc", "image": None, "disk": "/p/x.qcow2"},
    {"timestamp": STAMP, "level": "warning", "event": "vm_reconcile_failed",
     "error": "etcd: connection refused", "host": "h1"},
    {"timestamp": STAMP, "level": "error", "event": "an_event_name_longer_than_thirty_chars",
     "n": 3, "share": 0.5, "flag": True, "items": [1, "a"], "map": {"k": "v"}},
    {"timestamp": STAMP, "level": "info", "event": "quoting", "eq": "a=b", "quote": "it's",
     "dq": 'say "x"', "tab": "a\tb", "nl": "a\nb", "empty": "", "bytes": b"x", "word": "é"},
    {"level": "info", "event": "no_time"},
    {"timestamp": STAMP, "level": "debug", "event": 42},
    {"host": "h1", "only": "context"},
]


def test_each_event_is_the_line_console_renderer_writes():
    console = structlog.dev.ConsoleRenderer(colors=False)
    for event in EVENTS:
        assert OneLine()(None, "info", dict(event)) == console(None, "info", dict(event)), event


def test_an_event_with_a_traceback_keeps_it():
    try:
        raise ValueError("boom")
    except ValueError as exc:
        line = OneLine()(None, "error", {"timestamp": STAMP, "level": "error",
                                         "event": "vm_reconcile_crashed", "exc_info": exc})
    assert line.startswith(f"{STAMP} [error    ] vm_reconcile_crashed")
    assert "Traceback" in line and "ValueError: boom" in line
