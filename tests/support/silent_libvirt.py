"""A libvirt that is slow to attach: what keeps a console's websocket open
while a test revokes its token or kills its client."""
from __future__ import annotations

import contextlib
import socket
import threading
import uuid

from engine.core import keys

__all__ = ["SilentLibvirt", "silent_console_api"]


class SilentLibvirt:
    """A TCP listener that takes connections and never answers: a libvirt
    that is slow to attach, so that a console's websocket stays open."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.listener.accept()[0])
            except OSError:
                return

    def close(self):
        self.listener.close()
        for conn in self.held:
            conn.close()


@contextlib.contextmanager
def silent_console_api(store, etcd_url: str, cluster_name: str):
    """The API of a cluster whose host ``slow`` runs VM ``run1``, its
    libvirt a :class:`SilentLibvirt`: a console to it stays open, attaching."""
    from tests.support.api_server import served_api
    libvirt = SilentLibvirt()
    uid = str(uuid.uuid4())
    store.put(keys.host("slow"), {"host": "slow",
                                  "libvirt_uri": f"test+tcp://127.0.0.1:{libvirt.port}/default"},
              store.grant(600))
    store.put(keys.vm("slow", uid), {"host": "slow", "name": "run1", "uuid": uid,
                                     "state": "running"})
    try:
        with served_api(etcd_url, cluster_name) as server:
            yield server
    finally:
        libvirt.close()
