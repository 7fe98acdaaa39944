"""Block maps and deltas of real qcow2 images (``qemu-img``, ``qemu-io``):
the delta between two copies holds only the blocks that differ, and
applied to a copy of the older one gives exactly the newer one."""
from __future__ import annotations

import os
import subprocess

from engine.hypervisor.storage import blockmap

BLOCK = blockmap.BLOCK
SIZE = 64 << 20


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
