"""What every command gets: its arguments, its settings, the cluster (an
operations :class:`~engine.operations.Context`) and where output goes.

stdout carries the command's answer only (one JSON document with
``--format json``); messages, warnings and progress go to stderr."""
from __future__ import annotations

import os
import sys

from engine.errors import PermissionDenied, Unavailable
from engine.operations import Context as Operations

from . import table

__all__ = ["Context", "say", "warn_unreadable", "me", "short_path", "configure_logging"]

_LOGGING = []


def configure_logging(level: str, settings: dict | None = None) -> None:
    """structlog to stderr (never stdout: it carries the JSON), once per
    process: under systemd, stderr is the journal.

    ``level`` is the command's own (INFO for the peer and serve, WARNING for
    the rest, DEBUG with --debug); the ``log_level`` setting overrides it
    unless it is DEBUG.  ``log_format`` (settings.py checked it) is
    ``console`` (one ``time [level] event key=value`` line) or ``json`` (one
    object per line: ``timestamp``, ``level``, ``event`` and the context).
    The standard library's ``logging`` (libraries' warnings) goes the same
    way, and the processes it starts inherit ``json`` ($PEERCTL_LOG_FORMAT),
    so that every line on stderr has the chosen format."""
    if _LOGGING:
        return
    settings = settings or {}
    if level != "DEBUG" and settings.get("log_level"):
        level = settings["log_level"].upper()
    _LOGGING.append(level)
    import logging
    import structlog
    if settings.get("log_format") == "json":
        os.environ["PEERCTL_LOG_FORMAT"] = "json"   # processes it starts (the guard) too
        render = [structlog.processors.format_exc_info,
                  structlog.processors.JSONRenderer(default=repr)]
    else:
        render = [OneLine()]
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso"), *render],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True)
    root = logging.getLogger()
    root.addHandler(_to_structlog())
    root.setLevel(max(getattr(logging, level), logging.WARNING))


def _to_structlog():
    """A standard-library handler passing each record on as a structlog
    event: its logger's name, its message; the level structlog's filter
    then judges.  (Made here: a command that never logs never imports
    ``logging``.)"""
    import logging
    import structlog

    class ToStructlog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            try:
                structlog.get_logger().log(record.levelno, record.getMessage(),
                                           logger=record.name)
            except Exception:   # a library's badly formatted message: never crash logging
                self.handleError(record)
    return ToStructlog()


class OneLine:
    """structlog's ConsoleRenderer(colors=False) line, written directly: a
    peer logs a few lines per VM it builds, and ConsoleRenderer's columns
    cost more than the rest of its logging.  Same text (bench/upgrade.py
    and the tests read it); an event with a traceback or a logger name is
    left to ConsoleRenderer itself."""

    _FIDDLY = frozenset(("stack", "exception", "exc_info", "logger", "logger_name"))

    def __init__(self):
        import structlog
        self.console = structlog.dev.ConsoleRenderer(colors=False)

    def __call__(self, logger, name: str, event: dict) -> str:
        if not self._FIDDLY.isdisjoint(event):
            return self.console(logger, name, event)
        head = [event.pop("timestamp", ""), event.pop("level", None),
                str(event.pop("event")).ljust(30) if "event" in event else ""]
        if head[1] is not None:
            head[1] = f"[{head[1].ljust(9)}]"
        head.extend(f"{key}={_value(event[key])}" for key in sorted(event))
        return " ".join(part for part in head if part).rstrip(" ")


_QUOTED = frozenset(" \t=\r\n\"'")


def _value(value) -> str:
    """A value as ConsoleRenderer shows it: a plain word bare, the rest repr()."""
    if isinstance(value, str) and _QUOTED.isdisjoint(value):
        return value
    return repr(value)


def say(message: str) -> None:
    """A message for the user, on stderr."""
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()


def warn_unreadable(key: str, why: str, skipped: bool = True) -> None:
    """One line per key a command had to skip, or read only in part (each
    once; see engine/core/values.py)."""
    say(f"peerctl: warning: {'skipped unreadable key' if skipped else 'partly unreadable key'} "
        f"{key}: {why}")


def me() -> str:
    """How the user called us, for the commands we suggest."""
    base = os.path.basename(sys.argv[0] or "peerctl")
    return "python peerctl.py" if base.endswith(".py") else "peerctl"


def short_path(path: str) -> str:
    """``path`` relative to here when it is below here, else as it is."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


class Context(Operations):
    """The operations' context, plus the command line's arguments and output."""

    def __init__(self, args, settings: dict):
        super().__init__(settings["etcd"], settings["cluster"], settings.get("credentials"),
                         settings.get("placement_config"))
        self.args = args
        self.settings = settings
        self.json = settings["format"] == "json"
        self.debug = bool(getattr(args, "debug", False))
        self.space = None       # etcd's database size and alarms, once the store is open
        self.remote = None      # the remote it runs through (remote_config.Remote), if any
        self.api = None         # then its API client (engine/web/client.py)

    def through(self, remote) -> None:
        """Run through ``remote``'s API: etcd is never opened."""
        from engine.web.client import ApiClient
        self.remote = remote
        self.api = ApiClient(remote.urls, remote.token, remote.cacert)

    def store(self):
        if self.api is not None:        # a command without its route: never etcd behind
            from engine.errors import UsageError
            raise UsageError(f"{self.args.command} does not run through the API "
                             f"({self.remote.where()}): run it where etcd is reachable")
        return super().store()

    def opened(self) -> None:
        if self.args.command != "peer":
            configure_logging("DEBUG" if self.debug else "WARNING", self.settings)
            self._check_space()

    def _check_space(self) -> None:
        """etcd's space, for hostlist's totals; a warning on stderr when it is
        out of space or nearing its quota.  Not reaching it is left to the
        command's own first call to report."""
        from engine.core.maintenance import space, space_warning
        from engine.core.validate import parse_size
        try:
            self.space = space(self._store, parse_size(self.settings["etcd_quota"]))
        except (Unavailable, PermissionDenied):
            return
        warning = space_warning(self.space)
        if warning:
            say(f"peerctl: warning: {warning}")

    def emit(self, doc, text: str | None = None) -> None:
        """The command's answer: ``doc`` as JSON, else ``text`` (or nothing)."""
        if self.json:
            sys.stdout.write(table.to_json(doc) + "\n")
        elif text:
            sys.stdout.write(text.rstrip("\n") + "\n")
        sys.stdout.flush()
