"""Every resource provider of a cluster, in memory, brought up to date by
reading only what changed.

A candidates query used to read and decode every provider document.  The
view keeps the documents it has read and, for each query, asks etcd in one
read-only transaction for the providers modified since its last read and
for how many providers there are: the answer is as current as a full read
(a linearizable read, like the range it replaces), and it decodes only what
changed.  A count that does not match what the view holds means a provider
was deleted: the view reads everything again.

etcd answers that read by reading every provider and keeping the changed
ones: its cost grows with the providers, not with what changed (20 ms of
etcd's CPU at 10,000 providers).  So every write of a provider also puts
its *bucket* key, ``placement/bucket/<first two characters of its uuid>``
(:func:`stamped`), and a view of ``BUCKETS_FROM`` providers or more first
asks which buckets changed (256 small keys), then reads what changed in
those buckets only, each with its count (a count that does not match: that
bucket is read whole).  A writer that does not stamp (an older peerctl
during an upgrade, ``etcdctl``) is seen by the next read of everything,
which a large view still makes every ``SCAN_EVERY`` seconds.

Promises:
- one view per :class:`~engine.core.store.Store` (:func:`view_of`), shared
  by every placement opened on it (a peer's request handlers open one per
  request), safe to use from several threads;
- :meth:`ProviderView.providers` returns what etcd holds at the moment of
  the call, unreadable documents left out (and reported once); with
  ``max_age``, what it held at most that many seconds before the call (no
  read when the view was brought up to date since);
  :meth:`ProviderView.derived` returns the same with a value computed from
  them, once per version of the documents (or, for a value of where the
  providers stand, once per version of that); :meth:`ProviderView.memo`
  keeps per-document values between queries;
- every writer of provider documents puts their bucket keys in the same
  transaction (:func:`stamped`);
- a transaction that carries :meth:`ProviderView.rider` (a read of what
  changed since the view's last read, answered at the transaction's
  revision) and hands its answer to :meth:`ProviderView.carried` brings a
  view of fewer than ``BUCKETS_FROM`` providers up to date as a read would:
  a writer's next :meth:`~ProviderView.providers` with ``max_age`` needs no
  read of its own;
- a key never goes back in time: what this process wrote
  (:meth:`ProviderView.saw`, :meth:`ProviderView.gone`) and what a read
  brought apply only over an older revision of that key, whatever order
  they arrive in.
"""
from __future__ import annotations

import threading
import time
import weakref

from engine.core import keys
from engine.core.store import KV, Delete, Get, Put, Store
from engine.core.values import declare, readable, shape_of

__all__ = ["ProviderView", "view_of", "stamped", "BUCKET"]

RP = keys.placement("rp/")
BUCKET = keys.placement("bucket/")
WIDTH = 2               # a bucket: the providers whose uuid starts with the same 2 characters
BUCKETS_FROM = 500      # providers: a smaller view reads what changed in one scan of them all
MAX_BUCKETS = 8         # more buckets changed than this: one scan of them all instead
SCAN_EVERY = 10.0       # seconds between two scans of them all, however large the view
MEMOS = 32

declare(BUCKET + "*", None)     # the value says nothing: the key's mod revision does


def stamped(ops: list) -> list:
    """``ops`` and a put of the bucket key of every provider they put or
    delete: what every transaction that writes providers must carry."""
    buckets = {op.key[len(RP):len(RP) + WIDTH] for op in ops
               if isinstance(op, (Put, Delete)) and op.key.startswith(RP)}
    return [*ops, *(Put(BUCKET + b, 0) for b in sorted(buckets))]


def _bucket(key: str) -> str:
    return key[len(RP):len(RP) + WIDTH]

_views: "weakref.WeakKeyDictionary[Store, ProviderView]" = weakref.WeakKeyDictionary()
_views_lock = threading.Lock()


def view_of(store: Store) -> "ProviderView":
    """The store's provider view, made on first use."""
    with _views_lock:
        view = _views.get(store)
        if view is None:
            view = _views[store] = ProviderView(store)
        return view


