"""The releases the cluster carries (``code add``, ``code list``, ``code
delete``; docs/upgrade.md, "Releases").

A file is checked before etcd is opened (its layout, and that the tree in
it starts): what is not a release is a ``UsageError`` with nothing written,
a tree that does not start a ``Failed``.  :mod:`engine.releases.catalog`
keeps them in etcd."""
from __future__ import annotations

import time

__all__ = ["add_release", "list_releases", "delete_release", "name_disagrees"]

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
