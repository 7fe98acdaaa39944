"""The keys under which the API's aiohttp application keeps what its
handlers share: the :class:`~engine.web.app.Api` it serves from, its open
connections and event streams, and the streams held per token and session
(:mod:`engine.web.revocation`).  Below both the application and the routes
it adds (the console's), so that neither imports the other for them."""
from __future__ import annotations

from aiohttp import web

from .revocation import Revocations

__all__ = ["API", "CONNECTIONS", "STREAMS", "REVOCATIONS"]

API = web.AppKey("api", object)
CONNECTIONS = web.AppKey("connections", list)   # the server, once it runs
STREAMS = web.AppKey("streams", set)            # the open event streams' tasks
REVOCATIONS = web.AppKey("revocations", Revocations)    # streams by token and session
