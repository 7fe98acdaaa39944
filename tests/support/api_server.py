"""The HTTP API served from the test's own process, and a browser to look at it.

- :func:`served_api` serves a cluster's API (``engine.web``) on a free
  loopback port for the length of a ``with`` block: the server a peer's
  ``--api`` runs, minus the metrics;
- :func:`token` makes a bearer token of a role, as ``token create`` does;
  :func:`session_cookie` a page session of one, as ``POST /v1/session`` does;
- :func:`in_own_loop` runs a coroutine (an aiohttp client) to its end on a
  thread of its own: Playwright's sync API keeps a loop running in the
  test's thread once a browser is up;
- :func:`browser_skip_reason` says why this machine cannot drive Debian's
  chromium with Playwright (None when it can); :func:`browser` launches it
  headless for a ``with`` block (browsers are never downloaded).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os

__all__ = ["served_api", "token", "session_cookie", "in_own_loop", "CHROMIUM",
           "browser_skip_reason", "browser"]

CHROMIUM = os.environ.get("PEERCTL_TEST_CHROMIUM", "/usr/bin/chromium")


@contextlib.contextmanager
def served_api(etcd_url: str, cluster_name: str, **options):
    """An :class:`~engine.web.server.ApiServer` on ``127.0.0.1:0`` for the
    cluster; its ``url`` says where.  Stopped when the block ends.
    ``options``: more of :class:`~engine.web.app.Api`'s (``session_idle``...)."""
    from engine.web.app import Api
    from engine.web.server import ApiServer
    server = ApiServer(Api(etcd_url, cluster_name, placement={"backend": "etcd"}, **options),
                       "127.0.0.1:0").start()
    try:
        yield server
    finally:
        server.stop()


def token(server, role: str) -> str:
    """The secret of a new token of ``role`` on the server's cluster."""
    from engine.core import tokens
    return tokens.create(server.api.context().store(), role, None)["secret"]


def session_cookie(server, role: str) -> str:
    """The secret of a new page session (``peerctl_session``) of a new
    token of ``role``, as ``POST /v1/session`` sets it."""
    from engine.core import sessions
    return sessions.create(server.api.context().store(), token(server, role))[0]


def in_own_loop(coroutine, timeout: float = 60.0):
    """What ``coroutine`` returns (or raises), run by ``asyncio.run`` on a
    thread of its own."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result(timeout)


def browser_skip_reason() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    return None


@contextlib.contextmanager
def browser():
    """A headless chromium, through Playwright."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox", "--headless=new"])
        try:
            yield launched
        finally:
            launched.close()
