"""A prefix watch that survives etcd restarts and compaction.

Consumers read batches of events from a queue.  When the stream breaks the
watch is re-created from the last revision seen plus one, so nothing is lost
or doubled; when that revision was compacted the prefix is read again and a
:class:`Reset` carrying the fresh contents is queued instead.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import structlog

from .store import KV, Compacted, Event, Store, StoreUnavailable

__all__ = ["PrefixWatch", "Reset"]

log = structlog.get_logger("peerctl.watch")


@dataclass(frozen=True)
class Reset:
    """The whole prefix as read at ``revision``, replacing all earlier state."""
    kvs: list[KV]
    revision: int


class PrefixWatch:
    def __init__(self, store: Store, prefix: str, after_revision: int,
                 retry_interval: float = 0.2, exact: bool = False, puts_only: bool = False):
        self.exact = exact
        self.puts_only = puts_only      # no delete events (fewer to send and decode)
        self.store = store
        self.prefix = prefix
        self.last_revision = after_revision
        self.events: "queue.Queue[list[Event] | Reset]" = queue.Queue()
        self._retry_interval = retry_interval
        self._stopped = threading.Event()
        self._broken = threading.Event()
        self._cancel = None
        self._thread = threading.Thread(target=self._run, name=f"watch:{prefix}",
                                        daemon=True)

    def start(self) -> "PrefixWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._broken.set()
        if self._cancel:
            self._cancel()

    def get(self, timeout: float | None = None):
        """Next batch of events (or a Reset); None on timeout."""
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self, timeout: float | None = None) -> list:
        """Every batch queued now, in order, waiting up to ``timeout`` for the
        first; [] on timeout.  A consumer that takes them together acts once
        on what arrived while it was busy (one transaction, not one per
        batch)."""
        first = self.get(timeout)
        if first is None:
            return []
        batches = [first]
        while True:
            try:
                batches.append(self.events.get_nowait())
            except queue.Empty:
                return batches

    def _on_response(self, events, header_revision):
        if isinstance(events, Exception):
            if isinstance(events, Compacted):
                self._compacted = True
            self._broken.set()
            return
        if events:
            self.last_revision = max(self.last_revision, events[-1].kv.mod_revision)
            self.events.put(events)

    def _run(self):
        self._compacted = False
        while not self._stopped.is_set():
            self._broken.clear()
            try:
                if self._compacted:
                    if self.exact:
                        kv, revision = self.store.get(self.prefix), self.store.revision()
                        kvs = [kv] if kv else []
                    else:
                        kvs, revision = self.store.range(self.prefix)
                    self.last_revision = revision
                    self._compacted = False
                    self.events.put(Reset(kvs, revision))
                self._cancel = self.store.watch(self.prefix, self.last_revision + 1,
                                                self._on_response, exact=self.exact,
                                                puts_only=self.puts_only)
            except Compacted:
                self._compacted = True
                continue
            except StoreUnavailable:
                self._stopped.wait(self._retry_interval)
                continue
            self._broken.wait()
            if self._cancel:
                self._cancel()
                self._cancel = None
            if not self._stopped.is_set():
                log.debug("watch_resume", prefix=self.prefix, after=self.last_revision)
                self._stopped.wait(self._retry_interval)
