"""The client's side of the console websocket (:mod:`engine.web.console`):
what ``peerctl console --via api`` runs, so that a workstation reaches a
VM's serial console through a peer, with no libvirt access of its own.

:func:`attach` connects (a bearer token; HTTPS verified with the cluster's
CA when given) and waits for ``{"attached": ...}``; :meth:`ApiConsole.run`
then moves bytes both ways on an asyncio loop of its own thread, the
terminal's side being :mod:`engine.terminal`'s, as on the direct path.

Promises (each failure one line from the error root, the same the direct
path raises for the same cause):
- no API answers at any URL given: :class:`~engine.errors.Unavailable`
  (exit 3), naming the last; a refused handshake: 401/403
  :class:`~engine.errors.PermissionDenied` (exit 4) with the API's line;
- the server's ``{"ended": LINE}`` and close code become: 1000 the session
  ending as the direct path's does when the VM stops; 4409 (no such VM,
  not running, no console, taken over) :class:`~engine.errors.Failed`;
  4503 :class:`~engine.errors.Unavailable` before the console attached
  (its host's libvirt unreachable), ``Failed`` after (lost); 4400
  :class:`~engine.errors.UsageError`; 4401 (the token deleted or expired)
  ``PermissionDenied``; a connection lost without a close frame ``Failed``;
- leaving (Ctrl-], timeout, a signal, the terminal gone) closes the
  websocket with 1000, which lets the console go on the server.
"""
from __future__ import annotations

import asyncio
import json
import os
import ssl
import threading
import urllib.parse

import aiohttp

from engine.errors import Failed, PeerctlError, PermissionDenied, Unavailable, UsageError
from engine.terminal import Ended, Session

__all__ = ["ApiConsole", "attach"]

_CHUNK = 65536
_CONNECT_TIMEOUT = 10.0         # seconds for the TCP, TLS and websocket handshakes
_CLOSED = {4400: UsageError, 4401: PermissionDenied, 4409: Failed, 4503: Unavailable}


def attach(urls: list[str], name: str, token: str, cacert: str | None = None) -> "ApiConsole":
    """The console of VM ``name`` through the first API of ``urls`` that
    answers, attached (blocking)."""
    console = ApiConsole(name, token, cacert)
    try:
        console.attach(urls)
    except BaseException:
        console.stop()
        raise
    return console


