"""What a request handler gets to work with on its host."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["HostContext"]


@dataclass
class HostContext:
    host: str
    libvirt_uri: str
    store: "object"                 # engine.store.Store of the cluster
    state_dir: str = "/tmp/peerctl"
    _conn: object = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def conn(self):
        """The host's libvirt connection, opened on first use (thread-safe)."""
        with self._lock:
            if self._conn is None or not self._conn.isAlive():
                import libvirt
                self._conn = libvirt.open(self.libvirt_uri)
            return self._conn
