"""How a command reaches the cluster, written once for both ways: straight
on etcd (the operations layer, in this process) or through a peer's API
(:mod:`engine.web.client`) when a remote is given (:mod:`.remote_config`).

A command names both: the operations call, and the route that makes the
same call on a peer.  The route answers what the command prints with
``--format json``, so the rendering that follows is the same either way.

- :func:`read` and :func:`write`: one call, its document;
- :func:`planned`: an automation's :class:`~engine.operations.plans.Plan`.
  Through the API it is a :class:`RemotePlan`: with ``--dry-run`` the
  route's dry run; else the route is asked to start it at once (with
  ``yes`` when ``--yes`` was given) and either does (``202``) or answers
  ``409`` with the targets to confirm, which :func:`start` then sends with
  ``"yes": true``;
- :func:`start` and :func:`follow`: an automation started, then each new
  view of it (through the API: ``/v1/events``, re-read on each change of
  it, resumed with ``Last-Event-ID`` on any peer when a stream ends).
"""
from __future__ import annotations

import dataclasses
import signal
import time

from engine.operations import tasks
from engine.operations.plans import Plan

__all__ = ["read", "write", "planned", "start", "follow", "RemotePlan", "segment"]


def segment(text: str) -> str:
    """``text`` as one segment of a route's path (``/`` quoted too)."""
    from urllib.parse import quote
    return quote(text, safe="")


def read(ctx, direct, path: str, **query):
    """``direct()``, or ``GET path?query`` through the API."""
    if ctx.api is None:
        return direct()
    return ctx.api.call("GET", path, query=query)


def write(ctx, direct, method: str, path: str, body: dict | None = None, **query):
    """``direct()``, or the write ``method path`` through the API."""
    if ctx.api is None:
        return direct()
    return _uninterrupted(lambda: ctx.api.call(method, path, body=body, query=query))


@dataclasses.dataclass
class RemotePlan(Plan):
    """A plan made by a peer: its targets come from the route's dry run or
    its 409; ``automation`` is set once the peer started it."""
    path: str = ""
    body: dict = dataclasses.field(default_factory=dict)
    method: str = "POST"
    automation: str | None = None
    answer: dict | None = None          # a 200 that started nothing (nothing to do)
    dry: dict | None = None             # the route's dry run, as it answered it

    def dry_run(self) -> dict:
        return self.dry if self.dry is not None else super().dry_run()


def planned(ctx, direct, path: str, body: dict, kind: str, what: str = "VMs",
            key: str = "vms", method: str = "POST") -> Plan:
    """``direct()`` (a Plan), or the same plan as a peer makes it."""
    if ctx.api is None:
        return direct()
    from engine.web.client import ApiError
    args = ctx.args
    plan = RemotePlan(kind, {}, [], what=what, key=key, path=path, body=dict(body),
                      method=method)
    if getattr(args, "dry_run", False):
        plan.dry = _send(ctx, plan, {"dry_run": True})
        plan.targets = list(plan.dry.get(key) or [])
        return plan
    extra = {"yes": True} if getattr(args, "yes", False) else {}
    try:
        doc = _uninterrupted(lambda: _send(ctx, plan, extra))
    except ApiError as exc:
        if exc.status != 409 or "targets" not in exc.more:
            raise
        plan.ask, plan.targets = True, list(exc.more["targets"])
        return plan
    if isinstance(doc, dict) and doc.get("automation"):
        plan.automation = doc["automation"]
    else:
        plan.answer = doc
    return plan


def _send(ctx, plan: RemotePlan, extra: dict):
    body = {**plan.body, **extra}
    if plan.method == "DELETE":
        return ctx.api.call("DELETE", plan.path, query=body)
    return ctx.api.call(plan.method, plan.path, body=body)


def start(ctx, plan: Plan) -> str:
    """Start ``plan``: its automation's id."""
    if not isinstance(plan, RemotePlan):
        return tasks.start(ctx, plan)
    if plan.automation is None:
        doc = _send(ctx, plan, {"yes": True})
        plan.automation = doc["automation"]
    return plan.automation


def _uninterrupted(call):
    """``call()`` with Ctrl-C held until it returns, so that what it
    started is always known (then the interrupt is raised)."""
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        return call()
    finally:
        signal.signal(signal.SIGINT, previous)
        if interrupted:
            raise KeyboardInterrupt


def follow(ctx, automation: str, timeout: float | None = None):
    """Each new view of ``automation`` until it ends (or ``timeout``)."""
    if ctx.api is None:
        yield from tasks.follow(ctx, automation, timeout=timeout)
        return
    yield from _followed(ctx.api, automation, timeout)


def _followed(api, automation: str, timeout: float | None):
    from engine.web.client import ApiError
    deadline = None if timeout is None else time.monotonic() + timeout
    path = f"/v1/automations/{automation}"
    mine = (f"tasks/{automation}", f"auto/{automation}/")
    last_id = seen = None
    while deadline is None or time.monotonic() < deadline:
        left = 60.0 if deadline is None else max(0.1, min(60.0, deadline - time.monotonic()))
        try:
            for ident, event, doc in api.events(last_id, read_timeout=left):
                last_id = ident if ident is not None else last_id
                if seen is not None and not any(change.get("key", "").startswith(mine)
                                                for change in doc.get("changes") or ()):
                    continue
                now = api.call("GET", path)
                if now != seen:
                    seen = now
                    yield now
                if now.get("state") in tasks.TERMINAL_STATES:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
        except ApiError as exc:
            if exc.status != 410:
                raise
            last_id = None          # compacted past it: read it again, follow from now
            seen = None
        # the stream ended (a peer stopping, a slow reader cut off, no event
        # within the read timeout): resume on any peer from the last revision
