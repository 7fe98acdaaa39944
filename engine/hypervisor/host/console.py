"""A VM's serial console, through its host's libvirt, on this process's
stdin and stdout: what ``peerctl console`` runs.

:func:`attach` opens the host's libvirt, finds the domain by uuid and takes
its console (``VIR_DOMAIN_CONSOLE_FORCE``: a client holding it is cut off);
:meth:`Console.run` pumps bytes both ways until the session ends and says
how (:class:`Ended`).  It works the way ``virsh console`` does: a
non-blocking stream and stdin, both watched by libvirt's default event loop
in one thread of its own, so every byte is moved by that one thread.

Promises:
- :func:`attach` either returns a console attached to the running domain or
  raises, from the error root, one line a user can act on:
  :class:`~engine.errors.Unavailable` when the host's libvirt cannot be
  opened (naming the URI), :class:`~engine.errors.Failed` when the domain is
  not there, is not running, or the hypervisor offers no console (libvirt's
  test driver never does: a domain another process's ``test:///`` holds is
  said so, not "not defined");
- on a terminal (``tty=True``) stdin is put in raw mode for the session and
  restored whatever ends it (escape, console closed, error, SIGTERM, SIGHUP);
  Ctrl-] (``ESCAPE``) leaves, every other byte goes to the guest;
- without a terminal every byte of stdin goes to the guest, Ctrl-] too, and
  the end of stdin does not end the session: the console closing, a signal
  (SIGINT, SIGTERM, SIGHUP) or ``timeout`` does;
- the guest's bytes go to stdout unchanged; nothing else is written there.
"""
from __future__ import annotations

import os
import signal
import termios
import threading
import time
import tty as ttymode
from dataclasses import dataclass

import libvirt

from engine.errors import Failed, Unavailable

__all__ = ["ESCAPE", "Console", "Ended", "attach"]

ESCAPE = b"\x1d"                # Ctrl-], as telnet and virsh
_CHUNK = 65536
_SETTLE = 3.0                   # seconds for libvirt to see a stopped guest stopped
_BACKLOG = 1 << 20              # stop reading stdin while this much waits for the guest
_STATES = {libvirt.VIR_DOMAIN_NOSTATE: "in no state", libvirt.VIR_DOMAIN_RUNNING: "running",
           libvirt.VIR_DOMAIN_BLOCKED: "blocked", libvirt.VIR_DOMAIN_PAUSED: "paused",
           libvirt.VIR_DOMAIN_SHUTDOWN: "shutting down", libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
           libvirt.VIR_DOMAIN_CRASHED: "crashed", libvirt.VIR_DOMAIN_PMSUSPENDED: "pmsuspended"}


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


_loop_lock = threading.Lock()
_loop_started = False


def _event_loop() -> None:
    """libvirt's default event loop, in a daemon thread, once per process.
    It must be registered before a connection is opened to be that
    connection's (keepalive, stream events)."""
    global _loop_started
    with _loop_lock:
        if _loop_started:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run():
            while True:
                libvirt.virEventRunDefaultImpl()
        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _loop_started = True


def _why(exc: libvirt.libvirtError) -> str:
    return (exc.get_error_message() or str(exc)).splitlines()[0]


