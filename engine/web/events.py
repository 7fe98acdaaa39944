"""``/v1/events``: server-sent events of what changed in the cluster.

One SSE message per etcd revision that touched what a person watches: VMs
(``vms/``) and foreign domains (``foreign/``, kind ``foreign``), hosts (``hosts/``) and their drains (``drained/``), automations
(``tasks/``) and their steps (``auto/<id>/log|resp|progress/``), leases
(``leases/``) and backups (``backups/``)::

    id: 4711
    event: change
    data: {"revision": 4711, "changes": [{"type": "put", "kind": "vm",
           "key": "vms/host1/<uuid>", "value": {...}}]}

The id is the revision, so a client that reconnects, to this peer or any
other, with ``Last-Event-ID: R`` gets every change after R exactly once
(one etcd watch from R + 1: etcd keeps the order and the history).  A
revision that compaction has removed, or one this etcd never had, answers
``410``: the client lists again (``GET /v1/vms`` ...) and follows from the
``hello`` event's id, as Kubernetes watches do.  A new stream without
``Last-Event-ID`` starts with ``event: hello`` carrying the current
revision.  A comment line every :data:`HEARTBEAT` seconds finds dead
connections; a client too slow to keep up with :data:`BACKLOG` revisions is
cut off, and resumes where it was.  A stream ends when the token or page
session that opened it is deleted or expires (:mod:`.revocation`).

Two query parameters make a stream lighter for a client that draws what
changed rather than keeping every version (the page does):

- ``batch=MS`` (1 to 2000): the revisions that come within MS milliseconds
  of the first are sent as one message, its id the newest revision and
  each change carrying its own ``revision``; a client resuming from that id
  misses nothing, as with one message per revision;
- ``step_values=false``: step changes (``auto/<id>/...``) come without
  their value: that a step changed, not what it says.
"""
from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import web

__all__ = ["stream", "kind_of", "HEARTBEAT", "BACKLOG"]

HEARTBEAT = 15.0
BACKLOG = 10000
MAX_BATCH_MS = 2000
_PLAIN = (("vms/", "vm"), ("foreign/", "foreign"), ("hosts/", "host"), ("drained/", "drain"), ("tasks/", "automation"),
          ("leases/", "lease"), ("backups/", "backup"))
_STEPS = ("log", "resp", "progress")      # engine/core/keys.py: log_entry, response, progress


def kind_of(key: str) -> str | None:
    """What a key is to a watcher, or None for keys it does not show."""
    for prefix, kind in _PLAIN:
        if key.startswith(prefix):
            return kind
    if key.startswith("auto/"):
        parts = key.split("/")
        if len(parts) == 4 and parts[2] in _STEPS:
            return "step"
    return None


def _message(revision: int, changes: list[dict], event: str = "change") -> bytes:
    data = json.dumps({"revision": revision, "changes": changes}, default=str,
                      separators=(",", ":"))
    return f"id: {revision}\nevent: {event}\ndata: {data}\n\n".encode()


def _last_event_id(request) -> int | None:
    text = request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
    if text is None:
        return None
    if not text.isdigit():
        raise web.HTTPBadRequest(text=json.dumps({"error": f"bad Last-Event-ID {text!r}: "
                                                  "want an etcd revision"}),
                                 content_type="application/json")
    return int(text)


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")


def _batch_seconds(request) -> float:
    text = request.query.get("batch")
    if text is None:
        return 0.0
    if not text.isdigit() or not 1 <= int(text) <= MAX_BATCH_MS:
        raise _bad(f"bad batch {text!r}: want milliseconds, 1 to {MAX_BATCH_MS}")
    return int(text) / 1000


def _step_values(request) -> bool:
    text = request.query.get("step_values", "true")
    if text not in ("true", "false"):
        raise _bad(f"bad step_values {text!r}: want true or false")
    return text == "true"


def _gone(message: str) -> web.Response:
    return web.json_response({"error": message}, status=410)


_ENDED = object()            # in a stream's queue: its credential ended


async def stream(request, store, run_blocking, streams: set,
                 holding=lambda close: contextlib.nullcontext()) -> web.StreamResponse:
    """The SSE stream for one client; ``run_blocking(fn, *args)`` runs a
    blocking call on the server's pool; ``streams`` holds the tasks of the
    open streams, which a server stopping cancels; ``holding(close)`` is a
    context manager for the stream's life, that awaits ``close(why)`` to
    end it (its token revoked: :mod:`.revocation`)."""
    last = _last_event_id(request)
    batch, step_values = _batch_seconds(request), _step_values(request)
    if last is None:
        last = await run_blocking(store.revision)
        hello = True
    else:
        if not await run_blocking(store.has_history_from, last):
            return _gone(f"revision {last} is no longer (or never was) in etcd's history: "
                         "list again and follow from the new revision")
        hello = False
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def on_events(events, revision):      # on the etcd client's thread
        loop.call_soon_threadsafe(queue.put_nowait, events)

    async def end(_why):
        queue.put_nowait(_ENDED)

    cancel = await run_blocking(store.watch, "", last + 1, on_events)
    streams.add(asyncio.current_task())
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    held = contextlib.ExitStack()
    try:
        held.enter_context(holding(end))
        await response.prepare(request)
        if hello:
            await response.write(_message(last, [], "hello"))
        while True:
            if queue.qsize() > BACKLOG:
                break           # too slow: it reconnects with its Last-Event-ID
            try:
                events = await asyncio.wait_for(queue.get(), HEARTBEAT)
            except asyncio.TimeoutError:
                await response.write(b": heartbeat\n\n")
                continue
            if events is _ENDED or isinstance(events, Exception):
                break           # revoked; or compacted or broken: the client reconnects
            if not batch:
                for revision, changes in _by_revision(events, step_values):
                    await response.write(_message(revision, changes))
                continue
            events, ended = await _more_within(queue, list(events), batch)
            grouped = _by_revision(events, step_values)
            if grouped:
                await response.write(_message(grouped[-1][0], [
                    {**change, "revision": revision}
                    for revision, changes in grouped for change in changes]))
            if ended:
                break
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        held.close()
        streams.discard(asyncio.current_task())
        cancel()
    return response


async def _more_within(queue: asyncio.Queue, events: list, seconds: float) -> tuple[list, bool]:
    """``events`` and the watch responses that come within ``seconds``;
    whether the stream must end after them."""
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            more = await asyncio.wait_for(queue.get(), left)
        except asyncio.TimeoutError:
            break
        if more is _ENDED or isinstance(more, Exception):
            return events, True
        events.extend(more)
    return events, False


def _by_revision(events, step_values: bool = True) -> list[tuple[int, list[dict]]]:
    """The events of watch responses, grouped by revision, in order,
    keeping only the keys a watcher is shown."""
    grouped: dict[int, list[dict]] = {}
    for event in events:
        kind = kind_of(event.kv.key)
        if kind is None:
            continue
        shown = event.kind == "put" and (step_values or kind != "step")
        grouped.setdefault(event.kv.mod_revision, []).append(
            {"type": event.kind, "kind": kind, "key": event.kv.key,
             "value": event.kv.value if shown else None})
    return sorted(grouped.items())
