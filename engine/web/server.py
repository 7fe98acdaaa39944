"""Serving the API on its own thread and event loop, apart from the peer's
engine: ``ApiServer(api, "127.0.0.1:8080").start()`` listens (the port
bound before ``start`` returns, so a bad or busy address fails at once),
``stop()`` closes every connection and the pools.

``address`` is ``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free
one, :attr:`url` says which).  Without TLS it listens only on loopback
unless ``insecure`` says otherwise: a token sent in the clear elsewhere is
a token given away.  With ``tls`` (``{cacert, cert, key}``: the cluster's
files) it is HTTPS, and a client certificate signed by the cluster's CA
identifies its holder.
"""
from __future__ import annotations

import asyncio
import ipaddress
import ssl
import threading

from engine.errors import UsageError

__all__ = ["ApiServer", "parse_address"]


def parse_address(text: str, what: str = "--api") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"bad {what} {text!r}: want ADDR:PORT (127.0.0.1:8080)")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiServer:
    def __init__(self, api, address: str, tls: dict | None = None, insecure: bool = False):
        self.api = api
        self.host, self.port = parse_address(address)
        if tls is None and not insecure and not _loopback(self.host):
            raise UsageError(f"--api {address}: without TLS the API listens only on loopback "
                             "(127.0.0.1, ::1); give the cluster's TLS files, or "
                             "--api-insecure to serve tokens in the clear anyway")
        self.tls = tls
        api.cacert = (tls or {}).get("cacert")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="api",
                                        daemon=True)
        self._runner = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def _ssl(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.tls["cert"], self.tls["key"])
            if self.tls.get("cacert"):
                context.load_verify_locations(self.tls["cacert"])
                context.verify_mode = ssl.CERT_OPTIONAL     # a token will do too
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--api TLS files: {exc}") from None
        return context

    async def _serve(self):
        from aiohttp import web
        from .app import make_app
        from .appkeys import CONNECTIONS
        app = make_app(self.api)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                               keepalive_timeout=30, shutdown_timeout=2)
        await runner.setup()
        from .protocol import answer_in_json
        answer_in_json(runner.server)
        app[CONNECTIONS].append(runner.server)
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self._ssl(), backlog=128)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        sockets = site._server.sockets if site._server else []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    def start(self) -> "ApiServer":
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        try:
            future.result(timeout=30)
        except OSError as exc:
            self._halt()
            raise UsageError(f"--api {self.host}:{self.port}: cannot listen: "
                             f"{exc.strerror or exc}") from None
        except BaseException:
            self._halt()
            raise
        return self

    def _halt(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def stop(self) -> None:
        if self._runner is not None:
            future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            try:
                future.result(timeout=10)
            except Exception:
                pass
        self._halt()
        if self.api.metrics is not None:
            self.api.metrics.stop()
        if self.api.graphs is not None:
            self.api.graphs.stop()
        self.api.close()


def role_credentials(directory: str | None, cacert: str | None) -> dict:
    """``{role: Credentials}`` for each of viewer and operator whose
    certificate (``ROLE.pem`` and ``ROLE-key.pem``, as ``tls certs`` names
    them) is in ``directory``: requests of that role reach etcd as it."""
    if not directory:
        return {}
    import os
    from engine.core.credentials import Credentials
    if not os.path.isdir(directory):
        raise UsageError(f"--api-roles {directory}: no such directory")
    found = {}
    for role in ("viewer", "operator"):
        cert, key = (os.path.join(directory, f"{role}{tail}.pem") for tail in ("", "-key"))
        if os.path.exists(cert) and os.path.exists(key):
            found[role] = Credentials(cacert, cert, key)
    if not found:
        raise UsageError(f"--api-roles {directory}: no viewer.pem/viewer-key.pem nor "
                         "operator.pem/operator-key.pem in it")
    return found


def serve_cluster(settings: dict, address: str, *, host: str | None = None,
                  libvirt_uri: str | None = None, roles_dir: str | None = None,
                  insecure: bool = False) -> ApiServer:
    """The API of the cluster ``settings`` name, listening on ``address``,
    with its metrics (this host's VMs too when ``libvirt_uri`` is given)
    and, on a peer (``host`` and ``libvirt_uri``), the graphs of its host."""
    from .app import Api
    from .metrics import ClusterMetrics
    credentials = settings.get("credentials")
    tls = None
    if settings.get("api_cert") or settings.get("api_key"):
        if not (settings.get("api_cert") and settings.get("api_key")):
            raise UsageError("api_cert and api_key go together (the API's HTTPS certificate)")
        tls = {"cert": settings["api_cert"], "key": settings["api_key"],
               "cacert": settings.get("cacert")}
    roles = role_credentials(roles_dir, settings.get("cacert"))
    from engine.core.validate import parse_duration
    graphs = None
    if host and libvirt_uri:        # a peer's API: the graphs of its own host
        from engine.hypervisor.host.graph_sampler import GraphSampler
        graphs = GraphSampler(host, libvirt_uri)
    api = Api(settings["etcd"], settings["cluster"], credentials,
              settings.get("placement_config"), roles, settings.get("network", "default"),
              tls=tls is not None,
              session_idle=parse_duration(settings.get("session_idle") or "12h", "session_idle"),
              session_lifetime=parse_duration(settings.get("session_max") or "7d",
                                              "session_max"), graphs=graphs)
    server = ApiServer(api, address, tls, insecure)
    api.metrics = ClusterMetrics(api.context().store(), host, libvirt_uri)
    api.metrics.start()
    try:
        server.start()
    except BaseException:
        api.metrics.stop()
        raise
    if graphs is not None:
        graphs.start()
    return server
