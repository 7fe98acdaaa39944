"""Ending what a revoked credential opened: every event stream and console
websocket an API server holds is registered under the token (and the
page's session) it was authenticated with, and ended when that token or
session ends, on every API server, within a second.

- One etcd watch per API server on ``tokens/`` and one on ``sessions/``.
  A deleted ``tokens/<id>`` ends that token's streams, its sessions'
  included, and deletes its sessions (every server may: the delete is
  idempotent); a deleted ``sessions/<id>/<sha>`` (a logout, or etcd's
  lease at its absolute expiry) ends that session's.
- An expiry is a timer on the server's loop at the moment the credential
  ends unless used again: when it fires, the credential is read again (a
  request may have refreshed a session's idle time meanwhile) and the
  stream ended, or the timer set for the new moment.
- A watch that breaks (etcd lost, history compacted) is made again from
  the current revision, and every held stream's credential read again:
  a delete the watch missed still ends its streams.

A client certificate is not revocable here: its streams are not held.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Awaitable, Callable

import structlog

from engine.core import keys, sessions, tokens
from engine.errors import PeerctlError

__all__ = ["Revocations", "DELETED", "ENDED", "EXPIRED"]

log = structlog.get_logger("peerctl.api")

DELETED = "the token was deleted"
ENDED = "the session ended (logged out, or its token deleted)"
EXPIRED = "the token or session expired"
_RETRY = 1.0


@dataclasses.dataclass(eq=False)
class _Held:
    token: str
    session: str | None
    close: Callable[[str], Awaitable[None]]
    timer: asyncio.TimerHandle | None = None


class Revocations:
    """The streams an API server holds, by credential.  ``run(fn, *args)``
    runs a blocking call on the server's pool; every other method runs on
    the server's loop."""

    def __init__(self, store, run):
        self._store, self._run = store, run
        self._held: set[_Held] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancels: list[Callable[[], None]] = []
        self._task: asyncio.Task | None = None
        self._broken: asyncio.Event | None = None

    # -- the server's life ---------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._broken = asyncio.Event()
        self._task = asyncio.ensure_future(self._keep_watching())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._unwatch()
        for held in list(self._held):
            self._release(held)

    # -- holding a stream --------------------------------------------------------------------

    @contextlib.contextmanager
    def holding(self, who, close: Callable[[str], Awaitable[None]]):
        """For a ``with`` block serving a stream for ``who``: ``close(why)``
        is awaited once when its token or session ends."""
        if who.token is None:
            yield
            return
        held = _Held(who.token, who.session, close)
        self._held.add(held)
        self._arm(held, who.expires)
        try:
            yield
        finally:
            self._release(held)

    def _arm(self, held: _Held, expires: float | None) -> None:
        if held.timer is not None:
            held.timer.cancel()
            held.timer = None
        if expires is None or expires == float("inf") or held not in self._held:
            return
        held.timer = self._loop.call_later(max(0.0, expires - time.time()),
                                           lambda: asyncio.ensure_future(self._expired(held)))

    async def _expired(self, held: _Held) -> None:
        try:
            expires = await self._run(_still_valid, self._store, held.token, held.session)
        except PeerctlError:
            expires = time.time() + _RETRY        # etcd unreachable: ask again soon
        if expires is None:
            self._end(held, EXPIRED)
        else:
            self._arm(held, expires)

    def _release(self, held: _Held) -> None:
        self._held.discard(held)
        if held.timer is not None:
            held.timer.cancel()

    def _end(self, held: _Held, why: str) -> None:
        if held not in self._held:
            return
        self._release(held)
        log.info("api_stream_revoked", token=held.token, why=why)
        asyncio.ensure_future(held.close(why))

    # -- the watches -----------------------------------------------------------------------

    async def _keep_watching(self) -> None:
        first = True
        while True:
            try:
                revision = await self._run(self._store.revision)
                self._broken.clear()
                for prefix in (keys.token(), keys.session()):
                    self._cancels.append(await self._run(
                        self._store.watch, prefix, revision + 1, self._on_watch))
            except PeerctlError as exc:
                self._unwatch()
                log.warning("api_revocation_watch_failed", error=str(exc))
                await asyncio.sleep(_RETRY)
                continue
            if not first:           # deletes may have passed unseen
                for held in list(self._held):
                    asyncio.ensure_future(self._expired(held))
            first = False
            await self._broken.wait()
            self._unwatch()

    def _unwatch(self) -> None:
        for cancel in self._cancels:
            cancel()
        self._cancels = []

    def _on_watch(self, events, _revision) -> None:       # on the etcd client's thread
        try:
            self._loop.call_soon_threadsafe(self._seen, events)
        except RuntimeError:        # the loop is closed: the server stopped
            pass

    def _seen(self, events) -> None:
        if isinstance(events, Exception):
            self._broken.set()
            return
        for event in events:
            if event.kind != "delete":
                continue
            key = event.kv.key
            if key.startswith(keys.token()):
                token = key[len(keys.token()):]
                for held in [h for h in self._held if h.token == token]:
                    self._end(held, ENDED if held.session else DELETED)
                asyncio.ensure_future(self._forget_sessions(token))
            elif key.startswith(keys.session()):
                for held in [h for h in self._held if h.session == key]:
                    self._end(held, ENDED)

    async def _forget_sessions(self, token: str) -> None:
        try:
            await self._run(sessions.delete_of_token, self._store, token)
        except PeerctlError as exc:     # refused or unreachable: they are refused anyway
            log.warning("api_sessions_not_deleted", token=token, error=str(exc))


def _still_valid(store, token: str, session: str | None) -> float | None:
    """When the credential ends unless used again (``inf``: never), or None
    once it has ended (blocking: reads etcd)."""
    if session is not None:
        alive = sessions.state(store, session)
        return None if alive is None else alive["expires"]
    record = tokens.live(store.get(keys.token(token)), token)
    if record is None:
        return None
    return float("inf") if record["expires"] is None else record["expires"]
