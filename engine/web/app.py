"""The aiohttp application: the route table's handlers wrapped in what every
request gets, written once.

For each request, in order: a JSON 404/405 for paths and methods that do
not exist; a 503 when the server is at its bound of connections; who asks
(401 without a known identity); for a write, the role (403 for a viewer,
before anything is read, unless the write acts on the viewer's own token:
``Route.own``) and, for ambient credentials, the CSRF token (403); the
query's names (400 for unknown ones) and the body (400 for malformed JSON,
unknown fields or wrong types; 413 past :data:`MAX_BODY` or the route's own
``max_body``, before more is read; a route taking bytes, ``Route.media``,
answers 415 to another Content-Type); then the
handler on the pool of threads, its messages naming the body's JSON fields
(:mod:`engine.wording`).  A path with a trailing or doubled slash is served
as the tidy path.  Any error is ``{"error": ONE LINE}`` (requests aiohttp
cannot read too: :mod:`.protocol`); an unexpected one is logged with its
traceback and answered 500 without it.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import os

import jsonschema
import structlog
from aiohttp import web

from engine import wording
from engine.core import sessions, tokens
from engine.errors import NoSuch, PeerctlError, PermissionDenied, Unavailable, UsageError

from . import events, identity
from .appkeys import API, CONNECTIONS, REVOCATIONS, STREAMS
from .revocation import Revocations
from .routes import ROUTES, Call, Refusal
from .schema_errors import schema_error

__all__ = ["Api", "make_app", "API", "CONNECTIONS", "MAX_BODY", "MAX_CONNECTIONS"]

log = structlog.get_logger("peerctl.api")

MAX_BODY = 1024 * 1024          # bytes of a request body
MAX_CONNECTIONS = 256           # open connections, event streams included
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_JSON = "application/json"


class Api:
    """What the application serves from: the cluster (one operations context
    per role, each opened once), the pools blocking calls run on, and the
    metrics.

    ``role_credentials``: ``{role: Credentials}`` for etcd, so that etcd
    itself enforces a request's role; a role without any uses the server's
    own ``credentials`` (the API's own role check still refuses a viewer's
    writes).  ``session_idle`` and ``session_lifetime``: seconds a login
    of the page lasts without a request, and at most (engine/core/sessions.py).
    ``graphs``: the sampler of this host's graphs, on a peer's API
    (engine/hypervisor/host/graph_sampler.py); its routes read it as
    ``ctx.graphs``."""

    def __init__(self, etcd: str, cluster: str, credentials=None, placement=None,
                 role_credentials: dict | None = None, default_network: str = "default",
                 metrics=None, tls: bool = False, pool_size: int = 16, waiters: int = 32,
                 session_idle: float | None = None, session_lifetime: float | None = None,
                 graphs=None):
        self.etcd, self.cluster = etcd, cluster
        self.credentials = credentials
        self.placement = placement
        self.role_credentials = dict(role_credentials or {})
        self.default_network = default_network
        self.metrics = metrics
        self.graphs = graphs    # this host's GraphSampler (a peer's API), or None
        self.tls = tls
        self.session_idle = session_idle or sessions.IDLE
        self.session_lifetime = session_lifetime or sessions.LIFETIME
        self.cacert = None      # the CA file of the HTTPS certificate (ApiServer sets it)
        self._contexts: dict = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(pool_size, "api")
        self.waits = concurrent.futures.ThreadPoolExecutor(waiters, "api-wait")

    def context(self, role: str | None = None):
        """The operations context requests of ``role`` run with (None: the
        server's own)."""
        credentials = self.role_credentials.get(role, self.credentials)
        key = role if role in self.role_credentials else None
        if key not in self._contexts:
            from engine.operations import Context
            ctx = Context(self.etcd, self.cluster, credentials, self.placement)
            ctx.default_network = self.default_network
            ctx.graphs = self.graphs.graphs if self.graphs is not None else None
            ctx.api_cacert = self.cacert     # to verify another peer's API
            self._contexts[key] = ctx
        return self._contexts[key]

    async def run(self, fn, *args, long: bool = False):
        pool = self.waits if long else self.pool
        return await asyncio.get_running_loop().run_in_executor(
            pool, functools.partial(fn, *args))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.waits.shutdown(wait=False, cancel_futures=True)
        for ctx in self._contexts.values():
            if ctx._store is not None:
                ctx._store.close()


def _error(status: int, message: str, headers=None, more: dict | None = None) -> web.Response:
    return web.json_response({"error": message.splitlines()[0] if message else "error",
                              **(more or {})}, status=status, headers=headers,
                             dumps=functools.partial(json.dumps, default=str))


def status_of(exc: BaseException) -> int:
    if isinstance(exc, Refusal):
        return exc.status
    if isinstance(exc, NoSuch):
        return 404
    if isinstance(exc, UsageError):
        return 400
    if isinstance(exc, PermissionDenied):
        return 403
    if isinstance(exc, Unavailable):
        return 503
    return 409          # Failed and the rest of the error root: it ran and could not


@web.middleware
async def answer_errors(request, handler):
    """Every failure as ``{"error": ONE LINE}``; the bound of connections."""
    servers = request.app[CONNECTIONS]
    if servers and len(servers[0].connections) > MAX_CONNECTIONS:
        return _error(503, f"busy: more than {MAX_CONNECTIONS} connections",
                      {"Connection": "close", "Retry-After": "1"})
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.content_type == _JSON:
            raise
        why = {404: f"no such path {request.path}",
               405: f"{request.method} is not allowed on {request.path}",
               413: f"request body over {MAX_BODY} bytes"}.get(exc.status, exc.reason)
        return _error(exc.status, why)
    except PeerctlError as exc:
        return _error(status_of(exc), str(exc), more=_beside(exc))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("api request failed", path=request.path, method=request.method)
        return _error(500, f"internal error: {type(exc).__name__} (logged by the server)")


def _beside(exc: PeerctlError) -> dict | None:
    """What goes beside an error's line: a refusal's own fields, the
    document the command prints with it (``result``, e.g. a failed dry
    run's plan) and what a listing's other patterns matched
    (``matched``), so that a remote command line prints what it prints."""
    more = dict(getattr(exc, "more", None) or {})
    if getattr(exc, "result", None) is not None:
        more.setdefault("result", exc.result)
    if isinstance(getattr(exc, "matched", None), list):
        more.setdefault("matched", exc.matched)
    return more or None


@web.middleware
async def one_slash(request, handler):
    """``//v1/vms`` and ``/v1/vms/`` reach ``/v1/vms``: a base URL written
    with its trailing slash (``${api}/v1/vms``) still finds its route.  The
    request is served as the tidy path, not redirected (curl does not
    follow a redirect unless told to)."""
    path = request.rel_url.path
    if request.match_info.http_exception is None or "//" not in path and not path.endswith("/"):
        return await handler(request)
    tidy = "/" + "/".join(part for part in path.split("/") if part)
    alternative = request.clone(rel_url=request.rel_url.with_path(tidy))
    match = await request.app.router.resolve(alternative)
    if match.http_exception is not None:
        return await handler(request)
    match.add_app(request.app)
    alternative._match_info = match     # as aiohttp's normalize_path_middleware does
    return await match.handler(alternative)


async def who_asks(request) -> identity.Who:
    """The identity of a request, or 401."""
    who = identity.certificate_identity(request)
    if who is not None:
        return who
    secret, ambient = identity.bearer_secret(request)
    if secret is None:
        raise Refusal(401, "authentication required: a bearer token (Authorization: Bearer "
                      "SECRET) or a client certificate")
    api: Api = request.app[API]
    if ambient:
        token = await api.run(sessions.verify, api.context().store(), secret)
        if token is None:
            raise Refusal(401, "unknown, ended or expired session: log in again")
    else:
        token = await _token(api, secret)
    return identity.Who(f"token:{token['id']}", token["role"], ambient,
                        "session" if ambient else "token", token["id"],
                        token.get("session"), token["expires"])


async def _token(api: Api, secret: str) -> dict:
    """The live token whose secret this is, or 401."""
    token = await api.run(tokens.verify, api.context().store(), secret) if secret else None
    if token is None:
        raise Refusal(401, "unknown, deleted or expired token")
    return token


def check_write(request, who: identity.Who, what: str, own: bool = False) -> None:
    """A write needs an operator, or (``own``) acts on the caller's own
    token, which any role may (log out); ambient credentials need the CSRF
    token either way."""
    if who.role != "operator" and not own:
        raise Refusal(403, f"permission denied for role {who.role}: a {who.role} may read, "
                      f"not {what}")
    if who.ambient and not identity.csrf_ok(request):
        raise Refusal(403, f"missing or wrong CSRF token (the {identity.CSRF_HEADER} header "
                      f"must match the {identity.CSRF_COOKIE} cookie)")


async def _bytes(request, limit: int = MAX_BODY) -> bytes:
    """The body, at most ``limit`` bytes: past it, 413 before more is read
    (a Content-Length over it, before any)."""
    if request.content_length is not None and request.content_length > limit:
        raise Refusal(413, f"request body over {limit} bytes")
    data = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        data += chunk
        if len(data) > limit:
            raise Refusal(413, f"request body over {limit} bytes")
    return bytes(data)


async def _media(request, route) -> bytes:
    """The bytes of a route that takes its body as sent (``route.media``)."""
    if request.content_type not in route.media:
        raise Refusal(415, f"{request.method} {request.path} takes its body as "
                      f"{' or '.join(route.media)}, not {request.content_type}")
    return await _bytes(request, route.max_body or MAX_BODY)


async def _body(request, schema: dict | None, limit: int = MAX_BODY) -> dict:
    raw = await _bytes(request, limit)
    if schema is None:
        if raw.strip():
            raise UsageError(f"{request.method} {request.path} takes no body")
        return {}
    if not raw.strip():
        body = {}
    else:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise UsageError(f"malformed JSON body: {exc}") from None
        except RecursionError:
            raise UsageError("malformed JSON body: nested too deeply") from None
    try:
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schema).iter_errors(body))
    except RecursionError:
        raise UsageError("bad body: nested too deeply") from None
    if error is not None:
        raise UsageError(schema_error(error))
    return body


