"""libvirt's event loop, registered once per process, and which URIs
deliver events on a connection of their own.

Promises: :func:`ensure_event_loop` registers libvirt's default event loop
and runs it in one daemon thread (``libvirt-events``) the first time it is
called, and does nothing after; a connection that should deliver events is
opened after it (a remote connection opened before it never does).
"""
from __future__ import annotations

import threading

import libvirt

__all__ = ["ensure_event_loop", "own_state_per_open"]

_loop_guard = threading.Lock()
_loop_thread: threading.Thread | None = None


def ensure_event_loop() -> None:
    """Register libvirt's default event loop and run it in a daemon thread
    (once per process).  Call it before opening connections that should
    deliver events."""
    global _loop_thread
    with _loop_guard:
        if _loop_thread is not None:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run():
            while True:
                libvirt.virEventRunDefaultImpl()
        _loop_thread = threading.Thread(target=run, name="libvirt-events", daemon=True)
        _loop_thread.start()


def own_state_per_open(uri: str) -> bool:
    """A test driver file (``test:///path/host.xml``): each open is a fake
    host of its own."""
    return uri.startswith("test:///") and uri.rstrip("/") != "test:///default"
