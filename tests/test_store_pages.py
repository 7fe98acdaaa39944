"""Range reads of many keys: read in pages at one revision, so that neither
gRPC's message limit nor a write between pages shows."""
from __future__ import annotations

from engine.core.store import Put, Store


def put_many(store: Store, prefix: str, count: int, size: int) -> None:
    for start in range(0, count, 100):
        store.txn([], [Put(f"{prefix}{i:06d}", "x" * size)
                       for i in range(start, min(start + 100, count))])


def test_a_range_larger_than_grpcs_default_message_is_read_whole(store):
    put_many(store, "big/", 3000, 2000)         # ~6 MiB: over gRPC's 4 MiB default
    kvs, revision = store.range("big/")
    assert [kv.key for kv in kvs] == [f"big/{i:06d}" for i in range(3000)]
    assert revision >= max(kv.mod_revision for kv in kvs)


def test_pages_are_one_snapshot(store, monkeypatch):
    monkeypatch.setattr(Store, "PAGE", 100)
    put_many(store, "paged/", 450, 10)
    calls = []
    real = store._call

    def call(stub, method, request):
        response = real(stub, method, request)
        if method == "Range":
            calls.append(method)
            if len(calls) == 1:         # between the first and the second page
                store.put("paged/000449", "changed")
                store.put("paged/zzz", "new")
        return response
    monkeypatch.setattr(store, "_call", call)
    kvs, revision = store.range("paged/")
    assert len(calls) == 5
    assert [kv.key for kv in kvs] == [f"paged/{i:06d}" for i in range(450)]
    assert kvs[-1].value == "x" * 10            # as at the first page's revision
    assert store.get("paged/000449").value == "changed"