def _query(request, route) -> dict:
    known = {name for name, _, _ in route.query}
    unknown = sorted(set(request.query) - known)
    if unknown:
        raise UsageError(f"unknown query parameter {unknown[0]!r}"
                         + (f" (known: {', '.join(sorted(known))})" if known else ""))
    return {name: request.query.getall(name) for name in known if name in request.query}


WORDING_HEADER = "Peerctl-Wording"     # "command-line": messages name flags, as a command's


def _in_json_terms(handler, ctx, call: Call, json_terms: bool = True):
    """The handler, its messages naming the body's fields, not the flags
    (unless a remote command line asks for its own words)."""
    if not json_terms:
        return handler(ctx, call)
    with wording.json_fields():
        return handler(ctx, call)


def _handler(route):
    async def handle(request):
        who = await who_asks(request)
        own = route.own is not None and who.token is not None \
            and request.match_info.get(route.own) == who.token
        if route.write:
            check_write(request, who, route.summary, own)
        query = _query(request, route)
        passed = identity.passed_on(request, who)
        relayed = identity.RELAYED_HEADER in request.headers
        if route.media:
            call = Call(dict(request.match_info), query, {}, who.role, who.user, passed,
                        relayed, token=who.token, data=await _media(request, route))
        else:
            call = Call(dict(request.match_info), query,
                        await _body(request, route.body, route.max_body or MAX_BODY),
                        who.role, who.user, passed, relayed, token=who.token)
        api: Api = request.app[API]
        # acting on its own token, a viewer writes with the server's credentials:
        # etcd would refuse its own role a write
        ctx = api.context(None if own else who.role)
        json_terms = request.headers.get(WORDING_HEADER) != "command-line"
        answer = await api.run(_in_json_terms, route.handler, ctx, call, json_terms,
                               long=route.waits)
        headers = {"Location": answer.location} if answer.location else None
        return web.json_response(answer.doc, status=answer.status, headers=headers,
                                 dumps=functools.partial(json.dumps, default=str))
    handle.__name__ = route.handler.__name__
    return handle


