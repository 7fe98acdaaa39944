"""The installed peerctl: the ``peerctl`` console script is ``peerctl_tree:main``.

A wheel (``setup.py``) installs the project's whole tree as this one
directory, ``site-packages/peerctl_tree/``: ``peerctl.py``, ``engine/``,
``automations/``, ``requests/``, ``conf/``, a ``PKG-INFO`` naming the
version and, when built from a clean git checkout, a ``COMMIT``.  The tree
keeps the layout of a checkout, so every path the code computes from its
own root (the automations, the handlers, ``conf/peerctl.conf``, the
``peerctl.py`` a peer or an upgrade re-runs) holds there as it does in a
checkout.  In a checkout (``pip install -e .``) this directory holds this
file only and the tree is its parent.

Promise: :func:`main` runs the tree's ``peerctl.py`` as ``python
peerctl.py`` would, with the tree first on ``sys.path``: it loads that file
by path, so the ``peerctl`` it runs is this tree's, whatever else the path
holds (and, like any launcher but ``peerctl.py``, it imports nothing of the
command line by name: tests/test_layout.py).  Nothing in it
shadows another distribution: ``engine``, ``automations`` and ``peerctl``
are importable only once :func:`main` puts the tree on the path, and
``requests/`` has no ``__init__.py``, so ``import requests`` still finds the
HTTP library (docs/engine.md, "The installed tree").
"""
import importlib.util
import os
import sys

__all__ = ["TREE", "main"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# installed: the tree is this directory; a checkout: its parent
TREE = _HERE if os.path.isfile(os.path.join(_HERE, "peerctl.py")) else os.path.dirname(_HERE)


def main() -> None:
    if TREE in sys.path:
        sys.path.remove(TREE)
    sys.path.insert(0, TREE)
    spec = importlib.util.spec_from_file_location("peerctl", os.path.join(TREE, "peerctl.py"))
    launcher = importlib.util.module_from_spec(spec)
    sys.modules["peerctl"] = launcher
    spec.loader.exec_module(launcher)
    launcher.main()
