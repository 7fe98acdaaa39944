"""Automation kinds and their versions.

``@automation("boot", version=2)`` registers a worker.  A new automation is
started with the newest version of its kind and records that version in its
spec; replay always uses the recorded version.  To change a worker in a way
that changes the requests it yields, register the new code under a new
version and keep the old one until no running automation uses it: old logs
keep replaying under old code.  (Inside one version, ``ctx.version`` lets a
worker branch on small changes.)

A version whose log other peers' code may not know yet is registered with
``feature_level=N`` (``engine/core/features.py``): new automations use it
only once the cluster's feature level is N or more, so that a cluster of
mixed releases keeps starting what every member can run.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from typing import Callable

from engine.errors import UnknownAutomation

__all__ = ["automation", "latest", "lookup", "load_automations", "AUTOMATIONS_DIR"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AUTOMATIONS_DIR = os.path.join(_ROOT, "automations")
_WORKERS: dict[tuple[str, int], Callable] = {}
_loaded: set[str] = set()
_loading = threading.RLock()


def automation(kind: str, version: int = 1, cleans_up: bool = False, feature_level: int = 1):
    """Register ``fn`` as ``kind`` at ``version``.

    ``abort ID`` ends an automation at once, its workers stopped where they
    are.  With ``cleans_up`` it is handed to the workers instead:
    ``ctx.aborted`` turns true at a point logged in etcd (the same on every
    replay), running steps see it (``engine.core.steps.abort_requested``),
    and the automation ends ``aborted`` once its workers have undone what
    they must (a migration reverting its allocations, say)."""
    def register(fn):
        fn.cleans_up = cleans_up
        fn.feature_level = feature_level
        _WORKERS[(kind, version)] = fn
        return fn
    return register


def latest(kind: str, level: int | None = None) -> tuple[int, Callable]:
    """The newest version of ``kind`` (that the cluster's feature ``level``
    allows, when given)."""
    load_automations()
    versions = [v for (k, v), fn in _WORKERS.items() if k == kind
                and (level is None or getattr(fn, "feature_level", 1) <= level)]
    if not versions:
        raise UnknownAutomation(f"unknown automation kind {kind!r}")
    return max(versions), _WORKERS[(kind, max(versions))]


def lookup(kind: str, version: int) -> Callable:
    load_automations()
    try:
        return _WORKERS[(kind, version)]
    except KeyError:
        raise UnknownAutomation(f"automation {kind!r} version {version} is not "
                                "registered on this peer") from None


def load_automations() -> None:
    """Import ``automations/`` and every file of the directories named in
    ``PEERCTL_AUTOMATIONS_PATH`` (colon-separated; used by tests).  Threads
    that ask at once wait for the first one's imports to finish."""
    directories = [AUTOMATIONS_DIR, *filter(
        None, os.environ.get("PEERCTL_AUTOMATIONS_PATH", "").split(":"))]
    if _loaded.issuperset(directories):
        return
    with _loading:
        for directory in directories:
            if directory not in _loaded:
                _load(directory)
                _loaded.add(directory)


def _load(directory: str) -> None:
    if directory == AUTOMATIONS_DIR:
        root = os.path.dirname(AUTOMATIONS_DIR)
        if root not in sys.path:
            sys.path.insert(0, root)
        for filename in sorted(os.listdir(AUTOMATIONS_DIR)):
            if filename.endswith(".py") and not filename.startswith("_"):
                importlib.import_module("automations." + filename[:-3])
        return
    for filename in sorted(os.listdir(directory)):
        if filename.endswith(".py"):
            path = os.path.join(directory, filename)
            spec = importlib.util.spec_from_file_location("peerctl_extra_" + filename[:-3], path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
