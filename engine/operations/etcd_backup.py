"""A snapshot of etcd, written whole or not at all (``peerctl etcd snapshot``).

Promises:
- the snapshot is etcd's whole backend, as ``etcdctl snapshot save`` takes
  it (every cluster the etcd holds; it needs etcd's root), checked against
  the SHA-256 etcd sends after it;
- ``FILE`` appears only complete, checked and on disk (written beside it
  under a hidden temporary name, fsynced, then linked into place, the
  directory fsynced): a run killed or failed half-way leaves no ``FILE``,
  and removes its temporary file unless it was SIGKILLed (then a hidden
  ``.FILE.*.part`` stays beside it, never mistaken for a snapshot);
- an existing ``FILE`` is never written over, and the file is readable by
  its owner only (it holds every key of the cluster, tokens' hashes
  included);
- a directory that does not exist or cannot be written: one line, nothing
  written.
"""
from __future__ import annotations

import os
import tempfile

from engine.core import failpoints
from engine.errors import UsageError

__all__ = ["save_snapshot"]


def save_snapshot(store, path: str) -> dict:
    """``{file, bytes, revision, etcd}``: etcd's snapshot saved as ``path``."""
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    if os.path.exists(path):
        raise UsageError(f"{path} exists: a snapshot is never written over a file; "
                         "name another one")
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write {path}: {directory} is not a directory")
    try:
        fd, part = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                                    suffix=".part")
    except OSError as exc:
        raise UsageError(f"cannot write in {directory}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            taken = store.snapshot(out, on_chunk=lambda _n: failpoints.crash("snapshot chunk"))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(part, path)
        except FileExistsError:
            raise UsageError(f"{path} appeared meanwhile: a snapshot is never written "
                             "over a file; name another one") from None
        _fsync_directory(directory)
    finally:
        try:
            os.unlink(part)
        except FileNotFoundError:
            pass
    return {"file": path, "bytes": taken["bytes"], "revision": taken["revision"],
            "etcd": store.endpoints}


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
