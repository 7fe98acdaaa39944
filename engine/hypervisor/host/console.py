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
- the terminal's side (raw mode, Ctrl-], the end of stdin, signals,
  ``timeout``, the guest's bytes on stdout) is :mod:`engine.terminal`'s,
  which the API's websocket transport (``console --via api``) shares.
"""
from __future__ import annotations

import os
import threading
import time

import libvirt

from engine.errors import Failed, Unavailable
from engine.terminal import ESCAPE, Ended, Session

__all__ = ["ESCAPE", "Console", "Ended", "attach"]

_CHUNK = 65536
_SETTLE = 3.0                   # seconds for libvirt to see a stopped guest stopped
_BACKLOG = 1 << 20              # stop reading stdin while this much waits for the guest
_STATES = {libvirt.VIR_DOMAIN_NOSTATE: "in no state", libvirt.VIR_DOMAIN_RUNNING: "running",
           libvirt.VIR_DOMAIN_BLOCKED: "blocked", libvirt.VIR_DOMAIN_PAUSED: "paused",
           libvirt.VIR_DOMAIN_SHUTDOWN: "shutting down", libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
           libvirt.VIR_DOMAIN_CRASHED: "crashed", libvirt.VIR_DOMAIN_PMSUSPENDED: "pmsuspended"}


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
        self.session = Session()        # the terminal's side, made again by run
        self._pending = b""             # stdin bytes the stream did not take yet
        self._stdin_watch = None
        self._stdin_paused = False

    @property
    def where(self) -> str:
        """How the console is reached, for the line saying it attached."""
        return self.uri

    # -- the session -----------------------------------------------------------

    def run(self, stdin: int = 0, stdout: int = 1, tty: bool = True,
            timeout: float | None = None) -> Ended:
        """Pump until the session ends; raise :class:`Failed` if it ends by
        an error (the connection lost, the console taken by another client)."""
        self.session = session = Session(stdin, stdout, tty, timeout)
        with session:
            try:
                self.stream.eventAddCallback(self._stream_events(), self._on_stream, None)
                self._stdin_watch = libvirt.virEventAddHandle(
                    stdin, libvirt.VIR_EVENT_HANDLE_READABLE, self._on_stdin, None)
                _quietly(self.conn.registerCloseCallback, self._on_conn_closed, None)
                ended = session.wait()
                if ended.reason == "closed":
                    why = self._why_closed()
                    if why is not None:
                        raise Failed(why)
                return ended
            finally:
                self._close()

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

    def _close(self) -> None:
        self.session.done.set()         # the event loop's callbacks do nothing more
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
        if self.session.done.is_set():
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

    def _from_guest(self) -> bool:
        """Copy what the guest sent to stdout; False once the stream ended
        (or stdout did)."""
        while True:
            data = self.stream.recv(_CHUNK)
            if isinstance(data, int):       # -2: nothing more for now
                return True
            if not data:
                self._closed_by_host()
                return False
            if not self.session.show(data):
                return False

    def _closed_by_host(self) -> None:
        """The stream ended or failed; :meth:`_why_closed` tells why, in the
        main thread (no libvirt call is made from the event loop's)."""
        self.session.end(Ended("closed"))

    def _on_stdin(self, _watch, fd, _events, _opaque) -> None:
        if self.session.done.is_set():
            return
        try:
            data = os.read(fd, _CHUNK)
        except OSError as exc:
            self.session.unreadable(exc)
            data = b""
        if not data:
            _quietly(libvirt.virEventRemoveHandle, self._stdin_watch)
            self._stdin_watch = None
        to_guest = self.session.typed(data)
        if to_guest:
            try:
                self._to_guest(to_guest)
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
            self.session.end(error=f"lost {self.host}'s libvirt at {self.uri}")
