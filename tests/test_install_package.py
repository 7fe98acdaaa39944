"""peerctl installed as real software: the tree built as an sdist and a
wheel (``python -m build``, setup.py), each installed with pip into a fresh
virtualenv, runs everything the checkout runs, from another directory.

The packages are built from a copy of this tree at version 9.0.0 (not the
checkout's), committed to a git repository of its own: what
``peerctl version`` and the peer's row in ``hostlist`` say proves the
installed tree runs, not this checkout.  The venvs see this python's
site-packages (every dependency, libvirt-python included), so only peerctl
itself is installed, with no index and no build isolation: nothing is
downloaded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from engine.core import api
from engine.core.features import SUPPORTED
from engine.releases.version import describe
from tests.support import ROOT, wait_for, wait_until
from tests.support.releases import build_packages

VERSION = "9.0.0"
SMALL_VM = "VCPU:1,MEMORY_MB:64,DISK_GB:1"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """``{sdist, wheel, commit, tree}``: the packages of this tree at 9.0.0."""
    assert describe(ROOT)["version"] != VERSION
    return build_packages(tmp_path_factory.mktemp("packages"), VERSION)


def installed(venv, package: str) -> str:
    """A fresh virtualenv at ``venv`` with ``package`` (a wheel or an
    sdist) pip-installed: its ``peerctl`` command."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, capture_output=True)
    python = os.path.join(str(venv), "bin", "python")
    done = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--no-build-isolation", package], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return os.path.join(str(venv), "bin", "peerctl")


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_the_wheel_built_from_the_sdist_holds_the_whole_tree(built):
    """Every file of the tree's release parts reaches the wheel, through the
    sdist it is built from (MANIFEST.in), under peerctl_tree/ only, beside
    the launcher, PKG-INFO and COMMIT; nothing else lands in site-packages."""
    tree = set()
    for part in ("peerctl.py", "engine", "automations", "requests", "conf"):
        path = os.path.join(built["tree"], part)
        if os.path.isfile(path):
            tree.add(part)
        for folder, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            tree.update(os.path.relpath(os.path.join(folder, name), built["tree"])
                        for name in files)
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = wheel.namelist()
        commit = wheel.read("peerctl_tree/COMMIT").decode().strip()
        pkg_info = wheel.read("peerctl_tree/PKG-INFO").decode()
    dist_info = f"peerctl-{VERSION}.dist-info/"
    assert {n for n in names if not n.startswith(dist_info)} == \
        {f"peerctl_tree/{rel}" for rel in tree | {"__init__.py", "PKG-INFO", "COMMIT"}}
    assert commit == built["commit"] and f"\nVersion: {VERSION}\n" in pkg_info
    assert "requests/__init__.py" not in tree


class Installed:
    """The installed ``peerctl`` run from a directory of its own, its
    settings from the config file ``$PEERCTL_CONF`` names (this cluster's
    etcd and name), nothing from this checkout or this test's environment."""

    def __init__(self, peerctl: str, cluster, tmp_path):
        self.peerctl, self.cluster = peerctl, cluster
        self.cwd = tmp_path / "elsewhere"
        self.cwd.mkdir()
        conf = tmp_path / "peerctl.conf"
        conf.write_text(f"[peerctl]\netcd = {cluster.etcd_url}\ncluster = {cluster.name}\n")
        self.env = {name: value for name, value in os.environ.items()
                    if not name.startswith("PEERCTL_") and name != "PYTHONPATH"}
        self.env.update(PEERCTL_CONF=str(conf), PYTHONUNBUFFERED="1",
                        PEERCTL_PORTS=os.environ.get("PEERCTL_PORTS", ""))

    def run(self, *args, timeout=120) -> subprocess.CompletedProcess:
        return subprocess.run([self.peerctl, *args], capture_output=True, text=True,
                              env=self.env, cwd=self.cwd, timeout=timeout)

    def json(self, *args, **kwargs):
        done = self.run("--format", "json", *args, **kwargs)
        assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
        return json.loads(done.stdout)

    def start_peer(self, host: str) -> subprocess.Popen:
        """``peerctl peer`` for ``host`` on the test driver, owned by the
        cluster fixture (it kills it, and its guard, by PID at the end)."""
        state_dir = str(self.cluster.tmp_path / f"state-{host}")
        log = open(self.cluster.tmp_path / f"{host}.log", "ab")
        process = subprocess.Popen(
            [self.peerctl, "peer", "--host", host, "--libvirt", "test:///default",
             "--ttl", "2", "--state-dir", state_dir],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
            start_new_session=True)
        self.cluster.peers[host] = process
        self.cluster.state_dirs[host] = state_dir
        return process


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
@pytest.mark.parametrize("package", ["wheel", "sdist"])
def test_an_installed_package_runs_a_peer_boots_and_pings_from_any_directory(
        built, package, cluster, store, tmp_path):
    peerctl = installed(tmp_path / "venv", built[package])
    here = Installed(peerctl, cluster, tmp_path)

    assert here.json("version") == {"version": VERSION, "commit": built["commit"],
                                    "feature_level": SUPPORTED}
    assert here.run("version").stdout.strip().startswith(
        f"peerctl {VERSION} ({built['commit'][:8]})")

    here.start_peer("pkg1")
    wait_for(lambda: "pkg1" in api.live_hosts(store), timeout=60, what="pkg1 alive")
    row = wait_until(lambda: {h["host"]: h for h in here.json("hostlist")},
                     lambda rows: "pkg1" in rows, what="pkg1 listed")["pkg1"]
    assert row["version"] == f"{VERSION}+{built['commit'][:8]}" and row["alive"], row
    wait_for(lambda: "pkg1" in {p["name"] for p in here.json("placement", "providers")},
             what="pkg1's placement provider")

    booted = here.json("boot", "web1", "--resources", SMALL_VM, "--on", "pkg1")
    assert booted["state"] == "done", booted
    pinged = here.json("ping", "--rounds", "2")
    assert pinged["state"] == "done", pinged
    assert [(r["host"], r["status"]) for r in pinged["replies"]] == [("pkg1", "ok")] * 2, pinged
    listed = {vm["name"]: vm for vm in here.json("vmlist")}
    assert listed["web1"]["host"] == "pkg1" and listed["web1"]["state"] == "running", listed


