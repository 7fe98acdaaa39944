"""The releases the cluster carries (``code add``, ``code list``, ``code
delete``; docs/upgrade.md, "Releases").

A file is checked before etcd is opened (its layout, and that the tree in
it starts): what is not a release is a ``UsageError`` with nothing written,
a tree that does not start a ``Failed``.  :mod:`engine.releases.catalog`
keeps them in etcd."""
from __future__ import annotations

import time

__all__ = ["add_release", "list_releases", "delete_release"]

ROW = ("version", "commit", "feature_level", "sha256", "bytes", "state", "added", "running_on")


def _iso(t) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) \
        if isinstance(t, (int, float)) else None


def add_release(ctx, path: str) -> dict:
    """Store the release in the file ``path``: ``{version, sha256, bytes,
    commit, feature_level, state, already}`` (``already``: the same release
    was stored, nothing written)."""
    from engine.releases import catalog
    from engine.releases.archive import read_release
    release = read_release(path)
    meta = catalog.add(ctx.store(), release)
    return {"version": meta["version"], "sha256": meta["sha256"], "bytes": meta["bytes"],
            "commit": meta["commit"], "feature_level": meta["feature_level"],
            "state": meta["state"], "already": bool(meta.get("already"))}


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
