"""What code a tree of peerctl is: its release number (``setup.cfg``'s
``version``, or the ``PKG-INFO`` of an sdist or of a tree a wheel installed,
``site-packages/peerctl_tree/``), the commit when known (a git checkout's
``HEAD``, or a ``COMMIT`` file an archive or a wheel carries) and the
highest cluster feature level it supports.

Cheap: it reads files, never runs git, never imports the tree it describes
(:func:`describe` of another tree parses its ``engine/core/features.py``).
"""
from __future__ import annotations

import configparser
import os
import re

__all__ = ["ROOT", "VERSION_PATTERN", "describe", "running", "label"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a release number, as it may name a release in etcd
VERSION_PATTERN = re.compile(r"^[0-9][0-9A-Za-z.+_-]{0,63}$")
_LEVEL = re.compile(r"^SUPPORTED\s*=\s*(\d+)", re.M)
_running: dict | None = None


def _release_number(root: str) -> str | None:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(os.path.join(root, "setup.cfg"))
        version = parser.get("metadata", "version", fallback=None)
    except configparser.Error:
        version = None
    if version is None:
        try:
            with open(os.path.join(root, "PKG-INFO")) as f:
                version = next((line.split(":", 1)[1] for line in f
                                if line.startswith("Version:")), None)
        except OSError:
            return None
    version = (version or "").strip()
    return version if VERSION_PATTERN.match(version) else None


def _commit(root: str) -> str | None:
    try:
        with open(os.path.join(root, "COMMIT")) as f:
            return f.read().strip()[:40] or None
    except OSError:
        pass
    git = os.path.join(root, ".git")
    try:
        with open(os.path.join(git, "HEAD")) as f:
            head = f.read().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            path = os.path.join(git, ref)
            if os.path.exists(path):
                with open(path) as f:
                    return f.read().strip()[:40] or None
            with open(os.path.join(git, "packed-refs")) as f:
                for line in f:
                    if line.rstrip().endswith(" " + ref):
                        return line.split()[0][:40]
            return None
        return head[:40] or None
    except OSError:
        return None


def _level(root: str) -> int | None:
    try:
        with open(os.path.join(root, "engine", "core", "features.py")) as f:
            found = _LEVEL.search(f.read())
    except OSError:
        return None
    return int(found.group(1)) if found else None


def describe(root: str) -> dict:
    """``{version, commit, feature_level, path}`` of the tree at ``root``
    (None for what it does not say)."""
    return {"version": _release_number(root), "commit": _commit(root),
            "feature_level": _level(root), "path": os.path.realpath(root)}


def running() -> dict:
    """What this process runs (read once)."""
    global _running
    if _running is None:
        _running = describe(ROOT)
    return dict(_running)


def label(described: dict) -> str:
    """``0.1.0`` or ``0.1.0 (1a2b3c4d)``: what a person is shown."""
    commit = described.get("commit")
    version = described.get("version") or "unknown"
    return f"{version} ({commit[:8]})" if commit else version
