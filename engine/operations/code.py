"""The releases the cluster carries (``code add``, ``code list``, ``code
delete``; docs/upgrade.md, "Releases").

A file is checked before etcd is opened (its layout, and that the tree in
it starts): what is not a release is a ``UsageError`` with nothing written,
a tree that does not start a ``Failed``.  :mod:`engine.releases.catalog`
keeps them in etcd."""
from __future__ import annotations

import time

from engine.errors import UsageError

__all__ = ["add_release", "add_uploaded", "list_releases", "delete_release", "name_disagrees",
           "LISTED", "ORDER", "UPLOADED"]

ROW = ("version", "commit", "feature_level", "sha256", "bytes", "state", "added", "running_on")
# code list's JSON: each row's fields in this order, sorted by version
LISTED = ["version", "commit", "feature_level", "bytes", "state", "added", "running_on",
          "sha256"]
ORDER = "version"
UPLOADED = "request body"       # what names an upload's bytes in messages, without a name


def _iso(t) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) \
        if isinstance(t, (int, float)) else None


def add_release(ctx, path: str) -> dict:
    """Store the release in the file ``path``: ``{version, sha256, bytes,
    commit, feature_level, state, already}`` (``already``: the same release
    was stored, nothing written)."""
    from engine.releases.archive import read_release
    return _stored(ctx, read_release(path))


def add_uploaded(ctx, data: bytes, name: str | None = None) -> dict:
    """Store the release whose archive is ``data`` (the HTTP API's upload),
    checked as :func:`add_release` checks a file; ``name``, its file name
    (``peerctl-0.2.0.tar.gz``), names it in messages and in its record.
    The same answer as :func:`add_release`."""
    import os
    from engine.releases.archive import checked_release
    if name is not None and (not name or os.path.basename(name) != name or len(name) > 255
                             or name in (".", "..")):
        raise UsageError(f"bad archive name {name!r} (a file name: peerctl-0.2.0.tar.gz)")
    return _stored(ctx, checked_release(data, name or UPLOADED))


def _stored(ctx, release) -> dict:
    from engine.releases import catalog
    meta = catalog.add(ctx.store(), release)
    return {"version": meta["version"], "sha256": meta["sha256"], "bytes": meta["bytes"],
            "commit": meta["commit"], "feature_level": meta["feature_level"],
            "state": meta["state"], "already": bool(meta.get("already"))}


def name_disagrees(path: str, version: str) -> str | None:
    """One line when the file name of the release stored as ``version``
    implies another version (``peerctl-0.2.0.tar.gz`` holding 0.1.0), else
    None: it is stored under its setup.cfg's version all the same."""
    import os
    from engine.releases.archive import named_version
    named = named_version(path)
    if named is None or named == version:
        return None
    return (f"{os.path.basename(path)} is named for version {named}, but its setup.cfg "
            f"says {version}: stored as {version}")


def list_releases(ctx) -> list[dict]:
    """Every stored release by version: ``[{version, commit, feature_level,
    sha256, bytes, state, added, running_on}]`` (``added`` ISO 8601 UTC,
    ``running_on`` the live hosts whose peer runs it)."""
    from engine.releases import catalog
    return [{**{field: meta.get(field) for field in ROW}, "added": _iso(meta.get("added"))}
            for meta in catalog.releases(ctx.store())]


def delete_release(ctx, version: str) -> dict:
    """Delete release ``version`` (a finished or an interrupted upload):
    ``{version, deleted: true}``; refused while a live host runs it."""
    from engine.releases import catalog
    return catalog.delete(ctx.store(), version)
