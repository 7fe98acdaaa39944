"""A host's libvirt reached over TLS with the certificates ``tls certs
--libvirt`` issues from the cluster's authority: a real libvirtd listening
on TLS, another host's client files, and a stranger's refused."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import libvirt
import pytest

from engine.core.certs import LIBVIRT_FILES
from engine.core.etcd_server import free_port
from engine.errors import Failed
from engine.hypervisor.local.daemons import PrivateLibvirtd, cmdline
from tests.support import PEERCTL, ROOT
from tests.support.libvirtd_pair import cannot_run_reason

pytestmark = pytest.mark.qemu


def tls_certs(directory: str, *hosts: str) -> None:
    """The real command line: ``tls certs DIR --libvirt HOST=127.0.0.1``..."""
    done = subprocess.run([sys.executable, PEERCTL, "tls", "certs", directory,
                           *[f"--libvirt={host}=127.0.0.1" for host in hosts]],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    for host in hosts:
        assert f"libvirt's files for {host}: " in done.stdout


@pytest.fixture
def base():
    why = cannot_run_reason()
    if why is not None:
        pytest.skip(why)
    base = os.path.realpath(tempfile.mkdtemp(prefix="pc-tls-", dir="/var/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_a_hosts_libvirt_over_tls_answers_another_host_and_refuses_a_stranger(base):
    tls = os.path.join(base, "tls")
    tls_certs(tls, "kvm1", "kvm2")
    assert sorted(os.listdir(os.path.join(tls, "libvirt", "kvm1"))) == sorted([*LIBVIRT_FILES, "qemu"])
    daemon = PrivateLibvirtd(base, "kvm1", tls=(os.path.join(tls, "libvirt", "kvm1"),
                                                "127.0.0.1", free_port()))
    daemon.start()
    try:
        conn = libvirt.open(daemon.tls_uri(os.path.join(tls, "libvirt", "kvm2")))
        try:
            reached = ET.fromstring(conn.getCapabilities()).find("host/uuid").text
        finally:
            conn.close()
        assert reached == daemon.host_uuid, "another daemon answered"

        stranger = os.path.join(base, "stranger")
        tls_certs(stranger, "kvm2")                     # another cluster's authority
        with pytest.raises(libvirt.libvirtError, match="certificate"):
            libvirt.open(daemon.tls_uri(os.path.join(stranger, "libvirt", "kvm2")))
    finally:
        daemon.stop()


def test_a_client_refuses_a_libvirtd_whose_certificate_names_another_address(base):
    tls = os.path.join(base, "tls")
    done = subprocess.run([sys.executable, PEERCTL, "tls", "certs", tls,
                           "--libvirt", "kvm1=10.9.9.9", "--libvirt", "kvm2=127.0.0.1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    daemon = PrivateLibvirtd(base, "kvm1", tls=(os.path.join(tls, "libvirt", "kvm1"),
                                                "127.0.0.1", free_port()))
    daemon.start()
    try:
        with pytest.raises(libvirt.libvirtError, match="verify peer.s certificate"):
            libvirt.open(daemon.tls_uri(os.path.join(tls, "libvirt", "kvm2")))
    finally:
        daemon.stop()


def test_a_libvirtd_that_cannot_start_leaves_no_virtlogd_behind(base):
    """Without its certificate, a TLS libvirtd exits at once: start() says
    why in one Failed, and stops the virtlogd it started for it."""
    empty = os.path.join(base, "no-certificates")
    os.makedirs(empty)
    daemon = PrivateLibvirtd(base, "kvm1", tls=(empty, "127.0.0.1", free_port()))
    with pytest.raises(Failed, match="exited"):
        daemon.start(timeout=30)
    assert daemon.record()["virtlogd"]["pid"] is None
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit()
                and base in " ".join(cmdline(int(pid)) or [])]
