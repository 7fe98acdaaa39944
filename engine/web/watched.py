"""Keys of etcd held in memory and kept current by watches: read once at
one revision, then one :class:`~engine.core.watch.PrefixWatch` per prefix
(a compaction is a Reset: the prefix read again and the difference applied
as changes).  It answers ``txn`` with Get operations only, as a Store
would, so that the listings' readers (:mod:`engine.cluster`) run over it
unchanged; ``changes`` counts what the watches brought, for whoever counts
only when something changed."""
from __future__ import annotations

import threading

import structlog

from engine.core.store import Get, KV, TxnResult
from engine.core.watch import PrefixWatch, Reset
from engine.errors import PeerctlError

__all__ = ["WatchedKeys"]

log = structlog.get_logger("peerctl.metrics")


class WatchedKeys:
    """The keys under ``prefixes`` as etcd holds them, one watch each; it
    answers ``txn`` with Get operations only, as a Store would, so that
    the listings' readers run over it unchanged."""

    def __init__(self, store, prefixes, on_change):
        self._store = store
        self._kvs: dict[str, dict[str, KV]] = {prefix: {} for prefix in prefixes}
        self._on_change = on_change
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watches: list[PrefixWatch] = []
        self._threads: list[threading.Thread] = []
        self.loaded = threading.Event()
        self.revision = 0
        self.changes = 0        # bumped whenever what is held changes

    def start(self) -> None:
        self._spawn(self._load, "metrics:load")

    def stop(self) -> None:
        self._stopped.set()
        for watch in self._watches:
            watch.stop()
        for thread in self._threads:
            thread.join(5)

    def held(self, prefix: str) -> list[KV]:
        with self._lock:
            return list(self._kvs[prefix].values())

    def txn(self, compares, ops) -> TxnResult:
        if compares or not all(isinstance(op, Get) and not op.since for op in ops):
            raise TypeError("the metrics cache answers whole reads only")
        with self._lock:
            return TxnResult(True, self.revision, [self._matching(op) for op in ops])

    def _matching(self, get: Get) -> list[KV]:
        held = next((kvs for prefix, kvs in self._kvs.items() if get.key.startswith(prefix)),
                    None)
        if held is None:
            raise LookupError(f"{get.key!r} is not among the keys the metrics watch")
        if not get.prefix:
            return [held[get.key]] if get.key in held else []
        return [held[key] for key in sorted(held) if key.startswith(get.key)]

    def _spawn(self, target, name, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _load(self) -> None:
        """Every prefix at one revision, then a watch of each from there."""
        warned = False
        while not self._stopped.is_set():
            try:
                revision = self._store.revision()
                read = {prefix: self._store.range(prefix, revision=revision)[0]
                        for prefix in self._kvs}
                break
            except PeerctlError as exc:
                if not warned:
                    log.warning("metrics_waiting_for_etcd", error=str(exc))
                    warned = True
                self._stopped.wait(1.0)
        else:
            return
        with self._lock:
            self.revision = revision
            for prefix, kvs in read.items():
                self._kvs[prefix] = {kv.key: kv for kv in kvs}
                self._on_change(prefix, [(kv.key, None, kv) for kv in kvs], True)
        for prefix in self._kvs:
            watch = PrefixWatch(self._store, prefix, revision).start()
            self._watches.append(watch)
            self._spawn(self._follow, f"metrics:{prefix}", prefix, watch)
        if self._stopped.is_set():      # stop() came while the watches started
            for watch in self._watches:
                watch.stop()
        self.loaded.set()

    def _follow(self, prefix: str, watch: PrefixWatch) -> None:
        while not self._stopped.is_set():
            for batch in watch.drain(timeout=0.5):
                with self._lock:
                    self._apply(prefix, batch)

    def _apply(self, prefix: str, batch) -> None:
        held = self._kvs[prefix]
        changes = []
        if isinstance(batch, Reset):
            fresh = {kv.key: kv for kv in batch.kvs}
            changes += [(key, held[key], None) for key in held.keys() - fresh.keys()]
            changes += [(key, held.get(key), kv) for key, kv in fresh.items()
                        if key not in held or held[key].mod_revision != kv.mod_revision]
            self._kvs[prefix] = fresh
            self.revision = max(self.revision, batch.revision)
        else:
            for event in batch:
                key = event.kv.key
                new = event.kv if event.kind == "put" else None
                changes.append((key, held.get(key), new))
                if new is None:
                    held.pop(key, None)
                else:
                    held[key] = new
                self.revision = max(self.revision, event.kv.mod_revision)
        if changes:
            self._on_change(prefix, changes, False)
            self.changes += 1       # after: a scrape then counts what it brought
