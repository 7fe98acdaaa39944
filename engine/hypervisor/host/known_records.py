"""The last record of each ``vms/`` key this process wrote or read, per
store, so that the VM publisher's events need not read etcd again to learn
that nothing changed (``engine/hypervisor/host/vmpublish.py``).

Promises: :func:`remember` keeps ``(mod revision, record, monotonic time of
the libvirt look it came from)`` per key, never one older (by revision)
than what it holds, and forgets a key given None; :func:`known_of` is the
store's mapping (shared: read it, change it through :func:`remember`).
Nothing outlives its store (a weak mapping).
"""
from __future__ import annotations

import threading
import weakref

__all__ = ["known_of", "remember"]

_known: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_known_guard = threading.Lock()


def known_of(store) -> dict:
    with _known_guard:
        return _known.setdefault(store, {})


def remember(store, key: str, revision: int, record: dict | None,
             seen_at: float = 0.0) -> None:
    """``key`` held ``record`` at ``revision``, made from a look at libvirt
    at ``seen_at`` (None: forget it); a revision older than the one
    remembered is not kept."""
    known = known_of(store)
    with _known_guard:
        if record is None:
            known.pop(key, None)
        elif revision >= known.get(key, (0,))[0]:
            known[key] = (revision, record, seen_at)
