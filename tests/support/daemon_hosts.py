"""Three private libvirtd daemons serving libvirt's *test* driver: hosts
whose VMs outlive their peer's process, as QEMU's do, without booting a
guest.  ``test+unix:///default?socket=...`` reaches each daemon's own test
driver; a peer on it gets a guard (:mod:`engine.hypervisor.ha.guard`).

Module scope; skips where private daemons cannot run
(:func:`tests.support.libvirtd_pair.cannot_run_reason`).

    from tests.support.daemon_hosts import daemon_hosts  # noqa: F401  (a fixture)
"""
from __future__ import annotations

import shutil
from urllib.parse import quote

import libvirt
import pytest

from engine.hypervisor.local.daemons import PrivateLibvirtd
from tests.support import qemu_guest
from tests.support.libvirtd_pair import cannot_run_reason

__all__ = ["daemon_hosts"]


@pytest.fixture(scope="module")
def daemon_hosts():
    """The test-driver URIs of three private daemons.  A connection to each
    stays open meanwhile: a daemon's test driver forgets its domains when
    its last client leaves, and a real hypervisor does not."""
    why = cannot_run_reason()
    if why is not None:
        pytest.skip(why)
    base = qemu_guest.world_readable_tmpdir("peerctl-testd-")
    daemons = [PrivateLibvirtd(base, name) for name in ("d1", "d2", "d3")]
    try:
        for daemon in daemons:
            daemon.start()
        uris = [f"test+unix:///default?socket={quote(daemon.socket, safe='/')}"
                for daemon in daemons]
        held = [libvirt.open(uri) for uri in uris]
        yield uris
        for conn in held:
            conn.close()
    finally:
        for daemon in daemons:
            daemon.stop()
        shutil.rmtree(base, ignore_errors=True)
