"""The releases a cluster carries in etcd, as XenoControl's group carried
its code: ``code/releases/<version>`` (the meta) and
``code/chunks/<version>/<index>`` (the archive, :data:`CHUNK_SIZE` bytes a
key).

The meta is ``{version, commit, feature_level, sha256, bytes, chunks,
chunk_size, state, added, filename}``; ``state`` is ``uploading`` until
every chunk is written, then ``ready``.

Promises:
- an add is crash-safe: the meta is written ``uploading`` first (clearing
  any chunks an interrupted add left), then the chunks, then ``ready``;
  every write after the first is fenced on the meta this add wrote, so a
  concurrent add or delete of the same version stops it, never mixes with
  it.  An ``uploading`` meta left by a crash is taken over by the next add
  of that version, and :func:`delete` removes it with its chunks;
- each write stays under :data:`TXN_BYTES` (etcd refuses a request over
  1.5 MiB by default), each read under a few MiB;
- at most :data:`MAX_RELEASES` ready releases are kept: the next is
  refused until one is deleted;
- :func:`fetch` gives the archive only when its chunks, size and sha256 are
  those the meta names;
- a release a live host runs is never deleted;
- a meta or chunk of the wrong shape is reported once and skipped, never
  taken for a release.
"""
from __future__ import annotations

import hashlib
import re
import time

from engine.core import failpoints, keys
from engine.core.store import Delete, Get, Put, absent, modified_at
from engine.core.values import declare, readable, report, shape
from engine.errors import Failed, NoSuch, Refused, UsageError

from .version import VERSION_PATTERN

__all__ = ["CHUNK_SIZE", "TXN_BYTES", "MAX_RELEASES", "UPLOADING", "READY", "META", "CHUNK",
           "check_version", "add", "releases", "get", "fetch", "delete"]

CHUNK_SIZE = 512 * 1024         # bytes of the archive per key
TXN_BYTES = 1024 * 1024         # the most one write carries
READ_CHUNKS = 8                 # chunks per read (4 MiB)
MAX_RELEASES = 5                # ready releases kept
UPLOADING, READY = "uploading", "ready"


def _check(meta: dict) -> str | None:
    if meta["state"] not in (UPLOADING, READY):
        return f"state {meta['state']!r}"
    if not re.fullmatch(r"[0-9a-f]{64}", meta["sha256"]):
        return "sha256 is no sha256"
    if meta["bytes"] < 1 or meta["chunk_size"] < 1 \
            or meta["chunks"] != -(-meta["bytes"] // meta["chunk_size"]):
        return f"{meta['chunks']} chunks of {meta['chunk_size']} for {meta['bytes']} bytes"
    return None


META = shape("release", _check, version=str, commit=(str, type(None)), feature_level=int,
             sha256=str, bytes=int, chunks=int, chunk_size=int, state=str,
             added=(int, float), filename=str)
CHUNK = shape("release chunk", None, bytes)
declare(keys.release() + "*", META)
declare(keys.release_chunk() + "*", CHUNK)


def check_version(version) -> str:
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version):
        raise UsageError(f"bad release version {version!r} (a version as setup.cfg "
                         "gives it: 0.2.0)")
    return version


def _taken_over(version: str) -> Failed:
    return Failed(f"release {version}: another add or a delete of it took over during "
                  "this add (code list shows where it stands)")


# -- adding ----------------------------------------------------------------------

def _stored(store) -> list[dict]:
    """Every readable meta, each under the key of its own version."""
    found = []
    for kv in store.range(keys.release())[0]:
        meta = readable(kv)
        if meta is None:
            continue
        if meta["version"] != keys.suffix(kv.key, keys.release()):
            report(kv.key, f"not a release: it names version {meta['version']!r}")
            continue
        found.append(meta)
    return found


def _check_room(store, version: str) -> None:
    ready = [meta for meta in _stored(store)
             if meta["state"] == READY and meta["version"] != version]
    if len(ready) >= MAX_RELEASES:
        raise Refused(f"{len(ready)} releases stored, the most kept: delete one "
                      "(code delete VERSION)")


def _batches(data: bytes):
    """``[(index, chunk), ...]`` per write, each write under :data:`TXN_BYTES`."""
    batch, size = [], 0
    for index, start in enumerate(range(0, len(data), CHUNK_SIZE)):
        chunk = data[start:start + CHUNK_SIZE]
        if batch and size + len(chunk) > TXN_BYTES - 64 * 1024:    # room for keys, framing
            yield batch
            batch, size = [], 0
        batch.append((index, chunk))
        size += len(chunk)
    if batch:
        yield batch


def _upload(store, version: str, data: bytes, fence) -> None:
    for batch in _batches(data):
        if not store.txn([fence], [Put(keys.release_chunk(version, index), chunk)
                                   for index, chunk in batch]).succeeded:
            raise _taken_over(version)
        failpoints.crash("release_chunk_written")


