"""Two KVM hosts on this machine, in a rack in a box: the ``libvirtd_pair`` fixture.

Two private libvirtd (:mod:`engine.hypervisor.local.daemons`), ``kvm1`` and
``kvm2``, each with its own host UUID, socket, state and virtlogd, each in
a network namespace of its own on one switch
(:mod:`engine.hypervisor.local.rack`), with its own address, listening for
libvirt's remote protocol over TLS (certificates from a CA of the fixture's
own, ``tls certs --libvirt``).  Between them, libvirt migrates as between
two machines: the control channel over TLS to the other's address, QEMU's
memory and disk streams over TCP with TLS.  The tests and peers of this
machine reach each daemon both ways: ``uris`` (its UNIX socket, what the
host's own peer uses) and ``remote_uris`` (``qemu+tls://ADDRESS:16514``,
what other hosts use: a peer's ``--libvirt-remote``).  The guests of both
share one network, ``default`` (:mod:`engine.hypervisor.local.localnet`:
kvm1's bridge with DHCP, kvm2's in bridge mode, joined through the rack's
guest switch).  They live under a directory QEMU's user can reach
(``/var/tmp``; pytest's ``tmp_path`` sits under a 0700 directory), also
handed to the tests for their kernels, initrds and console logs.

Module scope: started once per test module, in well under a second each
when the system daemon's cache of QEMU's capabilities can be copied (else
libvirt probes QEMU, ~8 s).  At teardown, guests the tests left are
destroyed and undefined, both daemons stopped and the rack deleted.  Skips,
saying why, where the real-QEMU tier cannot run
(:func:`tests.support.qemu_guest.skip_reason`) or private daemons cannot
(:func:`cannot_run_reason`).

Import it into a test module::

    from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
"""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from engine.core import certs
from engine.hypervisor.local.localnet import ensure_rack_network, stop_local_network
from engine.hypervisor.local.rack import Rack
from tests.support import qemu_guest

__all__ = ["libvirtd_pair", "LibvirtdPair", "cannot_run_reason", "NAMES"]

NAMES = ("kvm1", "kvm2")
NETWORK = "default"             # the guests' network, across the pair's rack
_RACKS = itertools.count(1)     # one rack per module that uses the fixture


@dataclass
class LibvirtdPair:
    """``daemons`` (two :class:`PrivateLibvirtd`, started), ``dir`` (their
    parent, world-readable, for the tests' files), ``rack`` (their
    namespaces, :class:`~engine.hypervisor.local.rack.Rack`) and ``tls``
    (the CA's directory)."""
    daemons: list
    dir: str
    rack: Rack
    tls: str

    @property
    def uris(self) -> list[str]:
        """Each daemon's UNIX socket: its own peer's ``--libvirt``."""
        return [daemon.uri for daemon in self.daemons]

    @property
    def remote_uris(self) -> list[str]:
        """Each daemon over TCP and TLS: its peer's ``--libvirt-remote``."""
        return [daemon.tls_uri(daemon.tls[0]) for daemon in self.daemons]

    @property
    def netns(self) -> list[str]:
        return [self.rack.netns(name) for name in NAMES]


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
    rack = Rack(f"pcpair{os.getpid()}-{next(_RACKS)}")
    daemons = []
    try:
        rack.build(list(NAMES))
        tls = os.path.join(base, "tls")
        certs.authority(tls, "pair")
        daemons += [rack.libvirtd(name, base, name, tls) for name in NAMES]
        for daemon in daemons:
            daemon.start()
        ensure_rack_network(rack, {daemon.name: daemon.uri for daemon in daemons}, NETWORK)
        yield LibvirtdPair(daemons, base, rack, tls)
    finally:
        for daemon in daemons:
            daemon.clear_guests()
        stop_local_network([daemon.uri for daemon in daemons if daemon.running()], NETWORK)
        for daemon in daemons:
            daemon.stop()
        rack.delete(settle=5.0)
        shutil.rmtree(base, ignore_errors=True)