class ProviderView:
    def __init__(self, store: Store):
        self._store = weakref.ref(store)        # the store keeps its view, not the reverse
        self._lock = threading.Lock()           # guards the fields below
        self._kvs: dict[str, KV] = {}           # key -> KV, readable values only
        self._unreadable: set[str] = set()      # keys present whose values are not
        self._revisions: dict[str, int] = {}    # key -> revision of its last put or delete
        self._docs: dict[str, dict] | None = None   # uuid -> document, None: to be rebuilt
        self._handed = False    # _docs was handed out: copy it before changing it
        self._derived: dict = {}                # make -> (structure, value, docs it was made of)
        self._synced = 0        # the revision the view was last brought up to
        self._structure = 0     # bumped when a provider comes, goes or changes its place
        self._memos: dict = {}  # key -> (tag, dict), least recently used first
        self._in_bucket: dict[str, int] = {}    # bucket -> keys the view holds in it
        self._scanned = 0.0     # time.monotonic() of the last scan of every provider
        self._scanned_to = 0    # the revision it read at: the next one reads from there
        self._fresh_at = None   # time.monotonic() a read that brought it up to date began

    # -- reading ---------------------------------------------------------------------

    def providers(self, max_age: float = 0.0) -> dict[str, dict]:
        """uuid -> provider document, as etcd holds them now, or held them
        at most ``max_age`` seconds ago (do not modify)."""
        return self._current(max_age)[0]

    def _current(self, max_age: float = 0.0) -> tuple[dict, int]:
        fresh_at = self._fresh_at
        if not max_age or fresh_at is None or time.monotonic() - fresh_at > max_age:
            self.sync()
        with self._lock:
            if self._docs is None:
                self._docs = {kv.value["uuid"]: kv.value for kv in self._kvs.values()}
            self._handed = True
            return self._docs, self._structure

    def derived(self, make, *, of_structure: bool = False,
                max_age: float = 0.0) -> tuple[dict, object]:
        """``(documents, make(documents))``: the documents as :meth:`providers`
        returns them, and what ``make`` computes of them, computed again
        only when they have changed.  With ``of_structure``, ``make`` reads
        only where each provider stands (its root, parent, aggregates and
        traits): its value is kept until a provider comes, goes or moves,
        however often usages and inventories change.  ``max_age``: as
        :meth:`providers`'."""
        docs, structure = self._current(max_age)
        with self._lock:
            made = self._derived.get(make)
            if made is not None and (made[0] == structure if of_structure else made[2] is docs):
                return docs, made[1]
        value = make(docs)
        with self._lock:
            self._derived[make] = (structure, value, docs)
        return docs, value

    def memo(self, key, tag) -> dict:
        """A dict kept with the view for ``key`` while ``tag`` stays the
        same object, for values computed per provider document (whoever
        reads one checks it was made of the document it has now); the
        ``MEMOS`` keys used last are kept."""
        with self._lock:
            memo = self._memos.pop(key, None)
            if memo is None or memo[0] is not tag:
                memo = (tag, {})
            self._memos[key] = memo
            while len(self._memos) > MEMOS:
                del self._memos[next(iter(self._memos))]
            return memo[1]

    def kv(self, uuid: str) -> KV | None:
        """The provider as the view last saw it (no read)."""
        with self._lock:
            return self._kvs.get(RP + uuid)

    def sync(self) -> None:
        """Read what changed since the last read, or everything the first time
        and after a deletion."""
        store = self._store()
        if store is None:
            raise RuntimeError("the store of this provider view is gone")
        since, began = self._synced, time.monotonic()
        if (since and len(self._kvs) + len(self._unreadable) >= BUCKETS_FROM
                and began - self._scanned < SCAN_EVERY
                and self._sync_buckets(store, since)):
            with self._lock:
                self._fresh(began)
            return
        if since:       # from the last scan: what an unstamped write changed since, too
            changed, count, revision = store.changed_since(RP, self._scanned_to + 1)
            if self._caught_up(changed, count, revision, began):
                return
        kvs, revision = store.range(RP)     # first read, or a provider was deleted
        with self._lock:
            self._replace(RP, kvs, revision)
            self._scanned_done(revision, began)

    def _caught_up(self, changed: list, count: int, revision: int, began: float) -> bool:
        """Apply what changed since the last scan, as read at ``revision``;
        False when the count says a provider was deleted: the view is then
        behind until it reads them all."""
        with self._lock:
            for kv in changed:
                self._apply(kv.key, kv, kv.mod_revision)
            if len(self._kvs) + len(self._unreadable) != count:
                self._fresh_at = None
                return False
            self._scanned_done(revision, began)
            return True

    def _scanned_done(self, revision: int, at: float) -> None:
        self._synced = max(self._synced, revision)
        self._scanned_to = max(self._scanned_to, revision)
        self._scanned = at
        self._fresh(at)

    def _fresh(self, at: float) -> None:
        self._fresh_at = at if self._fresh_at is None else max(self._fresh_at, at)

    # -- a read carried by a writer's transaction ---------------------------------------

    def rider(self) -> tuple[Get, float] | None:
        """``(read, now)``: the read of what changed since the last scan,
        for a writer to carry in its transaction (on success and on failure,
        last), and when it was made; None when the view is too large for
        one (it reads by buckets) or has not been read yet."""
        with self._lock:
            if not self._synced or len(self._kvs) + len(self._unreadable) >= BUCKETS_FROM:
                return None
            return Get(RP, True, since=self._scanned_to + 1), time.monotonic()

    def carried(self, rider: tuple[Get, float], kvs: list, count: int, revision: int) -> None:
        """The answer to :meth:`rider`'s read, from a transaction answered
        at ``revision``: the view is as current as that read (or, if a
        provider was deleted, read again by the next sync)."""
        self._caught_up(kvs, count, revision, rider[1])

    def _sync_buckets(self, store: Store, since: int) -> bool:
        """Read what changed in the buckets stamped since ``since``; False
        (nothing read) when too many were, or one is no bucket of a uuid."""
        stamps, _, revision = store.changed_since(BUCKET, since + 1)
        buckets = sorted({kv.key[len(BUCKET):] for kv in stamps})
        if len(buckets) > MAX_BUCKETS or any(len(b) != WIDTH for b in buckets):
            return False
        for bucket in buckets:      # each read after the stamps: as fresh as they are
            changed, count, _ = store.changed_since(RP + bucket, since + 1)
            with self._lock:
                for kv in changed:
                    self._apply(kv.key, kv, kv.mod_revision)
                if self._in_bucket.get(bucket, 0) == count:
                    continue
            kvs, at = store.range(RP + bucket)     # a provider of it was deleted
            with self._lock:
                self._replace(RP + bucket, kvs, at)
        with self._lock:
            self._synced = max(self._synced, revision)
        return True

    def _replace(self, prefix: str, kvs: list, revision: int) -> None:
        """What the view holds under ``prefix``: ``kvs``, read at ``revision``."""
        present = {kv.key for kv in kvs}
        for kv in kvs:
            self._apply(kv.key, kv, kv.mod_revision)
        for key in [k for k in (*self._kvs, *self._unreadable)
                    if k.startswith(prefix) and k not in present]:
            self._apply(key, None, revision)        # deleted before the read

    # -- what this process wrote -------------------------------------------------------

    def saw(self, kv: KV, *, checked: bool = False) -> None:
        """A provider this process wrote or read; ``checked``: its value is
        known to be readable (this process wrote it, or checked it already).
        ``kv.mod_revision``: its last write's revision."""
        with self._lock:
            self._apply(kv.key, kv, kv.mod_revision, checked)

    def gone(self, key: str, revision: int) -> None:
        """A provider key this process deleted at ``revision``."""
        with self._lock:
            self._apply(key, None, revision)

    def _apply(self, key: str, kv: KV | None, revision: int, checked: bool = False) -> None:
        if revision <= self._revisions.get(key, 0):
            return          # not newer than what the view holds
        self._revisions[key] = revision
        held = key in self._unreadable
        old = self._kvs.pop(key, None)
        self._unreadable.discard(key)
        if kv is not None:
            if checked or readable(kv, _provider_shape()) is not None:
                self._kvs[key] = kv
            else:
                self._unreadable.add(key)
        if (old is not None or held) != (kv is not None):
            bucket = _bucket(key)
            self._in_bucket[bucket] = self._in_bucket.get(bucket, 0) + (1 if kv else -1)
        new = self._kvs.get(key)
        if old is None or new is None or _moved(old.value, new.value):
            self._structure += 1
        self._change_docs(key, old, new)

    def _change_docs(self, key: str, old: KV | None, new: KV | None) -> None:
        """The documents by uuid, changed in place of being made again: a
        copy only if they were handed out (callers read them unlocked)."""
        docs = self._docs
        if docs is None:
            return
        uuid = key[len(RP):]
        if (old is not None and old.value["uuid"] != uuid) or (
                new is not None and new.value["uuid"] != uuid):
            self._docs = None       # a document under another's key: made again
            return
        if self._handed:
            docs = self._docs = dict(docs)
            self._handed = False
        if new is not None:
            docs.pop(uuid, None)    # last in order, as a document made again would be
            docs[uuid] = new.value
        elif old is not None:
            docs.pop(uuid, None)


def _provider_shape():
    """The shape declared for provider documents (found once, not per key)."""
    global _PROVIDER
    if _PROVIDER is None:
        _PROVIDER = shape_of(RP)
    return _PROVIDER


_PROVIDER = None


def _moved(old: dict, new: dict) -> bool:
    """Whether a provider changed where it stands (its root, parent,
    aggregates, traits): what a structure-derived value may read."""
    get, now = old.get, new.get
    return (get("root") != now("root") or get("parent") != now("parent")
            or get("aggregates") != now("aggregates") or get("traits") != now("traits"))
