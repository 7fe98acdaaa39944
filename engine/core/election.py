"""Leader election with fencing, after etcd's concurrency package.

Each candidate puts ``<prefix><lease-hex>`` bound to its session lease; the
leader is the candidate whose key has the lowest create revision.  A
candidate waits only on its predecessor's key (no thundering herd).  Once
leading, every write goes through a transaction that includes
:meth:`Candidacy.fence`: a compare on the leader key's create revision, so a
deposed leader (paused, partitioned, lease expired) can never write.
"""
from __future__ import annotations

import threading

from engine.errors import Deposed

from .session import Session
from .store import Compare, Delete, Put, Store, absent, created_at
from .watch import PrefixWatch

__all__ = ["Candidacy"]


class Candidacy:
    def __init__(self, store: Store, session: Session, prefix: str, value):
        self.store = store
        self.session = session
        self.prefix = prefix
        self.key = f"{prefix}{session.lease:x}"
        result = store.txn([absent(self.key)], [Put(self.key, value, session.lease)])
        if result.succeeded:
            self.revision = result.revision
        else:   # already a candidate under this lease (a retried call)
            self.revision = store.get(self.key).create_revision

    def fence(self) -> Compare:
        """The compare every write of a leader carries."""
        return created_at(self.key, self.revision)

    def txn(self, compares, success=(), failure=()):
        """A leader's transaction: ``compares`` plus the fence.  Refused while
        this candidacy no longer holds its key, it raises :class:`Deposed`;
        refused by ``compares`` alone, it returns the unsucceeded result."""
        result = self.store.txn([self.fence(), *compares], success, failure)
        if not result.succeeded and not self.holds():
            raise Deposed(f"election key {self.key} is gone: no longer the leader")
        return result

    def holds(self) -> bool:
        """Whether this candidacy's key still exists (leading or waiting)."""
        kv = self.store.get(self.key)
        return kv is not None and kv.create_revision == self.revision

    def _candidates(self):
        kvs, revision = self.store.range(self.prefix)
        return sorted(kvs, key=lambda kv: kv.create_revision), revision

    def wait_until_leader(self, stop: threading.Event) -> bool:
        """Block until this candidate leads; False if ``stop`` or the lease ends first."""
        while not stop.is_set() and self.session.alive:
            candidates, revision = self._candidates()
            mine = [kv for kv in candidates if kv.key == self.key]
            if not mine or mine[0].create_revision != self.revision:
                return False            # our key vanished: the lease expired
            ahead = [kv for kv in candidates if kv.create_revision < self.revision]
            if not ahead:
                return True
            self._wait_for_delete(ahead[-1].key, revision, stop)
        return False

    def _wait_for_delete(self, key: str, after_revision: int, stop: threading.Event):
        watch = PrefixWatch(self.store, key, after_revision, exact=True).start()
        try:
            while not stop.is_set() and self.session.alive:
                batch = watch.get(timeout=0.25)
                if batch is None:
                    continue
                events = getattr(batch, "kvs", None)
                if events is not None or any(e.kind == "delete" for e in batch):
                    return
        finally:
            watch.stop()

    def is_leader(self) -> bool:
        candidates, _ = self._candidates()
        return bool(candidates) and candidates[0].key == self.key \
            and candidates[0].create_revision == self.revision

    def resign(self) -> None:
        self.store.txn([self.fence()], [Delete(self.key)])