# -- what is not a command -----------------------------------------------------------

async def openapi(request):
    from .openapi import document
    return web.json_response(document())


async def event_stream(request):
    """The stream, ended when the token or session that opened it ends."""
    who = await who_asks(request)
    api: Api = request.app[API]
    return await events.stream(request, api.context().store(), api.run, request.app[STREAMS],
                               functools.partial(request.app[REVOCATIONS].holding, who))


async def end_streams(app) -> None:
    """A stopping server ends its event streams at once (their clients
    resume elsewhere with Last-Event-ID) instead of waiting them out."""
    for task in list(app[STREAMS]):
        task.cancel()


async def metrics(request):
    await who_asks(request)
    api: Api = request.app[API]
    if api.metrics is None:
        raise Refusal(404, "no metrics on this server")
    body = await api.run(api.metrics.render)
    return web.Response(body=body, headers={"Content-Type": api.metrics.CONTENT_TYPE})


async def session(request):
    """``GET``: who the session is; ``POST {token}``: log in (a session of
    its own, whose secret the cookie holds); ``DELETE``: log out (the
    session deleted, so its cookie is refused by every server and its
    streams end)."""
    api: Api = request.app[API]
    if request.method == "DELETE":
        cookie = request.cookies.get(identity.SESSION_COOKIE)
        if cookie:
            await api.run(sessions.delete, api.context().store(), cookie)
        response = web.json_response({"session": None})
        response.del_cookie(identity.SESSION_COOKIE, path="/")
        return response
    if request.method == "GET":
        who = await who_asks(request)
        return web.json_response({"user": who.user, "role": who.role, "how": who.how})
    body = await _body(request, {"type": "object", "properties": {"token": {"type": "string"}},
                                 "required": ["token"], "additionalProperties": False})
    if not identity.csrf_ok(request):
        raise Refusal(403, "missing or wrong CSRF token")
    made = await api.run(sessions.create, api.context().store(), body["token"],
                         api.session_idle, api.session_lifetime)
    if made is None:
        raise Refusal(401, "unknown, deleted or expired token")
    secret, token = made
    response = web.json_response({"user": f"token:{token['id']}", "role": token["role"],
                                  "how": "session"})
    response.set_cookie(identity.SESSION_COOKIE, secret, httponly=True,
                        samesite="Strict", secure=api.tls, path="/")
    return response


