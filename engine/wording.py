"""How a message names what its caller gave: the command line's flags and
Python's quoting (``--on 'rack1*'``), or, for a request to the HTTP API, the
body's JSON fields and JSON values (``"on": "rack1*"``).

The operations layer serves both faces and writes each message once,
naming the parameter by its keyword: ``f"no host matches {given('on', on)}"``.
The command line is the default wording; the API runs each request inside
:func:`json_fields`.  Standard library only, cheap to import from any room.
"""
from __future__ import annotations

import contextlib
import contextvars
import json

__all__ = ["option", "value", "given", "json_fields", "speaks_json"]

_JSON = contextvars.ContextVar("peerctl_json_wording", default=False)


def speaks_json() -> bool:
    """Whether messages are being made for a request to the API."""
    return _JSON.get()


def option(name: str, flag: str | None = None) -> str:
    """The parameter ``name`` (an operation's keyword, the API's field):
    ``--name`` (or ``flag``) on the command line, ``"name"`` in the API."""
    if _JSON.get():
        return json.dumps(name)
    return flag or "--" + name.replace("_", "-")


def value(given_value) -> str:
    """A value the caller gave: Python's repr, or JSON in the API."""
    if _JSON.get():
        return json.dumps(given_value, default=str)
    return repr(given_value)


def given(name: str, given_value, flag: str | None = None) -> str:
    """``--on 'x'`` on the command line, ``"on": "x"`` in the API."""
    if _JSON.get():
        return f"{option(name)}: {value(given_value)}"
    return f"{option(name, flag)} {value(given_value)}"


@contextlib.contextmanager
def json_fields():
    """Messages made in this block name JSON fields and show JSON values."""
    token = _JSON.set(True)
    try:
        yield
    finally:
        _JSON.reset(token)
