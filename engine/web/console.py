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
in :mod:`engine.hypervisor.host.console`: the websocket's side hands work to it
with a zero timeout, and receives the guest's bytes through the asyncio
loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac

import structlog
from aiohttp import WSMsgType, web

from engine.errors import PeerctlError, Unavailable, UsageError
from engine.hypervisor.host.console_stream import BACKLOG, CHUNK, STOPPED, StreamPump, why_ended

from . import identity
from .appkeys import API, REVOCATIONS
from .routes import Refusal

__all__ = ["add_routes", "PATH", "STOPPED", "REVOKED", "CLOSE_REASON_BYTES"]

log = structlog.get_logger("peerctl.api")

PATH = "/v1/vms/{name}/console"
CLOSE_REASON_BYTES = 123        # RFC 6455: a control frame's payload is 125 bytes
REVOKED = 4401                  # the token or session that opened it ended
_ENDED = {"stopped": 1000, "lost": 4503, "taken": 4409}   # why_ended's kinds as close codes


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
        socket = web.WebSocketResponse(heartbeat=30.0, max_msg_size=CHUNK)
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
    from engine.hypervisor.host import console
    from engine.operations.vms import console_target
    vm, uri = console_target(ctx, name)
    return console.attach(uri, vm["uuid"], vm["name"], vm["host"])


async def _session(api, ctx, name: str, socket: web.WebSocketResponse) -> None:
    try:
        attached = await api.run(_attach, ctx, name)
    except PeerctlError as exc:
        await _end(socket, _close_code(exc), str(exc))
        return
    pump = StreamPump(attached, asyncio.get_running_loop())
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
                kind, why = await api.run(why_ended, attached)
                code = _ENDED[kind]
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


async def _to_browser(socket, pump: StreamPump, typing: asyncio.Future):
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
        if pump.queued > BACKLOG:
            return 4409, "the browser does not keep up with the console's output"
        try:
            await socket.send_bytes(data)
        except ConnectionError:
            return 1000, "the browser left the console"


async def _to_guest(socket, pump: StreamPump) -> None:
    """What the browser types, to the guest, until it closes its side."""
    async for message in socket:
        if message.type == WSMsgType.BINARY:
            await pump.send(message.data)
        elif message.type == WSMsgType.TEXT:
            await pump.send(message.data.encode())
        elif message.type == WSMsgType.ERROR:
            return
