"""A prefix watch that survives etcd restarts and compaction.

Consumers read batches of events from a queue.  When the stream breaks the
watch is re-created from the last revision seen plus one, so nothing is lost
or doubled; when that revision was compacted the prefix is read again and a
:class:`Reset` carrying the fresh contents is queued instead.
The watch's own thread reads the stream (``Store.watch_stream``) and queues
what it reads: one hand-off between etcd's answer and the consumer.

A consumer may name events it can hear of late (``quiet``): a batch of only
those is held, not queued, so it wakes nobody; it comes first in the next
batch queued, or alone from a read that would otherwise time out.  Order is
kept either way; a Reset drops what is held (it replaces it).
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable

import structlog

from .store import KV, Compacted, Event, Store, StoreUnavailable, WatchBroken

__all__ = ["PrefixWatch", "Reset"]

log = structlog.get_logger("peerctl.watch")


@dataclass(frozen=True)
class Reset:
    """The whole prefix as read at ``revision``, replacing all earlier state."""
    kvs: list[KV]
    revision: int


class PrefixWatch:
    def __init__(self, store: Store, prefix: str, after_revision: int,
                 retry_interval: float = 0.2, exact: bool = False, puts_only: bool = False,
                 quiet: Callable[[Event], bool] | None = None):
        self.exact = exact
        self.puts_only = puts_only      # no delete events (fewer to send and decode)
        self.quiet = quiet              # events that may wait for the next wake-up
        self._held: list[Event] = []
        self._held_lock = threading.Lock()
        self.store = store
        self.prefix = prefix
        self.last_revision = after_revision
        self.events: "queue.Queue[list[Event] | Reset]" = queue.Queue()
        self._retry_interval = retry_interval
        self._stopped = threading.Event()
        self._cancel = None
        self._thread = threading.Thread(target=self._run, name=f"watch:{prefix}",
                                        daemon=True)

    def start(self) -> "PrefixWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        cancel = self._cancel
        if cancel:
            cancel()

    def get(self, timeout: float | None = None):
        """Next batch of events (or a Reset); None on timeout.  Quiet
        events held meanwhile are returned rather than timing out."""
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            with self._held_lock:
                held, self._held = self._held, []
            return held or None

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

    def _queue(self, events) -> None:
        self.last_revision = max(self.last_revision, events[-1].kv.mod_revision)
        with self._held_lock:
            if self.quiet is not None and all(self.quiet(event) for event in events):
                self._held += events
                return
            held, self._held = self._held, []
            self.events.put(held + events if held else events)

    def _run(self):
        """Read the stream on this thread (no other hand-off before the
        queue); when it ends, watch again from the last revision seen."""
        compacted = False
        while not self._stopped.is_set():
            try:
                if compacted:
                    if self.exact:
                        kv, revision = self.store.get(self.prefix), self.store.revision()
                        kvs = [kv] if kv else []
                    else:
                        kvs, revision = self.store.range(self.prefix)
                    self.last_revision = revision
                    compacted = False
                    with self._held_lock:
                        self._held = []
                        self.events.put(Reset(kvs, revision))
                stream = self.store.watch_stream(self.prefix, self.last_revision + 1,
                                                 exact=self.exact, puts_only=self.puts_only)
                self._cancel = stream.cancel
                if self._stopped.is_set():
                    stream.cancel()
                for events in stream:
                    self._queue(events)
            except Compacted:
                compacted = True
                continue
            except (WatchBroken, StoreUnavailable):
                pass
            finally:
                self._cancel = None
            if not self._stopped.is_set():
                log.debug("watch_resume", prefix=self.prefix, after=self.last_revision)
                self._stopped.wait(self._retry_interval)