def add(store, release) -> dict:
    """Store ``release`` (an :class:`~engine.releases.archive.Release`): its
    ready meta, with ``already`` True when the same release was stored
    (nothing written).  The same version with another sha256 is refused."""
    version = check_version(release.version)
    key = keys.release(version)
    for _ in range(10):
        kv = store.get(key)
        meta = readable(kv)
        if meta is not None and meta["state"] == READY:
            if meta["sha256"] == release.sha256:
                return {**meta, "already": True}
            raise Refused(f"release {version} is already stored with another sha256 "
                          f"({meta['sha256'][:12]}...): delete it first")
        _check_room(store, version)
        uploading = {"version": version, "commit": release.commit,
                     "feature_level": release.feature_level, "sha256": release.sha256,
                     "bytes": release.bytes, "chunks": -(-release.bytes // CHUNK_SIZE),
                     "chunk_size": CHUNK_SIZE, "state": UPLOADING, "added": time.time(),
                     "filename": release.filename}
        guard = absent(key) if kv is None else modified_at(key, kv.mod_revision)
        begun = store.txn([guard], [Delete(keys.release_chunk(version), prefix=True),
                                    Put(key, uploading)])
        if begun.succeeded:
            break
    else:
        raise Refused(f"release {version} kept changing under this add: try again")
    fence = modified_at(key, begun.revision)
    _upload(store, version, release.data, fence)
    ready = {**uploading, "state": READY}
    if not store.txn([fence], [Put(key, ready)]).succeeded:
        raise _taken_over(version)
    return {**ready, "already": False}


# -- reading -----------------------------------------------------------------------

def _running_on(hosts: dict, version: str) -> list[str]:
    from engine.natural import natural_key
    return sorted((host for host, record in hosts.items()
                   if isinstance(record, dict) and record.get("release") == version),
                  key=natural_key)


def releases(store) -> list[dict]:
    """Every stored release's meta by version (natural order), with
    ``running_on``: the live hosts whose peer runs it."""
    from engine.core.hosts import live_hosts
    from engine.natural import natural_key
    hosts = live_hosts(store)
    return [{**meta, "running_on": _running_on(hosts, meta["version"])}
            for meta in sorted(_stored(store), key=lambda meta: natural_key(meta["version"]))]


def get(store, version: str) -> dict:
    """Release ``version``'s meta; ``NoSuch`` when there is none, ``Failed``
    when it is unreadable, ``Refused`` while it is not ready."""
    check_version(version)
    kv = store.get(keys.release(version))
    if kv is None:
        raise NoSuch(f"no release {version!r}: code list shows the stored ones")
    meta = readable(kv)
    if meta is None or meta["version"] != version:
        raise Failed(f"release {version}: its record in etcd is unreadable "
                     "(code delete it and add it again)")
    if meta["state"] != READY:
        raise Refused(f"release {version} is not ready: its upload did not finish "
                      "(code add it again)")
    return meta


def _corrupt(version: str, why: str) -> Failed:
    return Failed(f"release {version} is corrupt in etcd: {why} (code delete it and add "
                  "it again)")


def fetch(store, version: str) -> bytes:
    """Release ``version``'s archive, read from its chunks and checked
    against its meta (count, size, sha256): ``Failed`` naming what differs."""
    meta = get(store, version)
    count = meta["chunks"]
    stored, _ = store.range(keys.release_chunk(version), keys_only=True)
    if len(stored) != count:
        raise _corrupt(version, f"{count} chunks expected, {len(stored)} stored")
    parts = []
    for start in range(0, count, READ_CHUNKS):
        indexes = range(start, min(start + READ_CHUNKS, count))
        read = store.txn([], [Get(keys.release_chunk(version, index)) for index in indexes])
        for index, found in zip(indexes, read.ranges):
            if not found or not isinstance(found[0].value, bytes):
                why = "unreadable" if found else "missing"
                raise _corrupt(version, f"chunk {index} is {why}")
            parts.append(found[0].value)
    data = b"".join(parts)
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta["sha256"]:
        raise _corrupt(version, f"sha256 {meta['sha256'][:12]}... expected, "
                                f"{digest[:12]}... read")
    return data


# -- deleting ----------------------------------------------------------------------

def delete(store, version: str) -> dict:
    """Delete release ``version``, ready or interrupted, with every chunk:
    ``{version, deleted: True}``.  Unknown: ``Failed``; refused while a live
    host runs it (naming them)."""
    from engine.core.hosts import live_hosts
    check_version(version)
    key = keys.release(version)
    for _ in range(10):
        kv = store.get(key)
        if kv is None:
            raise NoSuch(f"no release {version!r}: code list shows the stored ones")
        running = _running_on(live_hosts(store), version)
        if running:
            raise Refused(f"release {version} runs on {', '.join(running)}: upgrade "
                          f"{'it' if len(running) == 1 else 'them'} to another release first")
        if store.txn([modified_at(key, kv.mod_revision)],
                     [Delete(keys.release_chunk(version), prefix=True), Delete(key)]).succeeded:
            return {"version": version, "deleted": True}
    raise Refused(f"release {version} kept changing under this delete: try again")