def attach(uri: str, uuid: str, name: str, host: str) -> "Console":
    """The console of VM ``name`` (``uuid``) on ``host``, whose libvirt is at ``uri``."""
    _event_loop()
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)   # no stray stderr lines
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise Unavailable(f"cannot reach {host}'s libvirt at {uri}: {_why(exc)}") from None
    try:
        try:
            conn.setKeepAlive(5, 3)         # a host gone away ends the session
        except libvirt.libvirtError:
            pass                            # drivers without keepalive (test, local)
        try:
            dom = conn.lookupByUUIDString(uuid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                if _driver(conn) == "TEST":
                    # test:///default lives in the peer's process: another
                    # process never sees its domains, and no test domain
                    # has a console anyway; say the one thing that holds.
                    raise _no_console(host, uri) from None
                raise Failed(f"VM {name} ({uuid}) is not defined on {host}'s libvirt "
                             f"({uri})") from None
            raise Failed(f"cannot look up VM {name} on {host} ({uri}): {_why(exc)}") from None
        state = dom.state()[0]
        if not dom.isActive():
            raise Failed(f"VM {name} is {_STATES.get(state, f'in state {state}')} on {host}: "
                         "start it first")
        stream = conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
        try:
            dom.openConsole(None, stream, libvirt.VIR_DOMAIN_CONSOLE_FORCE)
        except libvirt.libvirtError as exc:
            _quietly(stream.abort)
            if exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT:
                raise _no_console(host, uri) from None
            raise Failed(f"cannot open the console of VM {name} on {host}: "
                         f"{_why(exc)}") from None
        return Console(conn, dom, stream, name, host, uri)
    except BaseException:
        _quietly(conn.close)
        raise


def _no_console(host: str, uri: str) -> Failed:
    return Failed(f"the hypervisor of {host} ({uri}) does not offer a console")


def _driver(conn) -> str:
    try:
        return (conn.getType() or "").upper()
    except libvirt.libvirtError:
        return ""


def _quietly(call, *args) -> None:
    try:
        call(*args)
    except (libvirt.libvirtError, OSError):
        pass


class Console:
    """An attached console; :meth:`run` it once."""

    def __init__(self, conn, dom, stream, name: str, host: str, uri: str):
        self.conn, self.dom, self.stream = conn, dom, stream
        self.name, self.host, self.uri = name, host, uri
        self._done = threading.Event()
        self._ended: Ended | None = None
        self._error: str | None = None
        self._pending = b""             # stdin bytes the stream did not take yet
        self._stdin_watch = None
        self._stdin_paused = False

    # -- the session -----------------------------------------------------------

    def run(self, stdin: int = 0, stdout: int = 1, tty: bool = True,
            timeout: float | None = None) -> Ended:
        """Pump until the session ends; raise :class:`Failed` if it ends by
        an error (the connection lost, the console taken by another client)."""
        self.stdin, self.stdout, self.tty = stdin, stdout, tty
        saved_tty = termios.tcgetattr(stdin) if tty else None
        saved_signals = {}
        try:
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
                saved_signals[signum] = signal.signal(
                    signum, signal.SIG_IGN if signum == signal.SIGPIPE else self._on_signal)
            if tty:
                ttymode.setraw(stdin, termios.TCSANOW)
            self.stream.eventAddCallback(self._stream_events(), self._on_stream, None)
            self._stdin_watch = libvirt.virEventAddHandle(
                stdin, libvirt.VIR_EVENT_HANDLE_READABLE, self._on_stdin, None)
            _quietly(self.conn.registerCloseCallback, self._on_conn_closed, None)
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._done.wait(0.2):         # a short wait lets signals in
                if deadline is not None and time.monotonic() >= deadline:
                    self._end(Ended("timeout"))
            if self._ended is not None and self._ended.reason == "closed":
                self._error = self._why_closed()
        finally:
            self._close()
            if saved_tty is not None:
                termios.tcsetattr(stdin, termios.TCSADRAIN, saved_tty)
            for signum, handler in saved_signals.items():
                signal.signal(signum, handler)
        if self._error is not None:
            raise Failed(self._error)
        return self._ended

    def _why_closed(self) -> str | None:
        """None when the stream ended because the guest stopped (libvirt
        may take a moment to see QEMU gone); else what to tell the user:
        it still runs, so another client took the console, or the host's
        libvirt went away.  libvirt's own word for a stream that failed
        ("stream had I/O failure") says nothing more."""
        deadline = time.monotonic() + _SETTLE
        while True:
            try:
                if not self.dom.isActive():
                    return None
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return None             # destroyed and undefined: stopped too
                return f"lost {self.host}'s libvirt at {self.uri}: {_why(exc)}"
            if time.monotonic() >= deadline:
                return (f"the console of VM {self.name} on {self.host} closed while the VM "
                        "runs (another client may have taken it over)")
            time.sleep(0.1)

    def _end(self, ended: Ended | None = None, error: str | None = None) -> None:
        if not self._done.is_set():
            self._ended, self._error = ended, error
            self._done.set()

    def _on_signal(self, signum, _frame) -> None:
        self._end(Ended("signal", signum))

    def _close(self) -> None:
        self._done.set()
        if self._stdin_watch is not None:
            _quietly(libvirt.virEventRemoveHandle, self._stdin_watch)
        _quietly(self.stream.eventRemoveCallback)
        _quietly(self.stream.abort)
        _quietly(self.conn.unregisterCloseCallback)
        _quietly(self.conn.close)

    # -- the event loop's thread -----------------------------------------------

    def _stream_events(self) -> int:
        events = (libvirt.VIR_STREAM_EVENT_READABLE | libvirt.VIR_STREAM_EVENT_ERROR
                  | libvirt.VIR_STREAM_EVENT_HANGUP)
        return events | (libvirt.VIR_STREAM_EVENT_WRITABLE if self._pending else 0)

    def _on_stream(self, _stream, events, _opaque) -> None:
        if self._done.is_set():
            return
        try:
            if events & libvirt.VIR_STREAM_EVENT_READABLE and not self._from_guest():
                return
            if events & libvirt.VIR_STREAM_EVENT_WRITABLE:
                self._to_guest(b"")
            if events & (libvirt.VIR_STREAM_EVENT_ERROR | libvirt.VIR_STREAM_EVENT_HANGUP):
                self._from_guest()
                self._closed_by_host()
        except libvirt.libvirtError:
            self._closed_by_host()
        except OSError as exc:          # stdout gone (EPIPE): nobody reads the guest
            self._end(error=f"cannot write the console's output: {exc.strerror}")

    def _from_guest(self) -> bool:
        """Copy what the guest sent to stdout; False once the stream ended."""
        while True:
            data = self.stream.recv(_CHUNK)
            if isinstance(data, int):       # -2: nothing more for now
                return True
            if not data:
                self._closed_by_host()
                return False
            view = memoryview(data)
            while view:
                view = view[os.write(self.stdout, view):]

    def _closed_by_host(self) -> None:
        """The stream ended or failed; :meth:`_why_closed` tells why, in the
        main thread (no libvirt call is made from the event loop's)."""
        self._end(Ended("closed"))

    def _on_stdin(self, _watch, fd, _events, _opaque) -> None:
        if self._done.is_set():
            return
        try:
            data = os.read(fd, _CHUNK)
        except OSError as exc:
            data = b""
            if self.tty:
                self._end(error=f"cannot read the terminal: {exc.strerror}")
                return
        if not data:
            libvirt.virEventRemoveHandle(self._stdin_watch)
            self._stdin_watch = None
            if self.tty:                    # the terminal went away
                self._end(Ended("stdin"))
            return                          # a pipe ended: wait for the guest's answer
        if self.tty and ESCAPE in data:
            self._to_guest(data[:data.index(ESCAPE)])
            self._end(Ended("escape"))
            return
        try:
            self._to_guest(data)
        except libvirt.libvirtError:
            self._closed_by_host()

    def _to_guest(self, data: bytes) -> None:
        """Send ``data`` after what still waits; keep what the stream does
        not take, and watch for it to become writable."""
        self._pending += data
        while self._pending:
            sent = self.stream.send(self._pending)
            if sent == -2:                  # full for now
                break
            self._pending = self._pending[sent:]
        self.stream.eventUpdateCallback(self._stream_events())
        paused = len(self._pending) > _BACKLOG
        if self._stdin_watch is not None and paused != self._stdin_paused:
            libvirt.virEventUpdateHandle(self._stdin_watch,
                                         0 if paused else libvirt.VIR_EVENT_HANDLE_READABLE)
            self._stdin_paused = paused

    def _on_conn_closed(self, _conn, reason, _opaque) -> None:
        if reason != libvirt.VIR_CONNECT_CLOSE_REASON_CLIENT:
            self._end(error=f"lost {self.host}'s libvirt at {self.uri}")
