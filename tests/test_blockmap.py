"""Block maps and deltas of real qcow2 images (``qemu-img``, ``qemu-io``):
the delta between two copies holds only the blocks that differ, and
applied to a copy of the older one gives exactly the newer one."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from engine.errors import RequestError
from engine.hypervisor.storage import blockmap

BLOCK = blockmap.BLOCK
SIZE = 64 << 20
ETCD_REQUEST_LIMIT = int(1.5 * (1 << 20))      # etcd's --max-request-bytes by default


def image(path, writes):
    """A qcow2 image of 64 MiB with ``writes``: ``(offset, length, pattern)``,
    pattern None writing zeros."""
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), str(SIZE)], check=True)
    for offset, length, pattern in writes:
        command = f"write -z {offset} {length}" if pattern is None else \
            f"write -P {pattern} {offset} {length}"
        subprocess.run(["qemu-io", "-f", "qcow2", "-c", command, str(path)], check=True,
                       capture_output=True)
    return str(path)


def same_content(one, other) -> bool:
    return subprocess.run(["qemu-img", "compare", one, other], capture_output=True).returncode == 0


def test_a_delta_holds_the_differing_blocks_and_makes_the_old_copy_the_new_one(tmp_path):
    old = image(tmp_path / "old.qcow2", [(0, BLOCK, 1), (5 * BLOCK, 3 * BLOCK, 2),
                                         (40 * BLOCK, BLOCK, 3), (50 * BLOCK, 4096, 4)])
    # the new copy keeps block 0, rewrites 5-7 in part, zeroes 40, writes 60-61
    new = image(tmp_path / "new.qcow2", [(0, BLOCK, 1), (5 * BLOCK, 3 * BLOCK, 2),
                                         (6 * BLOCK, 512, 9), (40 * BLOCK, BLOCK, None),
                                         (60 * BLOCK, 2 * BLOCK, 7)])
    theirs, length = blockmap.content_map(old, str(tmp_path / "old.raw"))
    ours, _ = blockmap.content_map(new, str(tmp_path / "new.raw"), keep=True)
    assert length == SIZE and 40 not in ours, "a zero block is left out of a map"
    blocks = blockmap.differing(ours, theirs)
    assert blocks == [6, 40, 50, 60, 61]

    delta = str(tmp_path / "delta.qcow2")
    blockmap.write_delta(str(tmp_path / "new.raw"), blocks, length, delta,
                         str(tmp_path / "delta.raw"))
    assert os.path.getsize(delta) < 20 * BLOCK, "the delta holds only what differs"

    built = str(tmp_path / "built.qcow2")
    blockmap.copy_image(old, built)
    blockmap.apply_delta(delta, built, blocks, length)
    assert same_content(built, new)
    assert blockmap.digest(*blockmap.content_map(built, str(tmp_path / "b.raw"))) == \
        blockmap.digest(ours, length)
    blockmap.apply_delta(delta, built, blocks, length)          # again, after a crash
    assert same_content(built, new)
    assert blockmap.content_map(old, str(tmp_path / "o.raw"))[0] == theirs, "base untouched"
    assert sorted(os.listdir(tmp_path)) == ["built.qcow2", "delta.qcow2", "new.qcow2",
                                            "new.raw", "old.qcow2"]


def test_runs_join_consecutive_blocks():
    assert blockmap.runs([7, 1, 2, 3, 9, 8]) == [(1, 3), (7, 3)]
    assert blockmap.runs([]) == []


def test_a_map_file_holds_each_blocks_digest_by_number_and_leaves_zero_blocks_holes(tmp_path):
    length = 10 * 4096 * BLOCK + 1000          # the last block is partial
    blocks = {0: "ab" * 16, 7: "01" * 16, 9000: "ff" * 16, 40960: "12" * 16}
    path = str(tmp_path / "disk.map")
    blockmap.write_map(blocks, length, path)
    assert os.path.getsize(path) == blockmap.map_size(length) == 64 + 16 * 40961
    assert os.stat(path).st_blocks * 512 < 5 * 4096, "zero blocks are holes: not sent"
    assert blockmap.read_map(path) == (blocks, length)
    assert os.listdir(tmp_path) == ["disk.map"], "written beside, renamed whole"


def test_a_file_that_is_no_whole_map_is_refused(tmp_path):
    path = str(tmp_path / "disk.map")
    blockmap.write_map({3: "aa" * 16}, SIZE, path)
    with open(path, "r+b") as out:
        out.truncate(blockmap.map_size(SIZE) - 16)          # cut short
    for damaged in (path, str(tmp_path / "absent.map")):
        try:
            blockmap.read_map(damaged)
        except RequestError as exc:
            assert "block map" in str(exc)
        else:
            raise AssertionError(f"{damaged} read as a map")


def test_a_map_too_large_for_an_etcd_request_fits_a_small_file(tmp_path):
    """40,000 written blocks (2.4 GiB of a disk): their map as the JSON that
    replica requests used to carry is over etcd's 1.5 MiB request limit; as
    a map file it is 0.6 MiB, and reads back the same."""
    blocks = {index: hashlib.sha256(index.to_bytes(4, "little")).hexdigest()[:32]
              for index in range(40_000)}
    length = 40_000 * BLOCK
    assert len(json.dumps({"vda": {"length": length, "blocks": {
        str(i): h for i, h in blocks.items()}}})) > ETCD_REQUEST_LIMIT
    path = str(tmp_path / "disk.map")
    blockmap.write_map(blocks, length, path)
    assert os.path.getsize(path) < ETCD_REQUEST_LIMIT / 2
    assert blockmap.read_map(path) == (blocks, length)


@pytest.mark.slow
def test_the_map_of_a_disk_with_40000_written_blocks_names_the_few_that_changed(tmp_path):
    """A sparse disk of 40,000 written blocks (about 30 s: each map hashes
    2.4 GiB): its map file, read back, compared with the map of the disk
    after three blocks changed, names exactly those three."""
    count = 40_000
    disk = tmp_path / "disk.raw"
    with open(disk, "wb") as out:
        out.truncate(count * BLOCK)
        for index in range(count):
            out.seek(index * BLOCK + 512 * (index % 100))
            out.write((index + 1).to_bytes(4, "little") * 128)
    theirs, length = blockmap.content_map(str(disk), str(tmp_path / "old.copy.raw"))
    assert len(theirs) == count
    path = str(tmp_path / "old.map")
    blockmap.write_map(theirs, length, path)
    assert os.path.getsize(path) < ETCD_REQUEST_LIMIT / 2
    assert blockmap.read_map(path) == (theirs, length)

    changed = [3, 17_001, 39_999]
    with open(disk, "r+b") as out:
        for index in changed:
            out.seek(index * BLOCK + 8192)
            out.write(b"new!" * 1024)
    ours, _ = blockmap.content_map(str(disk), str(tmp_path / "new.copy.raw"))
    assert blockmap.differing(ours, blockmap.read_map(path)[0]) == changed
