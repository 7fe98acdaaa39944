"""A release on disk: an archive of peerctl's tree, read, checked and unpacked.

A release is the project's tree as ``git archive`` or an sdist packs it: a
``.tar.gz`` or a ``.zip`` (told apart by content, not name), the tree at its
top or under one top directory (``peerctl-0.2.0/...``), holding
``peerctl.py``, ``setup.cfg`` (or an sdist's ``PKG-INFO``), ``engine/`` (a
namespace package: its ``commandline/__init__.py`` and ``core/features.py``
tell it), ``automations/`` and ``requests/``.  Or the wheel built from it
(``setup.py``): a zip with a ``*.dist-info/WHEEL``, whose release tree is
its ``peerctl_tree/`` directory, with a ``PKG-INFO`` (docs/engine.md, "The
installed tree"); the rest of the wheel (its dist-info) is not unpacked.

Promises:
- :func:`read_release` takes a file (:func:`checked_release` an upload's
  bytes, checked the same) only once the tree in it *starts*: it
  is unpacked into a temporary directory and its own ``peerctl.py version``
  must answer with the version its ``setup.cfg`` says;
- what is not a release is a ``UsageError`` (exit 2) saying in one line
  what is wrong: no such file, over :data:`MAX_BYTES`, not an archive, a
  wheel of something else than peerctl, an unsafe member (an absolute
  path, ``..``, a link leading outside, a device), a missing part of the
  layout; a tree that does not start is a ``Failed`` with the last line of
  its stderr;
- :func:`unpack` never writes outside ``dest``: every member is checked
  before anything is written;
- the version is always the tree's own (``setup.cfg`` or PKG-INFO), never
  the file's name; :func:`named_version` reads what the name implies, so
  that the command line can say when the two disagree;
- nothing here touches etcd.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field

from engine.errors import Failed, UsageError

from .version import describe

__all__ = ["MAX_BYTES", "MAX_BYTES_ENV", "MAX_UNPACKED", "START_TIMEOUT", "WHEEL_TREE",
           "Release", "max_bytes", "read_release", "checked_release", "unpack", "verify_starts",
           "named_version"]

MAX_BYTES = 16 * 1024 * 1024    # the largest archive the cluster carries (5 kept: 80 MiB)
MAX_BYTES_ENV = "PEERCTL_RELEASE_MAX_BYTES"     # for tests: a smaller limit, read at each call
MAX_UNPACKED = 8 * MAX_BYTES        # what an archive may unpack to (a bomb is refused)
START_TIMEOUT = 60                  # seconds its `peerctl.py version` may take

_COMMIT = re.compile(r"[0-9a-f]{40}")
# peerctl-0.2.0.tar.gz, peerctl_0.2.0.zip, peerctl-v0.2.0.tgz: the version a name implies
_NAMED = re.compile(r"peerctl[-_]v?([0-9][0-9A-Za-z.+!-]*?)\.(?:tar\.gz|tgz|zip)\Z")
# peerctl-0.2.0-py3-none-any.whl: a wheel's name is NAME-VERSION-...
_NAMED_WHEEL = re.compile(r"peerctl-([0-9][0-9A-Za-z.+!_]*)-.+\.whl\Z")
_LAYOUT = ("a release holds peerctl.py, setup.cfg or PKG-INFO, engine/, automations/ and "
           "requests/, at its top or under one top directory")
WHEEL_TREE = "peerctl_tree"     # the directory a peerctl wheel installs its tree as (setup.py)
_WHEEL_LAYOUT = (f"a peerctl wheel holds its tree under {WHEEL_TREE}/: peerctl.py, PKG-INFO, "
                 "engine/, automations/ and requests/")


@dataclass(frozen=True)
class Release:
    """A checked release, with its archive's bytes."""
    version: str
    commit: str | None
    feature_level: int
    sha256: str
    bytes: int
    data: bytes = field(repr=False)
    filename: str


class _NotRelease(Exception):
    """Why these bytes are no release (made a UsageError by the caller)."""


@dataclass(frozen=True)
class _Member:
    name: str           # normalised: no "./", no trailing "/"
    kind: str           # file, dir, symlink, hardlink, other
    size: int = 0
    link: str = ""


