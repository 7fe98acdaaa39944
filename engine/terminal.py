"""The operator's side of a console session, whatever carries the guest's
bytes: this process's stdin and stdout, its terminal's mode, its signals
and its timeout.  ``peerctl console`` runs it over libvirt's stream
(:mod:`engine.hypervisor.host.console`) or over a peer's API websocket
(:mod:`engine.web.console_client`); the transport moves bytes on a thread
of its own and asks this module what they mean, so both behave alike.

Promises:
- on a terminal (``tty=True``) stdin is raw for the session and restored
  whatever ends it (escape, console closed, error, SIGTERM, SIGHUP);
  Ctrl-] (:data:`ESCAPE`) leaves, every byte typed before it goes to the
  guest, none after;
- without a terminal every byte of stdin goes to the guest, Ctrl-] too, and
  the end of stdin does not end the session: the console closing, a signal
  (SIGINT, SIGTERM, SIGHUP) or ``timeout`` does;
- the guest's bytes go to stdout unchanged (:meth:`Session.show`); nothing
  else is written there;
- the session ends once (:meth:`Session.end`): the first reason given is
  the one :meth:`Session.wait` returns, or raises as
  :class:`~engine.errors.Failed` when it was an error.

Standard library only: a workstation without libvirt runs it too.
"""
from __future__ import annotations

import os
import signal
import termios
import threading
import time
import tty as ttymode
from dataclasses import dataclass

from engine.errors import Failed, PeerctlError

__all__ = ["ESCAPE", "Ended", "Session"]

ESCAPE = b"\x1d"                # Ctrl-], as telnet and virsh
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Ended:
    """How a session ended: ``reason`` is ``escape``, ``closed`` (the guest's
    console stream ended), ``timeout``, ``stdin`` (the terminal went away) or
    ``signal`` (``signum`` says which); ``exit_code`` is what the command
    line exits with."""
    reason: str
    signum: int = 0

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.reason == "signal" else 0


class Session:
    """One console session's terminal, for a ``with`` block in the main
    thread; the transport's thread calls :meth:`typed`, :meth:`show` and
    :meth:`end`."""

    def __init__(self, stdin: int = 0, stdout: int = 1, tty: bool = True,
                 timeout: float | None = None):
        self.stdin, self.stdout, self.tty, self.timeout = stdin, stdout, tty, timeout
        self.done = threading.Event()
        self.ended: Ended | None = None
        self.error: PeerctlError | None = None
        self._saved_tty = None
        self._saved_signals: dict = {}

    def __enter__(self) -> "Session":
        self._saved_tty = termios.tcgetattr(self.stdin) if self.tty else None
        try:
            for signum in _SIGNALS:
                self._saved_signals[signum] = signal.signal(signum, self._on_signal)
            self._saved_signals[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            if self.tty:
                ttymode.setraw(self.stdin, termios.TCSANOW)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *_exc) -> None:
        self.done.set()
        self._restore()

    def _restore(self) -> None:
        if self._saved_tty is not None:
            termios.tcsetattr(self.stdin, termios.TCSADRAIN, self._saved_tty)
            self._saved_tty = None
        for signum, handler in self._saved_signals.items():
            signal.signal(signum, handler)
        self._saved_signals = {}

    # -- the main thread -------------------------------------------------------

    def wait(self) -> Ended:
        """Until the session ends: how it ended, or its error raised."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not self.done.wait(0.2):          # a short wait lets signals in
            if deadline is not None and time.monotonic() >= deadline:
                self.end(Ended("timeout"))
        if self.error is not None:
            raise self.error
        return self.ended

    def _on_signal(self, signum, _frame) -> None:
        self.end(Ended("signal", signum))

    # -- any thread ------------------------------------------------------------

    def end(self, ended: Ended | None = None, error: str | PeerctlError | None = None) -> None:
        """End the session (the first call counts): ``ended`` says how, or
        ``error`` (a line, or one of the error root's) says what failed."""
        if self.done.is_set():
            return
        self.ended = ended
        self.error = Failed(error) if isinstance(error, str) else error
        self.done.set()

    def typed(self, data: bytes) -> bytes:
        """What of ``data``, read from stdin (``b""``: its end), goes to the
        guest; ends the session on Ctrl-] or a terminal gone, on a terminal."""
        if not self.tty:
            return data             # a pipe's end: wait for the guest's answer
        if not data:
            self.end(Ended("stdin"))
            return b""
        if ESCAPE in data:
            self.end(Ended("escape"))
            return data[:data.index(ESCAPE)]
        return data

    def unreadable(self, exc: OSError) -> None:
        """stdin could not be read: on a terminal that ends the session; a
        pipe that fails is taken as its end."""
        if self.tty:
            self.end(error=f"cannot read the terminal: {exc.strerror}")

    def show(self, data: bytes) -> bool:
        """Write the guest's ``data`` to stdout, all of it; False (the session
        ended saying why) when stdout is gone."""
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.stdout, view):]
        except OSError as exc:          # EPIPE: nobody reads the guest
            self.end(error=f"cannot write the console's output: {exc.strerror}")
            return False
        return True
