"""The pull of a pull-mode backup, on its own: peerctl's NBD client reads a
disk exported by a real ``qemu-nbd`` (on loopback, with a dirty bitmap, as
QEMU exports a backup job's point in time) and writes it once into a qcow2
file served by a ``qemu-nbd`` of its own, checksumming what passes.

No libvirt: ``qemu-img``, ``qemu-io`` and ``qemu-nbd`` (qemu-utils) only;
the test skips, saying why, where they are missing.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess

import pytest

from engine.errors import RequestError
from engine.hypervisor.storage import nbdpull, qcow2
from engine.hypervisor.storage.checksum import ContentHash

MiB = 1 << 20
TOOLS = ("qemu-img", "qemu-io", "qemu-nbd")


@pytest.fixture
def tools():
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (qemu-utils: bash .ci/libvirtd.sh)")


def qemu(*args):
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def image(path, *writes):
    qemu("qemu-img", "create", "-q", "-f", "qcow2", str(path), "256M")
    if writes:
        qemu("qemu-io", "-f", "qcow2", *[a for w in writes for a in ("-c", w)], str(path))
    return str(path)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def export(tools, tmp_path):
    """A disk with data, zeros and holes; bitmap ``since`` counts what was
    written after its first part; exported read-only as ``vda`` on loopback."""
    disk = image(tmp_path / "disk.qcow2", "write -P 0xab 0 5M", "write -z 8M 3M",
                 "write -P 0x11 100M 40M")
    qemu("qemu-img", "bitmap", "--add", disk, "since")
    qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x22 120M 1M", "-c", "write -z 2M 1M",
         disk)
    port = free_port()
    server = subprocess.Popen(["qemu-nbd", "-r", "-t", "-f", "qcow2", "-b", "127.0.0.1",
                               "-p", str(port), "-x", "vda", "-B", "since", disk],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        address = ("127.0.0.1", port)
        deadline_probe(address)
        yield disk, address, server
    finally:
        server.kill()
        server.wait()


def deadline_probe(address):
    from tests.support import wait_for

    def answers():
        try:
            socket.create_connection(address, timeout=1).close()
            return True
        except OSError:
            return False
    wait_for(answers, timeout=10, interval=0.02, what="qemu-nbd to listen")


def mapped(path) -> list[tuple[int, int]]:
    done = subprocess.run(["qemu-img", "map", "--output=json", path], check=True,
                          capture_output=True, text=True, timeout=60)
    return [(e["start"], e["length"]) for e in json.loads(done.stdout) if e["data"]]


def same_content(a, b) -> bool:
    return subprocess.run(["qemu-img", "compare", "-q", a, b], timeout=60).returncode == 0


def test_a_full_pull_copies_the_data_once_and_its_checksum_is_the_copys_content(export,
                                                                                tmp_path):
    disk, address, _ = export
    copy = image(tmp_path / "full.qcow2")
    sent, checksum = nbdpull.pull(address, "vda", None, copy)
    assert same_content(disk, copy)
    assert sent == 5 * MiB - 1 * MiB + 40 * MiB + 0    # data only: zeros and holes stay home
    assert nbdpull.content_checksum(copy) == (checksum, sent)
    assert nbdpull.content_checksum(disk)[0] == checksum


def test_an_incremental_pull_holds_only_what_the_bitmap_marks_and_rebuilds_the_disk(
        export, tmp_path):
    disk, address, _ = export
    full = image(tmp_path / "before.qcow2", "write -P 0xab 0 5M", "write -z 8M 3M",
                 "write -P 0x11 100M 40M")
    increment = image(tmp_path / "increment.qcow2")
    sent, checksum = nbdpull.pull(address, "vda", "since", increment)
    assert sent == 1 * MiB                          # the changed MiB; its zeroed MiB is marked
    assert mapped(increment) == [(120 * MiB, MiB)]
    assert nbdpull.content_checksum(increment)[0] == checksum
    qcow2.apply_increment(increment, full)
    assert same_content(disk, full)


def test_an_export_that_goes_away_mid_pull_is_one_line_and_no_checksum(export, tmp_path):
    _, address, server = export
    copy = image(tmp_path / "cut.qcow2")

    def cut(done, total):
        server.kill()
    with pytest.raises(RequestError) as caught:
        nbdpull.pull(address, "vda", None, copy, tick=cut)
    assert "\n" not in str(caught.value) and "vda" in str(caught.value)


def test_an_empty_disk_pulls_nothing_and_checksums_as_zeros(tools, tmp_path):
    disk = image(tmp_path / "empty.qcow2")
    port = free_port()
    server = subprocess.Popen(["qemu-nbd", "-r", "-t", "-f", "qcow2", "-b", "127.0.0.1",
                               "-p", str(port), "-x", "vda", disk],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline_probe(("127.0.0.1", port))
        sent, checksum = nbdpull.pull(("127.0.0.1", port), "vda", None,
                                      image(tmp_path / "copy.qcow2"))
    finally:
        server.kill()
        server.wait()
    zeros = ContentHash()
    zeros.hole(256 * MiB)
    assert (sent, checksum) == (0, zeros.hexdigest())
