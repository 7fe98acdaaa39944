"""Every resource provider of a cluster, in memory, brought up to date by
reading only what changed.

A candidates query used to read and decode every provider document.  The
view keeps the documents it has read and, for each query, asks etcd in one
read-only transaction for the providers modified since its last read and
for how many providers there are: the answer is as current as a full read
(a linearizable read, like the range it replaces), and it decodes only what
changed.  A count that does not match what the view holds means a provider
was deleted: the view reads everything again.

Promises:
- one view per :class:`~engine.core.store.Store` (:func:`view_of`), shared
  by every placement opened on it (a peer's request handlers open one per
  request), safe to use from several threads;
- :meth:`ProviderView.providers` returns what etcd holds at the moment of
  the call, unreadable documents left out (and reported once);
  :meth:`ProviderView.derived` returns the same with a value computed from
  them, once per version of the documents (or, for a value of where the
  providers stand, once per version of that); :meth:`ProviderView.memo`
  keeps per-document values between queries;
- a key never goes back in time: what this process wrote
  (:meth:`ProviderView.saw`, :meth:`ProviderView.gone`) and what a read
  brought apply only over an older revision of that key, whatever order
  they arrive in.
"""
from __future__ import annotations

import threading
import weakref

from engine.core import keys
from engine.core.store import KV, Store
from engine.core.values import readable

__all__ = ["ProviderView", "view_of"]

RP = keys.placement("rp/")
MEMOS = 32

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
        self._docs: dict[str, dict] | None = None   # uuid -> document, rebuilt on change
        self._derived: dict = {}                # make -> (structure, value, docs it was made of)
        self._synced = 0        # the revision the view was last brought up to
        self._structure = 0     # bumped when a provider comes, goes or changes its place
        self._memos: dict = {}  # key -> (tag, dict), least recently used first

    # -- reading ---------------------------------------------------------------------

    def providers(self) -> dict[str, dict]:
        """uuid -> provider document, as etcd holds them now (do not modify)."""
        return self._current()[0]

    def _current(self) -> tuple[dict, int]:
        self.sync()
        with self._lock:
            if self._docs is None:
                self._docs = {kv.value["uuid"]: kv.value for kv in self._kvs.values()}
            return self._docs, self._structure

    def derived(self, make, *, of_structure: bool = False) -> tuple[dict, object]:
        """``(documents, make(documents))``: the documents as :meth:`providers`
        returns them, and what ``make`` computes of them, computed again
        only when they have changed.  With ``of_structure``, ``make`` reads
        only where each provider stands (its root, parent, aggregates and
        traits): its value is kept until a provider comes, goes or moves,
        however often usages and inventories change."""
        docs, structure = self._current()
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
        since = self._synced
        if since:
            changed, count, revision = store.changed_since(RP, since + 1)
            with self._lock:
                for kv in changed:
                    self._apply(kv.key, kv, kv.mod_revision)
                if len(self._kvs) + len(self._unreadable) == count:
                    self._synced = max(self._synced, revision)
                    return
        kvs, revision = store.range(RP)     # first read, or a provider was deleted
        with self._lock:
            present = {kv.key for kv in kvs}
            for kv in kvs:
                self._apply(kv.key, kv, kv.mod_revision)
            for key in [k for k in (*self._kvs, *self._unreadable) if k not in present]:
                self._apply(key, None, revision)        # deleted before the read
            self._synced = max(self._synced, revision)

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
        old = self._kvs.pop(key, None)
        self._unreadable.discard(key)
        if kv is not None:
            if checked or readable(kv) is not None:
                self._kvs[key] = kv
            else:
                self._unreadable.add(key)
        new = self._kvs.get(key)
        if old is None or new is None or _place(old.value) != _place(new.value):
            self._structure += 1
        self._docs = None


def _place(doc: dict) -> tuple:
    """Where a provider stands: what a structure-derived value may read."""
    return (doc.get("root"), doc.get("parent"), doc.get("aggregates"), doc.get("traits"))
