"""The resilient prefix watch, against a real etcd it can lose."""
from engine.core.store import Store
from engine.core.watch import PrefixWatch, Reset
from tests.support import wait_for


def drain(watch, until, timeout=10.0):
    """Collect batches until ``until(batches)`` holds."""
    batches = []
    wait_for(lambda: (batches.append(watch.get(timeout=0.1)) or until([b for b in batches if b])),
             timeout=timeout, what="watch batches")
    return [b for b in batches if b]


def test_resumes_after_etcd_restart_without_loss_or_doubles(own_etcd):
    store = Store(own_etcd.url, "w")
    _, revision = store.range("jobs/")
    watch = PrefixWatch(store, "jobs/", revision).start()
    try:
        for i in range(5):
            store.put(f"jobs/{i}", i)
        own_etcd.restart()
        for i in range(5, 10):
            wait_for(lambda: _try_put(store, f"jobs/{i}", i), what="etcd back")
        batches = drain(watch, lambda bs: sum(len(b) for b in bs) >= 10)
        seen = [e.kv.value for b in batches for e in b]
        assert seen == list(range(10))
    finally:
        watch.stop()


def _try_put(store, key, value):
    try:
        store.put(key, value)
        return True
    except Exception:
        return False


def test_compacted_revision_gives_a_fresh_read(own_etcd):
    store = Store(own_etcd.url, "w")
    _, start = store.range("jobs/")
    for i in range(3):
        store.put(f"jobs/{i}", i)
    store.delete("jobs/0")
    store.compact(store.revision())
    watch = PrefixWatch(store, "jobs/", start).start()     # resumes from before the compaction
    try:
        (reset,) = drain(watch, lambda bs: any(isinstance(b, Reset) for b in bs))
        assert isinstance(reset, Reset)
        assert sorted(kv.value for kv in reset.kvs) == [1, 2]
        store.put("jobs/3", 3)
        (batch,) = drain(watch, lambda bs: len(bs) >= 1)
        assert [e.kv.value for e in batch] == [3]
    finally:
        watch.stop()


def test_a_puts_only_watch_is_sent_the_puts_and_none_of_the_deletes(own_etcd):
    store = Store(own_etcd.url, "w")
    _, revision = store.range("jobs/")
    watch = PrefixWatch(store, "jobs/", revision, puts_only=True).start()
    try:
        store.put("jobs/1", 1)
        store.delete("jobs/1")
        store.put("jobs/2", 2)
        store.delete("jobs/2")
        store.put("jobs/3", 3)
        batches = drain(watch, lambda bs: 3 in [e.kv.value for b in bs for e in b])
        events = [(e.kind, e.kv.value) for b in batches for e in b]
        assert events == [("put", 1), ("put", 2), ("put", 3)]
    finally:
        watch.stop()


def test_drain_hands_over_every_queued_batch_in_order(store):
    _, revision = store.range("jobs/")
    watch = PrefixWatch(store, "jobs/", revision).start()
    try:
        assert watch.drain(timeout=0.05) == []
        for i in range(4):
            store.put(f"jobs/{i}", i)       # a transaction, so a batch, each
        wait_for(lambda: watch.events.qsize() == 4, what="four batches queued")
        batches = watch.drain(timeout=1)
        assert [[event.kv.value for event in batch] for batch in batches] == [[0], [1], [2], [3]]
        assert watch.drain(timeout=0.05) == []
    finally:
        watch.stop()


def test_quiet_events_wake_nobody_and_come_first_in_the_next_batch(store):
    _, revision = store.range("jobs/")
    watch = PrefixWatch(store, "jobs/", revision,
                        quiet=lambda event: event.kv.key.startswith("jobs/late/")).start()
    try:
        store.put("jobs/late/1", 1)
        store.put("jobs/late/2", 2)
        wait_for(lambda: watch.last_revision > revision + 1, what="both puts read")
        assert watch.events.empty()                             # nobody woken
        store.put("jobs/now", 3)
        batches = watch.drain(timeout=5)
        assert [[e.kv.value for e in b] for b in batches] == [[1, 2, 3]]   # in order
        put = store.put("jobs/late/4", 4)
        wait_for(lambda: watch.last_revision >= put, what="the put read")
        assert [e.kv.value for e in watch.get(timeout=0.1)] == [4]   # a timeout returns it
    finally:
        watch.stop()
