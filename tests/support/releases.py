"""Releases of peerctl built from the working tree, as ``git archive``
would pack them: for ``code add``, ``upgrade`` and their tests.

    path = build_release(tmp_path, "0.2.0")                  # peerctl-0.2.0.tar.gz
    path = build_release(tmp_path, "0.2.1", fmt="zip", top=False,
                         files={"peerctl.py": "raise SystemExit('boom')"})
"""
from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
import zipfile

from tests.support import ROOT

__all__ = ["TREE", "build_release"]

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
