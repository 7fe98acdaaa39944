"""etcd's history of a prefix, event by event, for tests that check every
revision rather than the state at the end."""
from __future__ import annotations

__all__ = ["events_since"]

MARK = "test-history-mark"


def events_since(store, prefix: str, first: int) -> tuple[list, int]:
    """``(events, last)``: every event under ``prefix`` from revision
    ``first`` up to now, in revision order (``Event(kind, kv)``; a delete's
    ``kv.value`` None), and the revision they reach.  Now is marked by a
    write of the test's own outside ``prefix``, which the watch of the
    cluster's whole keyspace waits for: etcd's revision alone may be
    another cluster's write."""
    last = store.put(MARK, first)
    stream = store.watch_stream("", first)
    events = []
    try:
        for batch in stream:
            events += [e for e in batch if e.kv.key.startswith(prefix)
                       and e.kv.mod_revision < last]
            if any(e.kv.mod_revision >= last for e in batch):
                break
    finally:
        stream.cancel()
    return events, last
