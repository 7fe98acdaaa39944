"""A libvirt that is slow to attach: what keeps a console's websocket open
while a test revokes its token or kills its client."""
from __future__ import annotations

import socket
import threading

__all__ = ["SilentLibvirt"]


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
