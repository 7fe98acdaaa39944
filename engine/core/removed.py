"""A removed host's tombstone, ``removed/<host>``: the fence that keeps a
host taken out of the cluster (``host remove``) from coming back by itself.

A live peer would register again right after its records were deleted, so
removal does not race it; it fences it.  Promises:

- a peer registers (puts ``hosts/<host>``) only in a transaction that finds
  no tombstone (:func:`not_removed`), so a tombstone written first keeps
  every later start of that host's peer out, and a peer that registered
  first sees the tombstone on its watch (:class:`RemovalWatch`, from the
  revision of its registration: nothing written after it is missed);
- a fenced peer stops serving, gives its lease back and exits 2 with one
  line (:func:`refusal`): the packaged service does not restart it
  (``RestartPreventExitStatus=2``);
- :func:`clear` (``host add`` of that name again) deletes a finished
  removal's tombstone, never one under way;
- the tombstone is also removal's journal: ``state`` is ``removing`` until
  every record of the host is gone, then ``removed`` (in the transaction
  that deletes the last of them), so a removal cut short is finished by
  running it again.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from . import keys
from .store import absent
from .values import declare, readable, shape

__all__ = ["TOMBSTONE", "read", "not_removed", "refusal", "clear", "RemovalWatch"]

TOMBSTONE = shape("removed host", host=str, state=str, time=(int, float))
declare(keys.removed() + "*", TOMBSTONE)


def read(store, host: str) -> dict | None:
    """``host``'s tombstone, or None (none, or unreadable: reported)."""
    kv = store.get(keys.removed(host))
    return readable(kv) if kv is not None else None


def not_removed(host: str):
    """The compare a peer's registration carries: no tombstone for ``host``."""
    return absent(keys.removed(host))


def refusal(record: dict) -> str:
    """The one line a fenced peer exits with."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("time") or 0))
    by = f" by {record['by']}" if record.get("by") else ""
    return (f"host {record['host']} was removed from the cluster at {when}{by} "
            f"(host remove): its peer does not serve; add the host again (host add "
            f"{record['host']}) to bring it back")


def clear(store, host: str) -> bool:
    """Let ``host`` join again (``host add``): its tombstone deleted, only
    once its removal finished (a removal under way is finished first, by
    running ``host remove`` again).  False when it has no finished one."""
    from .store import Delete, modified_at
    kv = store.get(keys.removed(host))
    if kv is None or (readable(kv) or {}).get("state") != "removed":
        return False
    return store.txn([modified_at(kv.key, kv.mod_revision)], [Delete(kv.key)]).succeeded


class RemovalWatch:
    """Calls ``on_removed(record)`` once ``host``'s tombstone is written
    after ``after_revision`` (the peer's registration)."""

    def __init__(self, store, host: str, after_revision: int,
                 on_removed: Callable[[dict], None]):
        from .watch import PrefixWatch, Reset
        self._reset = Reset
        self._watch = PrefixWatch(store, keys.removed(host), after_revision, exact=True,
                                  puts_only=True)
        self._on_removed = on_removed
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"removal:{host}", daemon=True)

    def start(self) -> "RemovalWatch":
        self._watch.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()

    def _run(self) -> None:
        while not self._stopped.is_set():
            batch = self._watch.get(timeout=1.0)
            if not batch:
                continue
            kvs = batch.kvs if isinstance(batch, self._reset) else [e.kv for e in batch]
            for kv in kvs:
                record = readable(kv)
                if record is not None:
                    self._on_removed(record)
                    return
