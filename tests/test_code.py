"""Releases the cluster carries, through the real command line on a real
etcd: ``code add``, ``code list``, ``code delete`` and ``version``.  Every
bad input is one line and an exit code, with nothing written under
``code/``; a corrupt chunk installs nothing; an add killed between chunks is
finished by the next add, or removed with every chunk by delete."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest

from engine.core import failpoints, keys
from engine.core.features import SUPPORTED
from engine.errors import Failed
from engine.releases import archive as archive_module
from engine.releases import catalog
from engine.releases.install import MARK, install, installed, remove
from engine.releases.version import ROOT, describe, label
from tests.support.releases import build_packages, build_release

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
ROW = {"version", "commit", "feature_level", "sha256", "bytes", "state", "added", "running_on"}


def code_keys(store) -> dict:
    """Everything under ``code/``, as stored."""
    return {kv.key: kv.value for kv in store.range("code/")[0]}


def written(store) -> dict:
    """Every key of the cluster with its last write's revision: equal
    before and after, nothing was written (other tests' clusters share the
    etcd, so its revision alone would not say)."""
    return {kv.key: kv.mod_revision for kv in store.range("")[0]}


def one_line(done, code: int) -> str:
    """The one line a refused command says, after checking its exit code."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("peerctl: "), done.stderr
    return lines[0]


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def chunks(store, version: str) -> list[bytes]:
    return [kv.value for kv in store.range(keys.release_chunk(version))[0]]


def test_a_release_is_added_listed_and_deleted(cluster, store, tmp_path):
    path = build_release(tmp_path, "0.2.0")
    added = cluster.cli_json("code", "add", path)
    assert added == {"version": "0.2.0", "sha256": sha256(path), "bytes": os.path.getsize(path),
                     "commit": "test-0.2.0", "feature_level": SUPPORTED, "state": "ready",
                     "already": False}
    with open(path, "rb") as f:
        assert b"".join(chunks(store, "0.2.0")) == f.read()

    [row] = cluster.cli_json("code", "list")
    assert set(row) == ROW and ISO.fullmatch(row["added"])
    assert {k: row[k] for k in ("version", "sha256", "state", "running_on")} == {
        "version": "0.2.0", "sha256": added["sha256"], "state": "ready", "running_on": []}
    table = cluster.cli("code", "list")
    assert table.returncode == 0 and re.search(rf"0\.2\.0\s+test-0\.2\s+{SUPPORTED}\s+\S+\s+ready",
                                               table.stdout), table.stdout

    assert cluster.cli_json("code", "delete", "0.2.0") == {"version": "0.2.0", "deleted": True}
    assert cluster.cli_json("code", "list") == []
    assert code_keys(store) == {}


def test_the_wheel_built_from_the_tree_is_a_release(cluster, store, tmp_path):
    """``python -m build``'s wheel is added like a source archive: stored
    under the version its tree's PKG-INFO says, with the commit it was built
    from, and installed on a host as the tree under its peerctl_tree/."""
    built = build_packages(tmp_path / "packages", "0.3.0")
    done = cluster.cli("--format", "json", "code", "add", built["wheel"])
    assert done.returncode == 0 and done.stderr == "", done.stderr    # its name agrees
    added = json.loads(done.stdout)
    assert added == {"version": "0.3.0", "sha256": sha256(built["wheel"]),
                     "bytes": os.path.getsize(built["wheel"]), "commit": built["commit"],
                     "feature_level": SUPPORTED, "state": "ready", "already": False}
    [row] = cluster.cli_json("code", "list")
    assert (row["version"], row["commit"], row["state"]) == ("0.3.0", built["commit"], "ready")
    renamed = str(tmp_path / "peerctl-9.9.9-py3-none-any.whl")
    os.link(built["wheel"], renamed)
    again = cluster.cli("--format", "json", "code", "add", renamed)
    assert json.loads(again.stdout)["already"] and \
        "peerctl-9.9.9-py3-none-any.whl is named for version 9.9.9" in again.stderr, again.stderr

    where = install(store, str(tmp_path / "state"), "0.3.0")
    assert describe(where)["version"] == "0.3.0" and describe(where)["commit"] == built["commit"]
    for part in ("peerctl.py", "engine/core/features.py", "automations/vms.py", "requests/vm.py",
                 "conf/peerctl.conf"):
        assert os.path.isfile(os.path.join(where, part)), part
    assert not any(name.endswith(".dist-info") for name in os.listdir(where))
    assert not os.path.exists(os.path.join(where, "requests", "__init__.py"))


