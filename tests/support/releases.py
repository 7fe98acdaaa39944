"""Releases of peerctl built from the working tree, as ``git archive``
would pack them, or as the packaging builds them (setup.py): for ``code
add``, ``upgrade``, the installed package and their tests.

    path = build_release(tmp_path, "0.2.0")                  # peerctl-0.2.0.tar.gz
    path = build_release(tmp_path, "0.2.1", fmt="zip", top=False,
                         files={"peerctl.py": "raise SystemExit('boom')"})
    built = build_packages(tmp_path, "0.2.0")   # {sdist, wheel, commit, tree}
"""
from __future__ import annotations

import glob
import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

from tests.support import ROOT

__all__ = ["TREE", "PACKAGED", "build_release", "build_packages"]

# what `python -m build` needs of a checkout (MANIFEST.in, setup.py)
PACKAGED = ("peerctl.py", "setup.py", "setup.cfg", "MANIFEST.in", "README.md", "engine",
            "automations", "requests", "conf", "peerctl_tree")

TREE = ("peerctl.py", "setup.cfg", "README.md", "engine", "automations", "requests", "conf")


def _tree() -> dict[str, str]:
    """``{relpath: source path}`` of the working tree's release files."""
    found = {}
    for part in TREE:
        path = os.path.join(ROOT, part)
        if os.path.isfile(path):
            found[part] = path
            continue
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not name.endswith((".pyc", ".pyo")):
                    full = os.path.join(folder, name)
                    found[os.path.relpath(full, ROOT)] = full
    return found


def _with_version(setup_cfg: str, version: str) -> str:
    return re.sub(r"(?m)^version\s*=.*$", f"version = {version}", setup_cfg, count=1)


def build_release(dest_dir, version: str, *, files: dict[str, str] | None = None,
                  fmt: str = "tar.gz", top: bool = True) -> str:
    """Pack the working tree as release ``version`` into ``dest_dir``: its
    path (``peerctl-<version>.tar.gz`` or ``.zip``).  ``setup.cfg`` says
    ``version``, a ``COMMIT`` file says ``test-<version>``, and ``files``
    (relpath -> text) replace or add files; ``top``: under
    ``peerctl-<version>/``, else at the archive's top.  The same tree gives
    the same bytes (no build time inside)."""
    with open(os.path.join(ROOT, "setup.cfg")) as f:
        written = {"setup.cfg": _with_version(f.read(), version), "COMMIT": f"test-{version}\n"}
    written.update(files or {})
    copied = {rel: path for rel, path in _tree().items() if rel not in written}
    prefix = f"peerctl-{version}/" if top else ""
    os.makedirs(str(dest_dir), exist_ok=True)
    path = os.path.join(str(dest_dir), f"peerctl-{version}.{'zip' if fmt == 'zip' else 'tar.gz'}")
    if fmt == "zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
            for rel, source in copied.items():
                archive.write(source, prefix + rel)
            for rel, text in written.items():
                info = zipfile.ZipInfo(prefix + rel, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                archive.writestr(info, text, zipfile.ZIP_DEFLATED)
        return path
    if fmt != "tar.gz":
        raise ValueError(f"fmt {fmt!r}: tar.gz or zip")
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6,
                                                 mtime=0) as packed, \
            tarfile.open(fileobj=packed, mode="w") as archive:
        for rel, source in copied.items():
            archive.add(source, prefix + rel, recursive=False)
        for rel, text in written.items():
            data = text.encode()
            info = tarfile.TarInfo(prefix + rel)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return path


def _git(tree: str, *args) -> str:
    done = subprocess.run(["git", "-C", tree, "-c", "user.name=tests", "-c",
                           "user.email=tests@localhost", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def build_packages(dest_dir, version: str, *, files: dict[str, str] | None = None) -> dict:
    """Build the working tree as the sdist and the wheel of ``version``, as
    ``python -m build`` does (the wheel built from the sdist): ``{sdist,
    wheel, commit, tree}``.  The tree is copied first (``tree``), with
    ``setup.cfg`` saying ``version`` and ``files`` (relpath -> text)
    written, and committed to a fresh git repository there (``commit``),
    so that the packages name the commit they were built from."""
    tree = os.path.join(str(dest_dir), "tree")
    os.makedirs(tree)
    for part in PACKAGED + tuple(os.path.basename(p) for p in
                                 glob.glob(os.path.join(ROOT, "requirements*.txt"))):
        source = os.path.join(ROOT, part)
        if os.path.isfile(source):
            shutil.copy2(source, os.path.join(tree, part))
        else:
            shutil.copytree(source, os.path.join(tree, part),
                            ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"))
    with open(os.path.join(tree, "setup.cfg")) as f:
        written = {"setup.cfg": _with_version(f.read(), version), **(files or {})}
    for rel, text in written.items():
        with open(os.path.join(tree, rel), "w") as f:
            f.write(text)
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", f"peerctl {version}")
    commit = _git(tree, "rev-parse", "HEAD")
    dist = os.path.join(str(dest_dir), "dist")
    # --no-isolation: setuptools and wheel of this python, nothing downloaded
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, tree],
                   capture_output=True, text=True, check=True)
    return {"sdist": os.path.join(dist, f"peerctl-{version}.tar.gz"),
            "wheel": os.path.join(dist, f"peerctl-{version}-py3-none-any.whl"),
            "commit": commit, "tree": tree}