def test_the_installed_tree_shadows_no_library(built, tmp_path):
    """The tree, first on the path as the launcher puts it, leaves ``import
    requests`` to the HTTP library: its ``requests/`` has no ``__init__.py``,
    a namespace portion that a regular package anywhere on the path wins
    over; the handlers still load, by path, from the installed tree."""
    peerctl = installed(tmp_path / "venv", built["wheel"])
    python = os.path.join(os.path.dirname(peerctl), "python")
    done = subprocess.run([python, "-c", (
        "import json, os, sys, peerctl_tree\n"
        "sys.path.insert(0, peerctl_tree.TREE)\n"
        "import requests\n"
        "from engine.core.handlers import REQUESTS_DIR, load_request_handlers\n"
        "from engine.core.registry import AUTOMATIONS_DIR, load_automations\n"
        "load_automations()\n"
        "print(json.dumps({'tree': peerctl_tree.TREE, 'requests': requests.__file__,\n"
        "    'get': callable(getattr(requests, 'get', None)), 'handlers': REQUESTS_DIR,\n"
        "    'automations': AUTOMATIONS_DIR, 'ping': 'ping' in load_request_handlers()}))")],
        capture_output=True, text=True, cwd=str(tmp_path), env={
            name: value for name, value in os.environ.items() if name != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    tree = said["tree"]
    assert tree.startswith(str(tmp_path / "venv")) and tree.endswith("peerctl_tree"), said
    assert not os.path.exists(os.path.join(tree, "requests", "__init__.py"))
    assert not said["requests"].startswith(tree) and said["get"], said
    assert said["handlers"] == os.path.join(tree, "requests") and said["ping"], said
    assert said["automations"] == os.path.join(tree, "automations"), said
    assert not said["requests"].startswith(ROOT), said
    # what a peer re-runs with cwd=<tree> (its guard) starts from the installed tree
    guard = subprocess.run([python, "-m", "engine.hypervisor.ha.guard", "--help"],
                           capture_output=True, text=True, cwd=tree)
    assert guard.returncode == 0 and "--state-dir" in guard.stdout, guard.stderr


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_a_wheel_built_from_an_edited_checkout_names_no_commit(built, tmp_path):
    """The commit is the tree's only while the tree is that commit: an edit
    not yet committed makes a wheel that says no commit rather than a
    wrong one."""
    tree = tmp_path / "tree"
    subprocess.run(["cp", "-a", built["tree"], str(tree)], check=True)
    with open(tree / "automations" / "ping.py", "a") as f:
        f.write("\n# an edit not yet committed\n")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir",
                    str(tmp_path / "dist"), str(tree)], check=True, capture_output=True)
    peerctl = installed(tmp_path / "venv", str(tmp_path / "dist" /
                                                f"peerctl-{VERSION}-py3-none-any.whl"))
    done = subprocess.run([peerctl, "--format", "json", "version"], capture_output=True,
                          text=True, cwd=str(tmp_path))
    assert json.loads(done.stdout) == {"version": VERSION, "commit": None,
                                       "feature_level": SUPPORTED}, done.stderr


def test_an_editable_install_runs_the_checkout(built, tmp_path):
    """``pip install -e .`` installs the launcher only: the ``peerctl`` it
    gives runs the checkout it was installed from."""
    peerctl = installed(tmp_path / "venv", "--editable=" + built["tree"])
    done = subprocess.run([peerctl, "--format", "json", "version"], capture_output=True,
                          text=True, cwd=str(tmp_path))
    assert json.loads(done.stdout)["version"] == VERSION, done.stderr
    python = os.path.join(os.path.dirname(peerctl), "python")
    where = subprocess.run([python, "-c", "import peerctl_tree; print(peerctl_tree.TREE)"],
                           capture_output=True, text=True, cwd=str(tmp_path)).stdout.strip()
    assert where == built["tree"]
