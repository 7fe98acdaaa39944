"""``GET /v1/vms/{name}/console``: a VM's serial console over a websocket,
for the page's terminal (what ``peerctl console NAME`` is on a terminal).

Who may: an operator only.  A console is a write: whoever holds it types
into the guest, and taking it cuts off whoever held it before
(``VIR_DOMAIN_CONSOLE_FORCE``, as the command line).  A browser cannot set
headers on a websocket, so a session cookie's CSRF token comes as the query
parameter ``csrf`` and must match the ``peerctl_csrf`` cookie.

Promises:
- a request refused before the upgrade gets the API's JSON error: 401 with
  no known identity, 403 for a viewer or a wrong or missing ``csrf``, 400
  when it is not a websocket handshake;
- after the upgrade: one text message ``{"attached": {"vm", "host"}}``,
  then binary messages, the guest's bytes unchanged; every message the
  client sends (binary, or text as UTF-8) goes to the guest, in order;
- when the server ends the session it says why in one line, twice: a
  text message ``{"ended": LINE}``, then the close frame, whose reason is
  the same line cut to the 123 bytes the protocol allows.  Its code is 1000
  when the guest stopped (``console closed: the VM stopped``), otherwise
  4000 + the HTTP status the API would answer (4409: no such VM, not
  running, no console on this hypervisor, taken over by another client;
  4503: its host's libvirt unreachable or lost; 4400: a pattern matching
  several VMs; 4401: the token or session that opened it was deleted or
  expired, within a second, on every server: ``console closed: the token
  was deleted`` ...);
- the console is let go (stream aborted, connection closed) whenever the
  session ends, the client's side included.

Every byte of the console stream moves on libvirt's event loop thread, as
in :mod:`engine.hypervisor.console`: the websocket's side hands work to it
with a zero timeout, and receives the guest's bytes through the asyncio
loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import threading
import time

import structlog
from aiohttp import WSMsgType, web

from engine.errors import PeerctlError, Unavailable, UsageError

from . import identity
from .app import API, REVOCATIONS
from .routes import Refusal

__all__ = ["add_routes", "PATH", "STOPPED", "REVOKED", "CLOSE_REASON_BYTES"]

log = structlog.get_logger("peerctl.api")

PATH = "/v1/vms/{name}/console"
STOPPED = "console closed: the VM stopped"
CLOSE_REASON_BYTES = 123        # RFC 6455: a control frame's payload is 125 bytes
REVOKED = 4401                  # the token or session that opened it ended
_CHUNK = 65536
_BACKLOG = 1 << 20              # bytes waiting on either side before it pauses or ends
_SETTLE = 3.0                   # seconds for libvirt to see a stopped guest stopped


def add_routes(app, who_asks, check_write) -> None:
    """Route :data:`PATH` to the console session."""

    async def console(request):
        who = await who_asks(request)
        check_write(request, dataclasses.replace(who, ambient=False), "open a console")
        if who.ambient and not _csrf_in_query(request):
            raise Refusal(403, f"missing or wrong CSRF token (the csrf query parameter must "
                          f"match the {identity.CSRF_COOKIE} cookie)")
        unknown = sorted(set(request.query) - {"csrf"})
        if unknown:
            raise UsageError(f"unknown query parameter {unknown[0]!r} (known: csrf)")
        socket = web.WebSocketResponse(heartbeat=30.0, max_msg_size=_CHUNK)
        if not socket.can_prepare(request).ok:
            raise Refusal(400, f"{request.path} is a websocket: connect with an "
                          "Upgrade: websocket handshake")
        api = request.app[API]
        await socket.prepare(request)

        async def revoked(why):
            await _end(socket, REVOKED, f"console closed: {why}")
        try:
            with request.app[REVOCATIONS].holding(who, revoked):
                await _session(api, api.context(who.role), request.match_info["name"], socket)
        except Exception:           # past the upgrade no JSON answer can go: a close frame
            log.exception("console session failed", path=request.path)
            await _end(socket, 1011, "internal error (logged by the server)")
        return socket

    app.router.add_get(PATH, console)


def _csrf_in_query(request) -> bool:
    cookie = request.cookies.get(identity.CSRF_COOKIE, "")
    given = request.query.get("csrf", "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), given.encode())


def _close_code(exc: PeerctlError) -> int:
    if isinstance(exc, UsageError):
        return 4400
    if isinstance(exc, Unavailable):
        return 4503
    return 4409


def _reason(line: str) -> str:
    """``line`` cut to fit a close frame."""
    if len(line.encode()) <= CLOSE_REASON_BYTES:
        return line
    cut = line.encode()[:CLOSE_REASON_BYTES - 3].decode(errors="ignore")
    return cut + "..."


def _attach(ctx, name: str):
    """The console of the one VM ``name`` matches (blocking: etcd, libvirt)."""
    from engine.hypervisor import console
    from engine.operations.vms import console_target
    vm, uri = console_target(ctx, name)
    return console.attach(uri, vm["uuid"], vm["name"], vm["host"])


async def _session(api, ctx, name: str, socket: web.WebSocketResponse) -> None:
    try:
        attached = await api.run(_attach, ctx, name)
    except PeerctlError as exc:
        await _end(socket, _close_code(exc), str(exc))
        return
    pump = _Pump(attached, asyncio.get_running_loop())
    if socket.closed:               # ended while it attached (its token revoked)
        await asyncio.shield(api.run(pump.close))
        return
    code, why = 1000, STOPPED
    try:
        await socket.send_json({"attached": {"vm": attached.name, "host": attached.host}})
        pump.start()
        typing = asyncio.ensure_future(_to_guest(socket, pump))
        try:
            code, why = await _to_browser(socket, pump, typing)
            if code is None:            # the guest's side ended: say why
                code, why = await api.run(_why_ended, attached)
        finally:
            typing.cancel()
            await asyncio.wait({typing})    # its read of the socket ends before the close
    finally:
        await asyncio.shield(api.run(pump.close))
    await _end(socket, code, why)


async def _end(socket, code: int, why: str) -> None:
    if socket.closed:
        return
    line = (why.splitlines() or ["closed"])[0]
    try:
        await socket.send_json({"ended": line})
    except ConnectionError:
        return
    await socket.close(code=code, message=_reason(line).encode())


async def _to_browser(socket, pump: "_Pump", typing: asyncio.Future):
    """Send the guest's bytes until either side ends: ``(None, None)`` when
    the console stream ended, else the close code and reason to send."""
    while True:
        got = asyncio.ensure_future(pump.output.get())
        await asyncio.wait({got, typing}, return_when=asyncio.FIRST_COMPLETED)
        if not got.done():
            got.cancel()
            return 1000, "the browser left the console"
        data = got.result()
        if data is None:
            return None, None
        pump.sent(len(data))
        if pump.queued > _BACKLOG:
            return 4409, "the browser does not keep up with the console's output"
        try:
            await socket.send_bytes(data)
        except ConnectionError:
            return 1000, "the browser left the console"


async def _to_guest(socket, pump: "_Pump") -> None:
    """What the browser types, to the guest, until it closes its side."""
    async for message in socket:
        if message.type == WSMsgType.BINARY:
            await pump.send(message.data)
        elif message.type == WSMsgType.TEXT:
            await pump.send(message.data.encode())
        elif message.type == WSMsgType.ERROR:
            return


def _why_ended(attached) -> tuple[int, str]:
    """Why the console stream ended: the guest stopped (libvirt may take a
    moment to see QEMU gone), its host's libvirt was lost, or it still runs
    and another client took the console over."""
    import libvirt
    deadline = time.monotonic() + _SETTLE
    while True:
        try:
            if not attached.dom.isActive():
                return 1000, STOPPED
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return 1000, STOPPED
            return 4503, f"lost {attached.host}'s libvirt at {attached.uri}"
        if time.monotonic() >= deadline:
            return 4409, (f"the console of VM {attached.name} on {attached.host} closed while "
                          "the VM runs (another client may have taken it over)")
        time.sleep(0.1)


class _Pump:
    """Bytes between an attached console's stream and the asyncio loop,
    every stream call made on libvirt's event loop thread: ``output`` gets
    the guest's bytes, then None once the stream has ended."""

    def __init__(self, attached, loop: asyncio.AbstractEventLoop):
        import libvirt
        self.libvirt = libvirt
        self.attached, self.stream, self.loop = attached, attached.stream, loop
        self.output: asyncio.Queue = asyncio.Queue()
        self.queued = 0                 # bytes in ``output`` (the loop's side counts)
        self._lock = threading.Lock()
        self._pending = b""             # typed bytes the stream did not take yet
        self._drained = asyncio.Event()
        self._drained.set()
        self._ended = False

    def start(self) -> None:
        self.stream.eventAddCallback(self._events(), self._on_stream, None)

    async def send(self, data: bytes) -> None:
        """Queue ``data`` for the guest; wait while too much already waits."""
        await self._drained.wait()
        with self._lock:
            self._pending += data
            if len(self._pending) > _BACKLOG:
                self._drained.clear()
        self._on_libvirt_thread(self._write)

    def sent(self, size: int) -> None:
        self.queued -= size

    def close(self) -> None:
        """Let the console go (blocking): the stream on libvirt's thread,
        then the connection."""
        done = threading.Event()

        def stop():
            self._ended = True
            for call in (self.stream.eventRemoveCallback, self.stream.abort):
                try:
                    call()
                except self.libvirt.libvirtError:
                    pass
            done.set()
        self._on_libvirt_thread(stop)
        done.wait(5.0)
        try:
            self.attached.conn.close()
        except self.libvirt.libvirtError:
            pass

    # -- libvirt's event loop thread -----------------------------------------------

    def _on_libvirt_thread(self, call) -> None:
        def once(timer, _opaque):
            self.libvirt.virEventRemoveTimeout(timer)
            call()
        self.libvirt.virEventAddTimeout(0, once, None)

    def _events(self) -> int:
        lv = self.libvirt
        events = (lv.VIR_STREAM_EVENT_READABLE | lv.VIR_STREAM_EVENT_ERROR
                  | lv.VIR_STREAM_EVENT_HANGUP)
        return events | (lv.VIR_STREAM_EVENT_WRITABLE if self._pending else 0)

    def _on_stream(self, _stream, events, _opaque) -> None:
        lv = self.libvirt
        if self._ended:
            return
        try:
            if events & lv.VIR_STREAM_EVENT_READABLE and not self._read():
                return
            if events & lv.VIR_STREAM_EVENT_WRITABLE:
                self._write()
            if events & (lv.VIR_STREAM_EVENT_ERROR | lv.VIR_STREAM_EVENT_HANGUP):
                self._read()
                self._end()
        except lv.libvirtError:
            self._end()

    def _read(self) -> bool:
        """Hand over what the guest sent; False once the stream ended."""
        while True:
            data = self.stream.recv(_CHUNK)
            if isinstance(data, int):       # -2: nothing more for now
                return True
            if not data:
                self._end()
                return False
            self._deliver(bytes(data))

    def _write(self) -> None:
        if self._ended:
            return
        try:
            with self._lock:
                while self._pending:
                    sent = self.stream.send(self._pending)
                    if sent == -2:          # full for now: WRITABLE says when
                        break
                    self._pending = self._pending[sent:]
                drained = len(self._pending) <= _BACKLOG
            self.stream.eventUpdateCallback(self._events())
        except self.libvirt.libvirtError:
            self._end()
            return
        if drained:
            self._call_soon(self._drained.set)

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._deliver(None)

    def _deliver(self, data: bytes | None) -> None:
        def put():
            self.queued += len(data or b"")
            self.output.put_nowait(data)
        self._call_soon(put)

    def _call_soon(self, call) -> None:
        try:
            self.loop.call_soon_threadsafe(call)
        except RuntimeError:            # the server's loop is gone: nobody listens
            pass