def test_the_same_release_again_changes_nothing_and_another_with_its_version_is_refused(
        cluster, store, tmp_path):
    path = build_release(tmp_path, "0.2.0")
    first = cluster.cli_json("code", "add", path)
    before = written(store)
    again = cluster.cli_json("code", "add", path)
    assert again == {**first, "already": True}
    assert written(store) == before

    (tmp_path / "other").mkdir()
    other = build_release(tmp_path / "other", "0.2.0", files={"README.md": "another tree\n"})
    line = one_line(cluster.cli("code", "add", other), 1)
    assert "release 0.2.0 is already stored with another sha256" in line
    assert "delete it first" in line and written(store) == before

    flat_zip = build_release(tmp_path, "0.10.0", fmt="zip", top=False)
    assert cluster.cli_json("code", "add", flat_zip)["commit"] == "test-0.10.0"
    assert [row["version"] for row in cluster.cli_json("code", "list")] == ["0.2.0", "0.10.0"]


def test_a_file_named_for_another_version_is_stored_as_its_own_with_a_warning(
        cluster, store, tmp_path):
    """Its setup.cfg says 0.1.0, its name 0.2.0: stored as 0.1.0, and said so."""
    built = build_release(tmp_path, "0.1.0")
    path = os.path.join(str(tmp_path), "peerctl-0.2.0.tar.gz")
    os.rename(built, path)
    done = cluster.cli("--format", "json", "code", "add", path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version"] == "0.1.0"
    assert done.stderr.splitlines() == [
        "peerctl: warning: peerctl-0.2.0.tar.gz is named for version 0.2.0, but its "
        "setup.cfg says 0.1.0: stored as 0.1.0"]
    assert [row["version"] for row in cluster.cli_json("code", "list")] == ["0.1.0"]
    # a name that agrees, or says no version, is stored without a word
    quiet = cluster.cli("code", "add", build_release(tmp_path, "0.3.0"))
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    plain = os.path.join(str(tmp_path), "release.tar.gz")
    os.rename(build_release(tmp_path, "0.4.0"), plain)
    assert cluster.cli("code", "add", plain).stderr == ""


def test_past_the_most_releases_kept_the_next_is_refused(cluster, store, tmp_path):
    cluster.cli_json("code", "add", build_release(tmp_path, "0.2.0"))
    meta = store.get(keys.release("0.2.0")).value
    for version in ("0.3.0", "0.4.0", "0.5.0", "0.6.0"):
        store.put(keys.release(version), {**meta, "version": version})
    before = code_keys(store)

    line = one_line(cluster.cli("code", "add", build_release(tmp_path, "0.7.0")), 1)
    assert line == ("peerctl: 5 releases stored, the most kept: delete one "
                    "(code delete VERSION)")
    assert code_keys(store) == before
    assert cluster.cli_json("code", "add", build_release(tmp_path, "0.2.0"))["already"]

    cluster.cli_json("code", "delete", "0.3.0")
    assert cluster.cli_json("code", "add", build_release(tmp_path, "0.7.0"))["state"] == "ready"
    assert len(cluster.cli_json("code", "list")) == catalog.MAX_RELEASES


def test_a_meta_of_the_wrong_shape_is_skipped_with_one_warning(cluster, store, tmp_path):
    cluster.cli_json("code", "add", build_release(tmp_path, "0.2.0"))
    store.put(keys.release("0.9.0"), {"version": "0.9.0", "state": "ready"})
    done = cluster.cli("--format", "json", "code", "list")
    assert done.returncode == 0, done.stderr
    assert [row["version"] for row in json.loads(done.stdout)] == ["0.2.0"]
    assert done.stderr.strip().splitlines() == [
        "peerctl: warning: skipped unreadable key code/releases/0.9.0: not a release: "
        "no 'commit'"]


# -- bad input: one line, nothing written -----------------------------------------------

def _tar(path, members: dict) -> str:
    """A tar.gz of ``members``: name -> text, or ("link", target)."""
    with tarfile.open(path, "w:gz") as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            if isinstance(content, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, content[1]
                archive.addfile(info)
                continue
            data = content.encode()
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return str(path)


def text_file(tmp_path):
    (tmp_path / "notes.tar.gz").write_text("these are notes, not a release\n")
    return str(tmp_path / "notes.tar.gz"), {}


def no_engine(tmp_path):
    return _tar(tmp_path / "peerctl.tar.gz", {
        "peerctl-0.2.0/peerctl.py": "", "peerctl-0.2.0/setup.cfg": "[metadata]\nversion = 0.2.0\n",
        "peerctl-0.2.0/automations/vms.py": "", "peerctl-0.2.0/requests/vm.py": ""}), {}


def _wheel(path, members: dict) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return str(path)


def foreign_wheel(tmp_path):
    """A wheel of another project (this tree at its top, not under peerctl_tree/)."""
    return _wheel(tmp_path / "peerctl-0.2.0-py3-none-any.whl", {
        "peerctl.py": "", "engine/core/features.py": "SUPPORTED = 1\n",
        "peerctl-0.2.0.dist-info/WHEEL": "Wheel-Version: 1.0\n"}), {}


def wheel_without_automations(tmp_path):
    return _wheel(tmp_path / "peerctl-0.2.0-py3-none-any.whl", {
        "peerctl_tree/peerctl.py": "", "peerctl_tree/PKG-INFO": "Version: 0.2.0\n",
        "peerctl_tree/engine/commandline/__init__.py": "",
        "peerctl_tree/engine/core/features.py": "SUPPORTED = 1\n",
        "peerctl_tree/requests/vm.py": "",
        "peerctl-0.2.0.dist-info/WHEEL": "Wheel-Version: 1.0\n"}), {}


def named_wheel(tmp_path):
    """A source zip named like a wheel."""
    path = str(tmp_path / "peerctl-0.2.0-py3-none-any.whl")
    os.rename(build_release(tmp_path, "0.2.0", fmt="zip"), path)
    return path, {}


def leaves_its_directory(tmp_path):
    return _tar(tmp_path / "peerctl.tar.gz", {"peerctl-0.2.0/peerctl.py": "",
                                              "peerctl-0.2.0/../x": "escaped"}), {}


def links_outside(tmp_path):
    return _tar(tmp_path / "peerctl.tar.gz", {"peerctl-0.2.0/peerctl.py": "",
                                              "peerctl-0.2.0/x": ("link", "../../etc/passwd")}), {}


def does_not_start(tmp_path):
    return build_release(tmp_path, "0.2.0", files={"peerctl.py": "raise SystemExit('boom')"}), {}


def over_the_limit(tmp_path):
    return build_release(tmp_path, "0.2.0"), {"PEERCTL_RELEASE_MAX_BYTES": "100000"}


def missing(tmp_path):
    return str(tmp_path / "nosuch.tar.gz"), {}


@pytest.mark.parametrize("make, code, words", [
    (text_file, 2, "not a release: neither a tar.gz nor a zip archive"),
    (no_engine, 2, "not a release: no engine/commandline/__init__.py, engine/core/features.py"),
    (foreign_wheel, 2, "not a release: a wheel of something else than peerctl (no "
                       "peerctl_tree/peerctl.py in it"),
    (wheel_without_automations, 2, "not a release: no automations/ in it (a peerctl wheel "
                                   "holds its tree under peerctl_tree/"),
    (named_wheel, 2, "not a release: named .whl but no wheel (no *.dist-info/WHEEL in it)"),
    (leaves_its_directory, 2, "a path leaving its directory in it: peerctl-0.2.0/../x"),
    (links_outside, 2, "a link pointing outside it: peerctl-0.2.0/x -> ../../etc/passwd"),
    (does_not_start, 1, "release 0.2.0 does not start: boom"),
    (over_the_limit, 2, "over the 100000 bytes a release may be"),
    (missing, 2, "no such file or directory"),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_what_is_not_a_release_is_one_line_and_nothing_is_written(cluster, store, tmp_path,
                                                                   make, code, words):
    path, env = make(tmp_path)
    line = one_line(cluster.cli("code", "add", path, env=env), code)
    assert words in line and (code == 1 or path in line), line
    assert code_keys(store) == {}


def test_a_tar_release_is_unpacked_as_data_whoever_made_it(tmp_path):
    """Unpacked by hand (Debian 12's Python 3.11.2 has no tar filter): a
    setuid, world-writable file owned by someone else arrives as a plain
    file of whoever unpacks; a hard link inside the tree is a copy."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in (("p-0.2.0/peerctl.py", b"print('hi')\n"),
                           ("p-0.2.0/setup.cfg", b"[metadata]\nversion = 0.2.0\n"),
                           ("p-0.2.0/engine/commandline/__init__.py", b""),
                           ("p-0.2.0/engine/core/features.py", b"SUPPORTED = 1\n"),
                           ("p-0.2.0/automations/vms.py", b""),
                           ("p-0.2.0/requests/vm.py", b"")):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o6777, 4321, 4321
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("p-0.2.0/again.py")
        link.type, link.linkname = tarfile.LNKTYPE, "p-0.2.0/peerctl.py"
        archive.addfile(link)
    dest = tmp_path / "tree"
    dest.mkdir()
    archive_module.unpack(buffer.getvalue(), str(dest))
    written = os.stat(dest / "peerctl.py")
    assert (written.st_mode & 0o7777, written.st_uid) == (0o755, os.getuid())
    assert (dest / "again.py").read_text() == "print('hi')\n"
    assert not os.path.samefile(dest / "again.py", dest / "peerctl.py")


def test_deleting_an_unknown_or_malformed_version_is_one_line(cluster, store):
    assert one_line(cluster.cli("code", "delete", "9.9.9"), 1) == \
        "peerctl: no release '9.9.9': code list shows the stored ones"
    assert "bad release version '../x'" in one_line(cluster.cli("code", "delete", "../x"), 2)


# -- installing on a host ------------------------------------------------------------------

def test_a_release_installs_once_into_its_own_directory(cluster, store, tmp_path):
    path = build_release(tmp_path, "0.2.0")
    cluster.cli_json("code", "add", path)
    state = str(tmp_path / "state")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    leftover = os.path.join(state, "releases", f".partial-0.2.0-{dead}")
    os.makedirs(leftover)

    where = install(store, state, "0.2.0")
    assert where == os.path.join(state, "releases", "0.2.0")
    assert not os.path.exists(leftover)
    with open(os.path.join(where, MARK)) as f:
        assert f.read().strip() == sha256(path)
    assert describe(where)["version"] == "0.2.0" and describe(where)["commit"] == "test-0.2.0"
    marked = os.stat(os.path.join(where, MARK)).st_mtime_ns
    assert install(store, state, "0.2.0") == where
    assert os.stat(os.path.join(where, MARK)).st_mtime_ns == marked
    assert installed(state) == ["0.2.0"]

    assert remove(state, "0.2.0") and installed(state) == []
    assert sorted(os.listdir(os.path.join(state, "releases"))) == []


def test_a_corrupt_chunk_installs_nothing(cluster, store, tmp_path):
    cluster.cli_json("code", "add", build_release(tmp_path, "0.2.0"))
    key = keys.release_chunk("0.2.0", 0)
    good = store.get(key).value
    store.put(key, bytes(b ^ 0xFF for b in good[:64]) + good[64:])     # same size, other bytes
    state = str(tmp_path / "state")

    with pytest.raises(Failed) as failed:
        install(store, state, "0.2.0")
    assert re.fullmatch(r"release 0\.2\.0 is corrupt in etcd: sha256 [0-9a-f]{12}\.\.\. "
                        r"expected, [0-9a-f]{12}\.\.\. read \(code delete it and add it again\)",
                        str(failed.value)), str(failed.value)
    assert os.listdir(os.path.join(state, "releases")) == []


# -- crashes -------------------------------------------------------------------------------

def ballast() -> str:
    """Text that does not compress much: a release of several chunks."""
    return base64.b64encode(os.urandom(900_000)).decode()


def killed_add(cluster, tmp_path, path) -> None:
    armed = str(tmp_path / "failpoints")
    failpoints.arm(armed, ["release_chunk_written"])
    done = cluster.cli("code", "add", path, env={failpoints.ENV: armed})
    assert done.returncode == -9, (done.returncode, done.stderr)
    assert [point for point, _, _ in failpoints.fired(armed)][-1] == "release_chunk_written"


def test_an_add_killed_between_chunks_is_finished_by_the_next_add_or_deleted(
        cluster, store, tmp_path):
    path = build_release(tmp_path, "0.2.0", files={"bench/ballast.txt": ballast()})
    killed_add(cluster, tmp_path, path)
    [row] = cluster.cli_json("code", "list")
    meta = store.get(keys.release("0.2.0")).value
    assert row["state"] == "uploading" and meta["chunks"] >= 3
    assert len(chunks(store, "0.2.0")) == 1

    assert cluster.cli_json("code", "add", path)["state"] == "ready"
    with open(path, "rb") as f:
        assert catalog.fetch(store, "0.2.0") == f.read()

    other = build_release(tmp_path, "0.3.0", files={"bench/ballast.txt": ballast()})
    killed_add(cluster, tmp_path, other)
    assert json.loads(cluster.cli("--format", "json", "code", "list").stdout)[1]["state"] \
        == "uploading"
    assert cluster.cli_json("code", "delete", "0.3.0") == {"version": "0.3.0", "deleted": True}
    assert chunks(store, "0.3.0") == [] and store.get(keys.release("0.3.0")) is None
    assert len(chunks(store, "0.2.0")) == meta["chunks"]


def test_version_answers_without_etcd_or_settings(cluster):
    here = describe(ROOT)
    done = cluster.cli("version", env={"PEERCTL_ETCD": "http://127.0.0.1:9"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"peerctl {label(here)}, feature level {SUPPORTED}"
    assert cluster.cli_json("version", env={"PEERCTL_ETCD": "http://127.0.0.1:9"}) == {
        "version": here["version"], "commit": here["commit"], "feature_level": SUPPORTED}
