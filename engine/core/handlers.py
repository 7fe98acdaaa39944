"""Request handlers: what a peer runs when a log entry names it as target.

Handlers are registered in the top-level ``requests/`` folder, as thin
wrappers over the rooms that do the work (``engine.hypervisor``,
``engine.placement``).  The folder has no ``__init__.py`` so that ``import
requests`` always finds the HTTP library; its files are loaded by path, as
modules of the alias package ``peerctl_requests``.  This module knows the
folder only by path: nothing here imports what it holds.

A handler is ``fn(host, args: dict) -> dict`` (``host``: what the peer gave
its executor, a :class:`~engine.hypervisor.host.hostctx.HostContext`) registered with
``@handler("name")``.  It must be idempotent: run twice with the same args it
finds the first run's result.  It reports failure by raising
:class:`engine.errors.RequestError` (its message becomes the response's error).
"""
from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Callable


__all__ = ["handler", "HANDLERS", "load_request_handlers", "REQUESTS_DIR"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUESTS_DIR = os.path.join(_ROOT, "requests")
HANDLERS: dict[str, Callable] = {}


def handler(name: str):
    def register(fn):
        HANDLERS[name] = fn
        return fn
    return register


def _alias_package() -> types.ModuleType:
    package = sys.modules.get("peerctl_requests")
    if package is None:
        package = types.ModuleType("peerctl_requests")
        package.__path__ = [REQUESTS_DIR]
        package.__package__ = "peerctl_requests"
        sys.modules["peerctl_requests"] = package
    return package


def load_request_handlers() -> dict[str, Callable]:
    """Import every module of ``requests/`` (once) and return the registry."""
    _alias_package()
    for filename in sorted(os.listdir(REQUESTS_DIR)):
        if filename.endswith(".py") and not filename.startswith("_"):
            importlib.import_module("peerctl_requests." + filename[:-3])
    return HANDLERS


_alias_package()
