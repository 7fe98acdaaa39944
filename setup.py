"""How the tree becomes a wheel and an sdist (metadata: setup.cfg).

The wheel installs the whole tree as ONE directory, ``peerctl_tree/``
(docs/engine.md, "The installed tree"): the launcher ``peerctl_tree/__init__.py``,
then ``peerctl.py``, ``engine/``, ``automations/``, ``requests/`` and
``conf/`` copied beside it as they are in the checkout, plus ``PKG-INFO``
(the version ``peerctl version`` reads) and ``COMMIT`` when the commit is
known.  The sdist carries the tree (MANIFEST.in) and that ``COMMIT``, so a
wheel built from it says the same.

The commit is known when the tree is an sdist carrying ``COMMIT``, or a git
checkout whose release files have no uncommitted change: a wheel built from
an edited tree names no commit rather than a wrong one.

``pip install -e .`` installs the launcher only, which then runs the
checkout it sits in.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "peerctl_tree"
# what a release's tree is made of (engine/releases/archive.py checks the same layout)
TREE = ("peerctl.py", "engine", "automations", "requests", "conf")
SKIPPED = ("__pycache__",)


def tree_commit(root: str = HERE):
    """The commit the tree at ``root`` is, or None: its ``COMMIT`` file (an
    sdist), else a clean git checkout's ``HEAD``."""
    try:
        with open(os.path.join(root, "COMMIT")) as f:
            return f.read().strip() or None
    except OSError:
        pass
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"],
                              capture_output=True, text=True)
        edits = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", *TREE,
                                PACKAGE], capture_output=True, text=True)
    except OSError:             # no git command
        return None
    if head.returncode or edits.returncode or edits.stdout.strip():
        return None
    return head.stdout.strip() or None


def _copy_tree(dest: str) -> None:
    for part in TREE:
        source = os.path.join(HERE, part)
        if os.path.isfile(source):
            shutil.copy2(source, os.path.join(dest, part))
        else:
            shutil.copytree(source, os.path.join(dest, part), ignore=shutil.ignore_patterns(
                *SKIPPED, "*.py[cod]"))


class build_tree(build_py):
    """build_py, then the tree beside the launcher (not for ``pip install -e``)."""

    def run(self):
        dest = os.path.join(self.build_lib, PACKAGE)
        if not getattr(self, "editable_mode", False):
            shutil.rmtree(dest, ignore_errors=True)     # no file of an earlier build stays
        super().run()
        if getattr(self, "editable_mode", False):
            return
        _copy_tree(dest)
        metadata = self.distribution.metadata
        with open(os.path.join(dest, "PKG-INFO"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {metadata.get_name()}\n"
                    f"Version: {metadata.get_version()}\n"
                    f"Summary: {metadata.get_description()}\n")
        commit = tree_commit()
        if commit:
            with open(os.path.join(dest, "COMMIT"), "w") as f:
                f.write(commit + "\n")


class sdist_with_commit(sdist):
    """sdist, with the ``COMMIT`` file the wheel built from it carries."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        commit = tree_commit()
        if commit:
            path = os.path.join(base_dir, "COMMIT")
            if os.path.exists(path):
                os.unlink(path)         # a hard link to the tree's own: never write through it
            with open(path, "w") as f:
                f.write(commit + "\n")


setup(cmdclass={"build_py": build_tree, "sdist": sdist_with_commit})