def max_bytes() -> int:
    """The largest archive accepted: :data:`MAX_BYTES`, or
    ``$PEERCTL_RELEASE_MAX_BYTES`` (tests)."""
    value = os.environ.get(MAX_BYTES_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else MAX_BYTES


def _size(n: int) -> str:
    mib = 1024 * 1024
    return f"{n / mib:g} MiB" if n >= mib and n % (mib // 16) == 0 else f"{n} bytes"


# -- what an archive holds ---------------------------------------------------------

def _normal(name: str) -> str:
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/"):
        raise _NotRelease(f"an absolute path in it: {name}")
    if ".." in parts:
        raise _NotRelease(f"a path leaving its directory in it: {name}")
    return "/".join(parts)


def _tar_members(tar: tarfile.TarFile) -> list[_Member]:
    found = []
    for info in tar.getmembers():
        if info.isfile():
            kind = "file"
        elif info.isdir():
            kind = "dir"
        elif info.issym():
            kind = "symlink"
        elif info.islnk():
            kind = "hardlink"
        else:
            kind = "other"
        found.append(_Member(info.name, kind, info.size, info.linkname))
    return found


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    if info.is_dir():
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "file" if stat.S_IFMT(mode) == 0 or stat.S_ISREG(mode) else "other"


def _zip_members(archive: zipfile.ZipFile) -> list[_Member]:
    found = []
    for info in archive.infolist():
        kind = _zip_kind(info)
        link = archive.read(info).decode(errors="replace") if kind == "symlink" else ""
        found.append(_Member(info.filename, kind, info.file_size, link))
    return found


def _open(data: bytes):
    """``(format, archive)``: a tar.gz or a zip, by content."""
    if data[:2] == b"\x1f\x8b":
        try:
            return "tar.gz", tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise _NotRelease(f"a damaged tar.gz ({exc})") from None
    if zipfile.is_zipfile(io.BytesIO(data)):
        try:
            return "zip", zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, OSError) as exc:
            raise _NotRelease(f"a damaged zip ({exc})") from None
    raise _NotRelease("neither a tar.gz nor a zip archive")


def _members(fmt: str, archive) -> list[_Member]:
    try:
        return _tar_members(archive) if fmt == "tar.gz" else _zip_members(archive)
    except (tarfile.TarError, EOFError, OSError, zlib.error, zipfile.BadZipFile,
            NotImplementedError) as exc:
        raise _NotRelease(f"a damaged {fmt} ({exc})") from None


def _is_wheel(members: list[_Member]) -> bool:
    return any(re.fullmatch(r"[^/]+\.dist-info/WHEEL", m.name) for m in members)


def _checked(members: list[_Member]) -> list[_Member]:
    """The members with normal names, each safe to write; the archive's own
    root entry dropped."""
    checked = []
    for member in members:
        name = _normal(member.name)
        if not name:
            continue
        if member.kind == "other":
            raise _NotRelease(f"a device or fifo in it: {member.name}")
        link = member.link
        if member.kind == "symlink":
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
            if link.startswith("/") or target == ".." or target.startswith("../"):
                raise _NotRelease(f"a link pointing outside it: {member.name} -> {link}")
        elif member.kind == "hardlink":
            try:
                link = _normal(link)
            except _NotRelease:
                raise _NotRelease(f"a link pointing outside it: {member.name} -> {link}") from None
        checked.append(_Member(name, member.kind, member.size, link))
    return checked


def _top(members: list[_Member]) -> str:
    """The top directory to strip (``peerctl-0.2.0/``), or ``""``."""
    if any(m.name == "peerctl.py" for m in members):
        return ""
    tops = {m.name.split("/", 1)[0] for m in members}
    if len(tops) == 1:
        top = tops.pop()
        if not any(m.name == top and m.kind != "dir" for m in members):
            return top + "/"
    raise _NotRelease(f"no peerctl.py at its top or under one top directory ({_LAYOUT})")


def _check_layout(members: list[_Member], top: str, layout: str = _LAYOUT) -> None:
    files, dirs = set(), set()
    for member in members:
        if not member.name.startswith(top):
            continue            # a wheel's dist-info, beside its tree
        name = member.name[len(top):]
        (dirs if member.kind == "dir" else files).add(name)
        parts = name.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    missing = [need for need in ("peerctl.py", "engine/commandline/__init__.py",
                                 "engine/core/features.py") if need not in files]
    if "setup.cfg" not in files and "PKG-INFO" not in files:
        missing.insert(1, "PKG-INFO" if layout == _WHEEL_LAYOUT else "setup.cfg")
    missing += [f"{need}/" for need in ("automations", "requests") if need not in dirs]
    if missing:
        raise _NotRelease(f"no {', '.join(missing)} in it ({layout})")


def _inspect(data: bytes, filename: str = ""):
    """``(format, archive, members, top)`` of a release's bytes, every member
    checked; raises :class:`_NotRelease`."""
    fmt, archive = _open(data)
    members = _members(fmt, archive)
    wheel = filename.endswith(".whl") or fmt == "zip" and _is_wheel(members)
    if wheel and not _is_wheel(members):
        raise _NotRelease("named .whl but no wheel (no *.dist-info/WHEEL in it)")
    members = _checked(members)
    if sum(m.size for m in members if m.kind == "file") > MAX_UNPACKED:
        raise _NotRelease(f"it unpacks to more than {_size(MAX_UNPACKED)}")
    if wheel:
        top = WHEEL_TREE + "/"
        if not any(m.name == top + "peerctl.py" for m in members):
            raise _NotRelease(f"a wheel of something else than peerctl (no {top}peerctl.py "
                              "in it; build one from peerctl's tree: python -m build)")
        _check_layout(members, top, _WHEEL_LAYOUT)
        return fmt, archive, members, top
    top = _top(members)
    _check_layout(members, top)
    return fmt, archive, members, top


# -- unpacking ------------------------------------------------------------------

def _comment_commit(fmt: str, archive) -> str | None:
    """The commit ``git archive`` notes in the archive (a tar's pax comment,
    a zip's comment), if any."""
    if fmt == "tar.gz":
        comment = archive.pax_headers.get("comment", "")
    else:
        comment = archive.comment.decode(errors="replace")
    comment = comment.strip()
    return comment if _COMMIT.fullmatch(comment) else None


def _inside(dest: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == dest or real.startswith(dest + os.sep)


def _unpack_tar(archive: tarfile.TarFile, top: str, dest: str) -> None:
    """Write the members under ``top`` by hand, as tarfile's "data" filter
    would (which Debian 12's Python 3.11.2 lacks): files, directories and
    links inside ``dest`` only, owned by whoever unpacks, no device, FIFO
    or setuid bit."""
    written: dict[str, str] = {}
    for info in archive.getmembers():
        name = _normal(info.name)
        if not name.startswith(top) or name == top.rstrip("/"):
            continue
        relative = name[len(top):]
        path = os.path.join(dest, relative)
        if not _inside(dest, os.path.dirname(path)):
            raise _NotRelease(f"a member written outside it through a link: {info.name}")
        if info.isdir():
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if info.issym():
            os.symlink(info.linkname, path)
            if not _inside(dest, path):         # outside, directly or through another link
                os.unlink(path)
                raise _NotRelease(f"a link pointing outside it: {info.name} -> {info.linkname}")
            continue
        if info.islnk():
            target = _normal(info.linkname)
            if not target.startswith(top) or target[len(top):] not in written:
                raise _NotRelease(f"a link pointing outside it: {info.name} -> {info.linkname}")
            shutil.copyfile(written[target[len(top):]], path)
            os.chmod(path, os.stat(written[target[len(top):]]).st_mode & 0o755)
            continue
        if not info.isfile():
            raise _NotRelease(f"an unsafe member in it (not a file, directory or link: "
                              f"{info.name})")
        if not _inside(dest, path):
            raise _NotRelease(f"a member written outside it through a link: {info.name}")
        with archive.extractfile(info) as source, open(path, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
        os.chmod(path, (info.mode & 0o755) | 0o644)
        written[relative] = path


def _unpack_zip(archive: zipfile.ZipFile, top: str, dest: str) -> None:
    for info in archive.infolist():
        name = _normal(info.filename)
        if not name.startswith(top) or name == top.rstrip("/"):
            continue
        path = os.path.join(dest, name[len(top):])
        if not _inside(dest, os.path.dirname(path)):
            raise _NotRelease(f"a member written outside it through a link: {info.filename}")
        kind = _zip_kind(info)
        if kind == "dir":
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if kind == "symlink":
            os.symlink(archive.read(info).decode(), path)
            if not _inside(dest, path):         # through another link: outside after all
                os.unlink(path)
                raise _NotRelease(f"a link pointing outside it: {info.filename}")
            continue
        if not _inside(dest, path):
            raise _NotRelease(f"a member written outside it through a link: {info.filename}")
        with archive.open(info) as source, open(path, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
        os.chmod(path, ((info.external_attr >> 16) & 0o755) | 0o644)


def unpack(data: bytes, dest: str) -> None:
    """Write the release ``data`` holds into ``dest`` (an existing
    directory), its one top directory stripped; a ``COMMIT`` file is added
    when the archive notes its commit (``git archive``) and carries none.
    Not a release: ``UsageError`` before anything is written (but for a
    path that only links could lead outside, found while writing: the
    caller removes ``dest``)."""
    dest = os.path.realpath(dest)
    try:
        fmt, archive, members, top = _inspect(data)
        with archive:
            (_unpack_tar if fmt == "tar.gz" else _unpack_zip)(archive, top, dest)
            commit = _comment_commit(fmt, archive)
    except _NotRelease as exc:
        raise UsageError(f"not a release: {exc}") from None
    except (tarfile.TarError, EOFError, zlib.error, zipfile.BadZipFile) as exc:
        raise UsageError(f"not a release: a damaged archive ({exc})") from None
    if commit and not any(m.name == top + "COMMIT" for m in members):
        with open(os.path.join(dest, "COMMIT"), "w") as f:
            f.write(commit + "\n")


# -- does it start ------------------------------------------------------------------

def _bare_environment() -> dict:
    """This process's environment without peerctl's settings: a release's
    check must not reach a cluster, nor fire a test's failpoints."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith("PEERCTL_")}


def verify_starts(root: str) -> dict:
    """Run the tree at ``root``'s own ``peerctl.py version``: its
    ``{version, commit, feature_level}``.  ``Failed`` when it does not start
    or answers another version than its ``setup.cfg`` (or PKG-INFO) says."""
    described = describe(root)
    name = described["version"] or os.path.basename(root)
    command = [sys.executable, os.path.join(root, "peerctl.py"), "--format", "json", "version"]
    try:
        done = subprocess.run(command, cwd=root, env=_bare_environment(), capture_output=True,
                              text=True, timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise Failed(f"release {name} does not start: its peerctl.py version did not "
                     f"answer within {START_TIMEOUT} s") from None
    except OSError as exc:
        raise Failed(f"release {name} does not start: {exc}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit status {done.returncode}, nothing said"
        raise Failed(f"release {name} does not start: {why}")
    try:
        answer = json.loads(done.stdout)
        said = {key: answer[key] for key in ("version", "commit", "feature_level")}
    except (ValueError, TypeError, KeyError):
        raise Failed(f"release {name} does not start: its peerctl.py version printed no "
                     f"{{version, commit, feature_level}} ({done.stdout.strip()[:60]!r})") from None
    if said["version"] != described["version"]:
        raise Failed(f"release {name} does not start as itself: its peerctl.py version "
                     f"says {said['version']!r}")
    if not isinstance(said["feature_level"], int) or isinstance(said["feature_level"], bool):
        raise Failed(f"release {name} does not start: its peerctl.py version gives no "
                     f"feature level ({said['feature_level']!r})")
    return said


# -- reading a file --------------------------------------------------------------

def read_archive(path: str) -> bytes:
    """The bytes of the archive at ``path``: a regular file within the size a
    release may be (each failure one line naming the file)."""
    limit = max_bytes()
    try:
        info = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror.lower()}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path}: not a file")
    if info.st_size > limit:
        raise UsageError(f"{path}: {_size(info.st_size)}, over the {_size(limit)} a "
                         "release may be")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror.lower()}") from None
    if len(data) > limit:
        raise UsageError(f"{path}: over the {_size(limit)} a release may be")
    return data


def named_version(filename: str) -> str | None:
    """The version an archive's file name implies (``peerctl-0.2.0.tar.gz``,
    ``peerctl-0.2.0-py3-none-any.whl``: ``0.2.0``), or None when its name
    says none.  A release is stored under the version its ``setup.cfg`` (or
    PKG-INFO) says, whatever its name; this is for saying so when the two
    disagree."""
    found = _NAMED.search(os.path.basename(filename)) or \
        _NAMED_WHEEL.search(os.path.basename(filename))
    return found.group(1) if found else None


def read_release(path: str) -> Release:
    """The release in the file at ``path``, checked: its layout, and that
    it starts (see the module's promises)."""
    return checked_release(read_archive(path), path)


def checked_release(data: bytes, path: str) -> Release:
    """The release whose archive is ``data``, checked as :func:`read_release`
    checks a file's; ``path`` names it in messages (a file's path, or what
    brought the bytes: ``request body``) and its base name tells a wheel."""
    limit = max_bytes()
    if len(data) > limit:
        raise UsageError(f"{path}: {_size(len(data))}, over the {_size(limit)} a "
                         "release may be")
    try:
        fmt, archive, _, _ = _inspect(data, os.path.basename(path))
        archive.close()
    except _NotRelease as exc:
        raise UsageError(f"{path}: not a release: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="peerctl-release-") as tmp:
        try:
            unpack(data, tmp)
        except UsageError as exc:
            raise UsageError(f"{path}: {exc}") from None
        described = describe(tmp)
        if described["version"] is None:
            raise UsageError(f"{path}: not a release: its setup.cfg (or PKG-INFO) names no "
                             "version")
        if described["feature_level"] is None:
            raise UsageError(f"{path}: not a release: its engine/core/features.py declares "
                             "no SUPPORTED level")
        said = verify_starts(tmp)
    return Release(said["version"], said["commit"], said["feature_level"],
                   hashlib.sha256(data).hexdigest(), len(data), data, os.path.basename(path))
