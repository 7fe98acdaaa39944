"""Two KVM hosts on this machine: the ``libvirtd_pair`` fixture.

Two private libvirtd (:mod:`engine.hypervisor.local.daemons`), ``kvm1`` and
``kvm2``, each with its own host UUID, socket, state and virtlogd, so that
libvirt migrates between them as between two machines.  Both run inside a
network namespace of the fixture's own, where they share one guest network,
``default`` (:mod:`engine.hypervisor.local.localnet`: a bridge with DHCP, no
forwarding); the namespace is deleted at teardown.  They live under a
directory QEMU's user can reach (``/var/tmp``; pytest's ``tmp_path`` sits
under a 0700 directory), also handed to the tests for their kernels,
initrds and console logs.

Module scope: started once per test module, in well under a second each
when the system daemon's cache of QEMU's capabilities can be copied (else
libvirt probes QEMU, ~8 s).  At teardown, guests the tests left are
destroyed and undefined, then both daemons stopped.  Skips, saying why, where
the real-QEMU tier cannot run (:func:`tests.support.qemu_guest.skip_reason`)
or private daemons cannot (:func:`cannot_run_reason`).

Import it into a test module::

    from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from engine.hypervisor.local.daemons import PrivateLibvirtd, delete_netns, ensure_netns
from engine.hypervisor.local.localnet import ensure_local_network, stop_local_network
from tests.support import qemu_guest

__all__ = ["libvirtd_pair", "LibvirtdPair", "cannot_run_reason", "NAMES"]

NAMES = ("kvm1", "kvm2")
NETWORK = "default"             # the guests' network, inside the pair's namespace


@dataclass
class LibvirtdPair:
    """``daemons`` (two :class:`PrivateLibvirtd`, started), ``uris`` (their
    client URIs, in the same order), ``dir`` (their parent, world-readable,
    for the tests' files) and ``netns`` (their network namespace)."""
    daemons: list
    dir: str
    netns: str = ""

    @property
    def uris(self) -> list[str]:
        return [daemon.uri for daemon in self.daemons]


def cannot_run_reason() -> str | None:
    """Why private daemons cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "private libvirtd daemons run as root (they bind-mount libvirt's directories)"
    missing = [tool for tool in ("libvirtd", "virtlogd", "unshare", "mount")
               if not shutil.which(tool)]
    if missing:
        return f"no {', '.join(missing)} on PATH (bash .ci/libvirtd.sh installs libvirt)"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a mount namespace here: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def libvirtd_pair():
    why = qemu_guest.skip_reason() or cannot_run_reason()
    if why is not None:
        pytest.skip(why)
    base = qemu_guest.world_readable_tmpdir("peerctl-pair-")
    netns = f"peerctl-pair-{os.getpid()}"
    ensure_netns(netns)
    daemons = [PrivateLibvirtd(base, name, netns) for name in NAMES]
    try:
        for daemon in daemons:
            daemon.start()
        ensure_local_network([daemon.uri for daemon in daemons], NETWORK)
        yield LibvirtdPair(daemons, base, netns)
    finally:
        for daemon in daemons:
            daemon.clear_guests()
        stop_local_network([daemon.uri for daemon in daemons if daemon.running()], NETWORK)
        for daemon in daemons:
            daemon.stop()
        delete_netns(netns)
        shutil.rmtree(base, ignore_errors=True)
