"""What aiohttp answers before a request reaches the application (a request
line or header over its limit, a request that is not HTTP), in the API's
shape: ``{"error": ONE LINE}`` as JSON, never aiohttp's plain text.

aiohttp makes those answers in its connection handler's ``handle_error``;
:func:`answer_in_json` makes a server's connections use
:class:`JsonErrors`, whose ``handle_error`` keeps aiohttp's logging and
closing and changes only the body.
"""
from __future__ import annotations

from http import HTTPStatus

from aiohttp import http_exceptions, web, web_protocol

__all__ = ["JsonErrors", "answer_in_json", "why"]


def why(status: int, exc: BaseException | None) -> str:
    """The one line for a request aiohttp could not read."""
    if isinstance(exc, http_exceptions.LineTooLong):
        return f"request line or header over {exc.args[1]} bytes"
    if status >= 500:
        return "internal error (logged by the server)"
    if isinstance(exc, http_exceptions.HttpProcessingError) and exc.message:
        return f"bad HTTP request: {str(exc.message).splitlines()[0]}"
    try:
        return HTTPStatus(status).phrase.lower()
    except ValueError:
        return "bad HTTP request"


class JsonErrors(web_protocol.RequestHandler):
    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)     # logs it, or raises
        response = web.json_response({"error": why(status, exc)}, status=status)
        response.force_close()
        return response


class _JsonServer(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return JsonErrors(self, loop=self._loop, **self._kwargs)


def answer_in_json(server: web.Server) -> None:
    """Each new connection of ``server`` (an ``AppRunner``'s, once set up)
    answers unreadable requests in JSON.  The server's class is swapped for
    a subclass that only changes which handler a connection gets: aiohttp
    offers no option for it."""
    server.__class__ = _JsonServer