async def join(request):
    """``GET``: the CA the server's HTTPS certificate chains to (a joining
    machine checks it against its token's fingerprint before it sends
    anything); ``POST {id, proof}``: redeem a join token, once
    (:func:`engine.operations.admit.redeem`).  Neither needs an identity:
    the token is the new machine's only credential."""
    api: Api = request.app[API]
    if not api.tls or not api.cacert:
        raise Refusal(404, "this server takes no joins: it serves no HTTPS with the "
                           "cluster's CA (api_cert, api_key and cacert)")
    if request.method == "GET":
        with open(api.cacert) as f:
            return web.json_response({"ca": f.read()})
    body = await _body(request, {"type": "object", "properties": {
        "id": {"type": "string", "maxLength": 64}, "proof": {"type": "string", "maxLength": 128}},
        "required": ["id", "proof"], "additionalProperties": False})
    from engine.operations.admit import redeem
    return web.json_response(await api.run(redeem, api.context().store(), body["id"],
                                           body["proof"]))


async def page(request):
    response = web.FileResponse(os.path.join(STATIC, "index.html"))
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
        # xterm.js (the console) injects <style> elements: styles only, never scripts
        "style-src 'self' 'unsafe-inline'; script-src 'self'; frame-ancestors 'none'")
    if not request.cookies.get(identity.CSRF_COOKIE):
        response.set_cookie(identity.CSRF_COOKIE, identity.new_csrf(), samesite="Strict",
                            secure=request.app[API].tls, path="/")
    return response


def make_app(api: Api) -> web.Application:
    app = web.Application(middlewares=[answer_errors, one_slash],
                          client_max_size=MAX_BODY)
    app[API] = api
    app[CONNECTIONS] = []
    app[STREAMS] = set()
    app[REVOCATIONS] = Revocations(api.context().store(), api.run)
    app.on_startup.append(lambda app: app[REVOCATIONS].start())
    app.on_shutdown.append(end_streams)
    app.on_cleanup.append(lambda app: app[REVOCATIONS].stop())
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _handler(route))
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_get("/v1/events", event_stream)
    for method in ("GET", "POST", "DELETE"):
        app.router.add_route(method, "/v1/session", session)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/v1/join", join)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", page)
    if os.path.isdir(STATIC):
        app.router.add_static("/static/", STATIC, show_index=False)
    from . import console
    console.add_routes(app, who_asks, check_write)
    return app
