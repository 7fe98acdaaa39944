"""A backup chain's NBD export and the copy that reads it, on this machine
with QEMU's own tools (``qemu-nbd``, ``qemu-img``; no libvirt): the copy is
the chain's image, each link's newest blocks winning; on the migration
address of a host reached over TLS the export is served over TLS, and a
reader without the certificates is refused; the sweep ends an export whose
restore is not running, and the stored files are never modified.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from engine.core import certs
from engine.errors import RequestError
from engine.hypervisor.data import restore_exports
from engine.hypervisor.host.hostctx import HostContext
from engine.hypervisor.storage.file_checksum import file_checksum
from engine.hypervisor.storage.nbd_copy import copy_export, qemu_tls_dir

pytestmark = pytest.mark.skipif(not (shutil.which("qemu-nbd") and shutil.which("qemu-io")),
                                reason="needs qemu-nbd and qemu-io (qemu-utils)")
MiB = 1 << 20


def qemu(*args):
    subprocess.run(args, check=True, capture_output=True, timeout=60)


@pytest.fixture
def chain(tmp_path):
    """A full backup (pattern 0x11 in its first 2 MiB) and an incremental
    (0x22 in the second MiB), each a qcow2 of its own, as backups keep them."""
    full, incremental = str(tmp_path / "full.qcow2"), str(tmp_path / "inc.qcow2")
    for path in (full, incremental):
        qemu("qemu-img", "create", "-q", "-f", "qcow2", path, "8M")
    qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 2M", full)
    qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x22 1M 1M", incremental)
    return [full, incremental]


def host(tmp_path, remote="", address=None) -> HostContext:
    return HostContext(host="h1", libvirt_uri="test:///default", store=None,
                       state_dir=str(tmp_path / "state"), libvirt_remote=remote,
                       migration={"migration_address": address} if address else None)


def copied(record, tmp_path, tls_dir=None) -> bytes:
    out = str(tmp_path / "out.qcow2")
    qemu("qemu-img", "create", "-q", "-f", "qcow2", out, "8M")
    copy_export(record, out, 8 * MiB, tls_dir=tls_dir)
    raw = str(tmp_path / "out.raw")
    qemu("qemu-img", "convert", "-O", "raw", out, raw)
    with open(raw, "rb") as f:
        return f.read()


def test_the_copy_is_the_chain_and_the_links_are_left_as_they_were(tmp_path, chain, store):
    before = [file_checksum(path)[0] for path in chain]
    here = host(tmp_path)
    record = restore_exports.export_chain(here, "r1", None, "vda", chain, ["a", "b"])
    try:
        assert (record["address"], record["tls"]) == ("127.0.0.1", False)
        data = copied(record, tmp_path)
        assert data[:MiB] == b"\x11" * MiB and data[MiB:2 * MiB] == b"\x22" * MiB
        assert data[2 * MiB:] == bytes(6 * MiB)
    finally:        # no restore "r1" runs: the sweep ends its export
        assert restore_exports.sweep(store, here) == [f"export {record['name']}"]
    assert os.listdir(tmp_path / "state" / "restore-exports") == []
    assert [file_checksum(path)[0] for path in chain] == before


def test_on_the_migration_address_of_a_tls_host_the_export_needs_its_certificates(
        tmp_path, chain, store):
    tls = str(tmp_path / "tls")
    certs.authority(tls, "c")
    certs.issue_libvirt(tls, "kvm1", "127.0.0.1")
    pkipath = os.path.join(tls, "libvirt", "kvm1")
    here = host(tmp_path, f"qemu+tls://127.0.0.1/system?pkipath={pkipath}", "127.0.0.1")
    assert qemu_tls_dir(here.remote_uri) == os.path.join(pkipath, "qemu")
    record = restore_exports.export_chain(here, "r2", None, "vda", chain, ["a", "b"])
    assert record["tls"] is True
    try:
        with pytest.raises(RequestError, match="served over TLS"):
            copied(record, tmp_path)
        data = copied(record, tmp_path, tls_dir=qemu_tls_dir(here.remote_uri))
        assert data[MiB:2 * MiB] == b"\x22" * MiB
    finally:
        assert restore_exports.unserve(here, {"owner": "r2"})["stopped"]
    assert os.listdir(tmp_path / "state" / "restore-exports") == []
