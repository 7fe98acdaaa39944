"""serve: the HTTP API, the page and /metrics on a machine that is not a
host (docs/api.md); every peer can serve the same with ``peer --api``."""
from __future__ import annotations

import signal
import threading

from .context import configure_logging, say


def cmd_serve(ctx) -> int:
    args, settings = ctx.args, ctx.settings
    configure_logging("DEBUG" if args.debug else "INFO", settings)
    address = args.api or settings["api"]
    if not address:
        from engine.errors import UsageError
        raise UsageError("serve needs --api ADDR:PORT (or the api setting)")
    from engine.web.server import serve_cluster
    server = serve_cluster(settings, address, roles_dir=args.api_roles or settings["api_roles"]
                           or None, insecure=args.api_insecure)
    plain = "" if server.tls else (
        ", plain HTTP: loopback only" if not args.api_insecure else
        ", plain HTTP: tokens travel in the clear")
    say(f"peerctl: serving the API of cluster {settings['cluster']!r} at {server.url}"
        f"{plain} (SIGTERM or Ctrl-C stops)")
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        while not stopping.wait(3600):
            pass
    finally:
        server.stop()
    return 0


def register(commands) -> None:
    sub = commands.add("serve", "serve the HTTP API, the web page and /metrics",
                       "python peerctl.py serve --api 127.0.0.1:8080", cmd_serve,
                       "Serve the cluster's HTTP API (/v1), its server-sent events, the web "
                       "page (/) and Prometheus metrics (/metrics) from this machine, in the "
                       "foreground, until SIGTERM or Ctrl-C. Every peer started with --api "
                       "serves the same. Without api_cert/api_key it listens only on "
                       "loopback unless --api-insecure.")
    sub.add_argument("--api", metavar="ADDR:PORT", help="where to listen (api setting)")
    sub.add_argument("--api-roles", metavar="DIR",
                     help="viewer.pem/operator.pem (with -key.pem) for etcd: requests reach "
                          "etcd as their role (api_roles setting)")
    sub.add_argument("--api-insecure", action="store_true",
                     help="listen beyond loopback without TLS (tokens in the clear)")
