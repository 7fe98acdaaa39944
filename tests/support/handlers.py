"""Request handlers called in this process, as an executor would call them.

``call(host, "build", uuid=..., ...)`` runs the handler registered for
``build`` on ``host`` (a :class:`HostContext`) with those arguments.  The
``host`` fixture is a host of the test's own on libvirt's test driver:
test:///default keeps one in-memory hypervisor per process, shared by every
connection, so each host has its own name (its own storage pool) and state
directory.  Import the fixture with the helpers:
``from tests.support.handlers import call, host  # noqa: F401``.
"""
from __future__ import annotations

import uuid as uuidlib

import pytest

from engine.core.handlers import load_request_handlers
from engine.hypervisor.host.hostctx import HostContext

__all__ = ["HANDLERS", "TEST_URI", "call", "new_host", "host", "build"]

HANDLERS = load_request_handlers()
TEST_URI = "test:///default"


def call(host, request, /, **args):
    """What the handler registered for ``request`` returns for ``args`` on
    ``host`` (``args`` may name a ``host`` of their own: ``ha_lock`` does)."""
    return HANDLERS[request](host, args)


def new_host(state_dir, store=None, uri=TEST_URI, name=None) -> HostContext:
    """A host named ``name`` (else a fresh ``h<hex>``) on ``uri``, keeping its
    files in ``state_dir``; ``store`` is the etcd the handlers write to (None: none)."""
    return HostContext(name or "h" + uuidlib.uuid4().hex[:8], uri, store, str(state_dir))


def build(host, **overrides) -> dict:
    """A small VM built on ``host`` by its ``build`` handler (a fresh uuid
    and name, no image, unless ``overrides`` say otherwise); its arguments."""
    args = {"uuid": str(uuidlib.uuid4()), "name": "vm-" + uuidlib.uuid4().hex[:8],
            "vcpus": 1, "memory_mb": 64, "disk_gb": 1, "image": None, **overrides}
    call(host, "build", **args)
    return args


@pytest.fixture
def host(tmp_path):
    """A host of this test's own on the test driver, writing to no etcd."""
    return new_host(tmp_path / "state")
