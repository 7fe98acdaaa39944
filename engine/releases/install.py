"""Releases installed on a host: ``<state_dir>/releases/<version>/``, one
directory each, unpacked from what the cluster carries.

Promises:
- a directory named for a version is whole: it is unpacked and checked
  (its own ``peerctl.py version`` answers) under a ``.partial-<version>-<pid>``
  name, its ``.installed`` file (the archive's sha256) written, and only then
  renamed into place; a crash leaves a partial directory, which the next
  install removes once its process is gone;
- installing what is installed already is one read of the meta and a
  compare of the sha256;
- the archive is verified against its sha256 before anything is unpacked
  (:func:`engine.releases.catalog.fetch`): a corrupt chunk installs nothing;
- the release a host runs now (``current.json``) is never removed.
"""
from __future__ import annotations

import os
import shutil

from engine.core import failpoints
from engine.errors import Failed, Refused

from . import catalog
from .archive import unpack, verify_starts
from .current import read_current, releases_dir

__all__ = ["MARK", "install", "installed", "remove"]

MARK = ".installed"         # in an installed release's directory: its archive's sha256
_PARTIAL = ".partial-"


def _mark(path: str) -> str | None:
    try:
        with open(os.path.join(path, MARK)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(root: str) -> None:
    """Remove the partial directories whose process is gone."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(_PARTIAL):
            continue
        pid = name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def install(store, state_dir: str, version: str) -> str:
    """Install release ``version`` from the cluster into
    ``<state_dir>/releases/<version>/`` (its path); at once when it is
    installed already.  ``Failed`` when its chunks do not give its sha256
    or its tree does not start; nothing is left installed then."""
    meta = catalog.get(store, version)
    root = releases_dir(state_dir)
    target = os.path.join(root, version)
    have = _mark(target)
    if have == meta["sha256"]:
        return target
    if os.path.exists(target):
        raise Refused(f"{target} holds another release {version} (sha256 {(have or '?')[:12]}..., "
                      f"the cluster's is {meta['sha256'][:12]}...): remove it first")
    os.makedirs(root, exist_ok=True)
    _sweep(root)
    data = catalog.fetch(store, version)        # its sha256 checked
    partial = os.path.join(root, f"{_PARTIAL}{version}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        os.makedirs(partial)
        unpack(data, partial)
        failpoints.crash("release_unpacked")
        said = verify_starts(partial)
        if said["version"] != version:
            raise Failed(f"release {version} starts as {said['version']}: not installed")
        with open(os.path.join(partial, MARK), "w") as f:
            f.write(meta["sha256"] + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(partial, target)
        except OSError:
            if _mark(target) != meta["sha256"]:     # not another install of the same
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def installed(state_dir: str) -> list[str]:
    """The versions installed under ``state_dir``, in natural order."""
    from engine.natural import natural_key
    root = releases_dir(state_dir)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted((name for name in names if not name.startswith(".")
                   and _mark(os.path.join(root, name))), key=natural_key)


def remove(state_dir: str, version: str) -> bool:
    """Remove installed release ``version`` (True), if it is there; refused
    for the one the host runs now."""
    catalog.check_version(version)
    root = releases_dir(state_dir)
    target = os.path.join(root, version)
    if not os.path.isdir(target):
        return False
    chosen = read_current(state_dir)
    if chosen and os.path.realpath(chosen["path"]) == os.path.realpath(target):
        raise Refused(f"release {version} is what this host runs now: not removed")
    doomed = os.path.join(root, f"{_PARTIAL}{version}-{os.getpid()}")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(target, doomed)        # whole or gone, even if the removal is cut short
    shutil.rmtree(doomed, ignore_errors=True)
    return True