class ApiConsole:
    """A console reached through a peer's API; :meth:`run` it once."""

    def __init__(self, name: str, token: str, cacert: str | None = None):
        self.name, self.token, self.cacert = name, token, cacert
        self.url = ""                   # the API that answered
        self.host = ""                  # the VM's host, as {"attached": ...} says
        self.session = Session()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="console-api",
                                        daemon=True)
        self._thread.start()
        self._http: aiohttp.ClientSession | None = None
        self._socket = None
        self._said = ""                 # the server's {"ended": LINE}

    @property
    def where(self) -> str:
        """How the console is reached, for the line saying it attached."""
        return f"through the API at {self.url}"

    def _call(self, coroutine, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    # -- attaching ---------------------------------------------------------------

    def attach(self, urls: list[str]) -> None:
        unreachable = None
        for url in urls:
            try:
                self._call(self._connect(url))
                break
            except Unavailable as exc:
                unreachable = exc
        else:
            raise unreachable or UsageError("no API URL to reach the console through")
        self._call(self._attached())

    async def _connect(self, url: str) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                sock_connect=_CONNECT_TIMEOUT))
        where = f"{url}/v1/vms/{urllib.parse.quote(self.name, safe='')}/console"
        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            self._socket = await asyncio.wait_for(self._http.ws_connect(
                where, headers=headers, ssl=self._ssl(url), heartbeat=30.0,
                max_msg_size=0), _CONNECT_TIMEOUT)
        except aiohttp.WSServerHandshakeError as exc:
            raise await self._refused(where, headers, exc.status, url) from None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise Unavailable(f"cannot reach the API at {url}: {_why(exc)}") from None
        self.url = url

    def _ssl(self, url: str):
        if not url.startswith("https://"):
            return None
        try:
            return ssl.create_default_context(cafile=self.cacert or None)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"cannot use the CA certificate {self.cacert}: {exc}") from None

    async def _refused(self, where: str, headers: dict, status: int, url: str) -> PeerctlError:
        """The API's own line for a refused handshake, as its error class."""
        line = f"the API at {url} answered {status}"
        try:
            async with self._http.get(where, headers=headers, ssl=self._ssl(url)) as plain:
                line = (await plain.json()).get("error") or line
        except (aiohttp.ClientError, OSError, ValueError, AttributeError):
            pass
        if status in (401, 403):
            return PermissionDenied(line)
        if status >= 500:
            return Unavailable(line)
        return UsageError(line) if status == 400 else Failed(line)

    async def _attached(self) -> None:
        """Wait for ``{"attached": ...}``; an end before it is raised."""
        while True:
            message = await self._socket.receive()
            if message.type == aiohttp.WSMsgType.TEXT:
                said = _json(message.data)
                if "attached" in said:
                    attached = said["attached"] or {}
                    self.name = attached.get("vm") or self.name
                    self.host = attached.get("host") or "?"
                    return
                self._said = said.get("ended") or self._said
            elif message.type != aiohttp.WSMsgType.BINARY:
                ended, error = self._why_closed(message, attached=False)
                if error is None:   # 1000 before attaching: nothing to attach to
                    error = Failed(self._said or "the console closed before it attached")
                raise error

    # -- the session -------------------------------------------------------------

    def run(self, stdin: int = 0, stdout: int = 1, tty: bool = True,
            timeout: float | None = None) -> Ended:
        """Pump until the session ends; raise as the module says if it ends
        by an error."""
        self.session = session = Session(stdin, stdout, tty, timeout)
        with session:
            try:
                asyncio.run_coroutine_threadsafe(self._from_guest(), self._loop)
                threading.Thread(target=self._from_stdin, args=(stdin,), name="console-stdin",
                                 daemon=True).start()
                return session.wait()
            finally:
                self.stop()

    async def _from_guest(self) -> None:
        while True:
            message = await self._socket.receive()
            if message.type == aiohttp.WSMsgType.BINARY:
                if not self.session.show(message.data):
                    return
            elif message.type == aiohttp.WSMsgType.TEXT:
                self._said = _json(message.data).get("ended") or self._said
            else:
                self.session.end(*self._why_closed(message, attached=True))
                return

    def _why_closed(self, message, attached: bool):
        """``(Ended, error)`` for the frame that ended the websocket."""
        if message.type == aiohttp.WSMsgType.CLOSE:
            code, reason = message.data, message.extra or ""
            line = self._said or reason or f"the console closed (code {code})"
            if code == 1000:
                return Ended("closed"), None
            kind = _CLOSED.get(code, Failed)
            if kind is Unavailable and attached:
                kind = Failed
            return None, kind(line)
        return None, Failed(self._said or f"lost the API at {self.url}")

    def _from_stdin(self, stdin: int) -> None:
        """What is typed, to the guest, until the session ends (a thread:
        a regular file or /dev/null is no pollable stdin)."""
        session = self.session
        while not session.done.is_set():
            try:
                data = os.read(stdin, _CHUNK)
            except OSError as exc:
                session.unreadable(exc)
                data = b""
            to_guest = session.typed(data)
            if to_guest and not self._send(to_guest):
                return
            if not data:
                return

    def _send(self, data: bytes) -> bool:
        """Send ``data`` (waiting while the socket is full); False once the
        session has ended."""
        try:
            sent = asyncio.run_coroutine_threadsafe(self._socket.send_bytes(data), self._loop)
        except RuntimeError:            # the loop is closed: the session ended
            return False
        while not self.session.done.is_set():
            try:
                sent.result(0.2)
                return True
            except TimeoutError:
                continue
            except Exception:           # the socket closed: its reader says why
                return False
        return False

    def stop(self) -> None:
        """Close the websocket (1000: the console is let go) and the loop."""
        if self._loop.is_closed():
            return

        async def close():
            if self._socket is not None and not self._socket.closed:
                await self._socket.close(code=1000, message=b"left the console")
            if self._http is not None:
                await self._http.close()
        try:
            self._call(close(), 5.0)
        except Exception:               # closing is best effort: the server notices anyway
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()


def _json(text: str) -> dict:
    try:
        said = json.loads(text)
    except ValueError:
        return {}
    return said if isinstance(said, dict) else {}


def _why(exc: BaseException) -> str:
    """What went wrong reaching an API, in a few words: the socket's own
    (``Connection refused``, a certificate that does not verify)."""
    cause = getattr(exc, "os_error", None) or exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"its certificate does not verify: {cause.verify_message}"
    errno = getattr(cause, "errno", None)
    text = os.strerror(errno) if isinstance(errno, int) and errno > 0 else str(cause)
    return (text.splitlines() or [""])[0] or "no answer"
