"""What a long request handler may ask about the step it is running.

The executor runs each handler inside :func:`running`, which names the step
(automation id, log index) for the handler's thread.  A handler that takes
long (a migration, a disk copy) may then:

- :func:`progress` ``({...})``: publish how far it got, for progress views.
  It lands in ``auto/<id>/progress/<index>`` (not fenced, not part of the
  replayed history: a view, overwritten, deleted with the automation);
- :func:`abort_requested`: whether ``abort ID`` was asked for its automation,
  so that it can stop its work cleanly and answer an error saying so.

Outside a step (tests calling a handler directly) both are harmless:
``progress`` does nothing and ``abort_requested`` is False.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

from . import keys
from .store import StoreUnavailable

__all__ = ["Step", "running", "current", "progress", "abort_requested"]

_local = threading.local()


@dataclass(frozen=True)
class Step:
    store: object
    automation: str
    index: int


@contextlib.contextmanager
def running(store, automation: str, index: int):
    """Name the step this thread runs until the block ends."""
    previous = getattr(_local, "step", None)
    _local.step = Step(store, automation, index)
    try:
        yield _local.step
    finally:
        _local.step = previous


def current() -> Step | None:
    return getattr(_local, "step", None)


def progress(value: dict) -> None:
    """Publish ``value`` as this step's progress (best effort: an etcd
    hiccup loses one update, never the step)."""
    step = current()
    if step is None or step.store is None:
        return
    try:
        step.store.put(keys.progress(step.automation, step.index),
                       {**value, "time": time.time()})
    except StoreUnavailable:
        pass


def abort_requested() -> bool:
    """Whether ``abort`` was asked for the automation of this step."""
    step = current()
    if step is None or step.store is None:
        return False
    try:
        return step.store.get(keys.abort(step.automation)) is not None
    except StoreUnavailable:
        return False
