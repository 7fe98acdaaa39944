"""What an operation needs: the cluster's store and its placement service,
opened on first use, each once."""
from __future__ import annotations

import contextlib

from engine.errors import Failed, PlacementError

__all__ = ["Context"]


class Context:
    """The cluster an operation acts on.

    ``etcd``/``cluster``/``credentials`` say how to reach its store;
    ``placement`` is the backend (``etcd`` or an OpenStack Placement URL,
    see :func:`engine.placement.open_placement`), ``None`` for the
    process's configured one."""

    def __init__(self, etcd: str, cluster: str, credentials=None, placement=None,
                 timeout: float = 5.0):
        self.etcd = etcd
        self.cluster = cluster
        self.credentials = credentials
        self.placement_config = placement
        self.timeout = timeout
        self._store = None

    def store(self):
        if self._store is None:
            from engine.core.store import Store
            self._store = Store(self.etcd, self.cluster, timeout=self.timeout,
                                credentials=self.credentials)
            self.opened()
        return self._store

    def opened(self) -> None:
        """Called once the store is open; a face may check more here."""

    @contextlib.contextmanager
    def placement(self):
        """The placement service, closed after use; a backend that cannot be
        opened is a ``Failed`` naming it."""
        from engine.placement import open_placement
        try:
            service = open_placement(self.placement_config, self.store())
        except PlacementError as exc:
            raise Failed(f"placement: {exc}") from None
        try:
            yield service
        finally:
            service.close()
