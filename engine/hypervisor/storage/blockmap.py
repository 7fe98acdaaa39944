"""Per-block checksums of a disk image's content, and the delta that turns
one copy of a disk into another when the two sides only know each other's
checksums.

The content (what a guest reads, whatever the format and backing chain)
is cut into 64 KiB blocks, qcow2's cluster: the unit a delta file holds
anyway, and small enough that a block the guest was writing when the copy
was taken costs little more than what it wrote.  A *block map* is
``{index: checksum}``, the first 128 bits of each block's SHA-256 in hex
(about 45 bytes of JSON per block: 0.07 % of the data it describes), for
the blocks that are not all zeros (a hole and written zeros are the same
content, and are left out).  Two maps compared name exactly the blocks
whose content differs.

- :func:`content_map` reads an image of this host (through ``qemu-img
  convert`` into a sparse raw file beside it, deleted after) and answers its
  map and length; :func:`digest` sums a map into one checksum;
- :func:`write_map` and :func:`read_map` keep a map in a file, binary, so
  that it can travel between hosts as a volume (never through etcd, whose
  requests a large disk's map would overflow): a 64-byte header (magic,
  block size, digest size, the content's length), then 16 bytes per block
  (the first 128 bits of its SHA-256) indexed by block number, all zeros
  for a zero block.  Zero blocks are left holes, so that a sparse copy of
  the file sends little more than the blocks that hold data
  (:func:`map_size`: 1/4096 of the disk at most);
- :func:`differing` names the blocks where two maps disagree;
- :func:`write_delta` makes a qcow2 file holding those blocks of an image,
  nothing else (all-zero ones included as zeros);
- :func:`copy_image` copies an image standalone (its chain flattened);
- :func:`apply_delta` writes a delta into a disk: the blocks it names are
  zeroed first, then the delta is committed, so that zeros the delta left
  unallocated reach the disk too.  Run again (after a crash), it writes the
  same blocks again: the result is the same.

Nothing here opens a path of another host: a map file travels as a volume
(:mod:`engine.hypervisor.data.replica_delta`).
"""
from __future__ import annotations

import hashlib
import os
import struct
import subprocess

from engine.errors import RequestError
from engine.hypervisor.storage.qcow2 import CAN_CHECKPOINT, apply_increment

__all__ = ["content_map", "digest", "differing", "write_delta", "apply_delta", "copy_image",
           "runs", "write_map", "read_map", "map_length", "map_size", "BLOCK"]

TIMEOUT = 3600.0
BLOCK = 64 << 10
HEX = 32                    # hex digits of a block's SHA-256 kept in a map
_ZERO = bytes(BLOCK)
MAGIC = b"PCBMAP1\0"        # a map file's first bytes
HEADER = 64                 # bytes before the first block's digest
DIGEST = HEX // 2           # bytes of a block's digest in a map file
_HEAD = struct.Struct("<8sIIQ")     # magic, block size, digest size, length


def _run(tool: str, *args: str) -> str:
    try:
        done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RequestError(f"{tool} {args[0]}: {exc}") from None
    if done.returncode != 0 or (tool == "qemu-io" and "error" in done.stdout.lower()):
        why = (done.stderr or done.stdout).strip().splitlines()
        raise RequestError(f"{tool} {args[0]}: {why[-1] if why else 'failed'}")
    return done.stdout


def _raw_copy(image: str, raw: str) -> None:
    """``raw``: ``image``'s content, sparse (its zeros and holes stay holes)."""
    if os.path.exists(raw):
        os.unlink(raw)
    _run("qemu-img", "convert", "-O", "raw", image, raw)


def _data_ranges(fd: int, length: int):
    """``(start, end)`` of the data (not holes) in a sparse file."""
    offset = 0
    while offset < length:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:
            return                  # no data past offset
        end = min(os.lseek(fd, start, os.SEEK_HOLE), length)
        yield start, end
        offset = end


def _blocks_of(fd: int, length: int):
    """The indices of the blocks that hold data (maybe zeros)."""
    seen = set()
    for start, end in _data_ranges(fd, length):
        for index in range(start // BLOCK, (end - 1) // BLOCK + 1):
            if index not in seen:
                seen.add(index)
                yield index


def _map_of_raw(raw: str) -> tuple[dict[int, str], int]:
    length = os.path.getsize(raw)
    blocks = {}
    fd = os.open(raw, os.O_RDONLY)
    try:
        for index in _blocks_of(fd, length):
            data = os.pread(fd, BLOCK, index * BLOCK)
            if data != _ZERO[:len(data)]:
                blocks[index] = hashlib.sha256(data).hexdigest()[:HEX]
    finally:
        os.close(fd)
    return blocks, length


def content_map(image: str, scratch: str, keep: bool = False) -> tuple[dict[int, str], int]:
    """``(map, length)`` of ``image``'s content; ``scratch`` is the raw file
    used on the way (a path beside it), deleted unless ``keep``."""
    try:
        _raw_copy(image, scratch)
        return _map_of_raw(scratch)
    finally:
        if not keep and os.path.exists(scratch):
            os.unlink(scratch)


def digest(blocks: dict[int, str], length: int) -> str:
    """One checksum of a whole map: equal maps, equal digests."""
    summed = hashlib.sha256()
    for index in sorted(blocks):
        summed.update(f"{index}:{blocks[index]};".encode())
    summed.update(str(length).encode())
    return "blockmap-sha256:" + summed.hexdigest()


def map_size(length: int) -> int:
    """The bytes of the map file of ``length`` bytes of content."""
    return HEADER + DIGEST * (-(-length // BLOCK))


def write_map(blocks: dict[int, str], length: int, path: str) -> None:
    """``path``: the map ``blocks`` of ``length`` bytes of content, as a
    file (the module docstring).  Written beside as ``path.part`` and
    renamed: a map file that exists is whole."""
    part = path + ".part"
    with open(part, "wb") as out:
        out.write(_HEAD.pack(MAGIC, BLOCK, DIGEST, length).ljust(HEADER, b"\0"))
        out.truncate(map_size(length))
        for index in sorted(blocks):
            out.seek(HEADER + DIGEST * index)
            out.write(bytes.fromhex(blocks[index]))
    os.replace(part, path)


def map_length(path: str) -> int:
    """The content's length a map file describes; RequestError when the
    file is no whole map."""
    try:
        with open(path, "rb") as source:
            head = source.read(HEADER)
        size = os.path.getsize(path)
    except OSError as exc:
        raise RequestError(f"block map {os.path.basename(path)}: {exc.strerror}") from None
    if len(head) < HEADER:
        raise RequestError(f"block map {os.path.basename(path)}: no header")
    magic, block, digest_size, length = _HEAD.unpack_from(head)
    if magic != MAGIC or block != BLOCK or digest_size != DIGEST or size != map_size(length):
        raise RequestError(f"block map {os.path.basename(path)}: not a whole map of "
                           f"{BLOCK >> 10} KiB blocks")
    return length


def read_map(path: str) -> tuple[dict[int, str], int]:
    """``(map, length)`` read from a map file (only its data: holes are
    zero blocks)."""
    length = map_length(path)
    count, zero, blocks = -(-length // BLOCK), bytes(DIGEST), {}
    fd = os.open(path, os.O_RDONLY)
    try:
        for start, end in _data_ranges(fd, map_size(length)):
            first = max(0, (start - HEADER) // DIGEST)
            last = min(count, -(-(end - HEADER) // DIGEST))
            if last <= first:
                continue
            data = os.pread(fd, (last - first) * DIGEST, HEADER + first * DIGEST)
            for index in range(first, last):
                entry = data[(index - first) * DIGEST:(index - first + 1) * DIGEST]
                if entry != zero:
                    blocks[index] = entry.hex()
    finally:
        os.close(fd)
    return blocks, length


def differing(ours: dict[int, str], theirs: dict[int, str]) -> list[int]:
    """The blocks whose content differs (a block one map leaves out is zeros)."""
    return sorted(index for index in set(ours) | set(theirs)
                  if ours.get(index) != theirs.get(index))


def runs(blocks: list[int]) -> list[tuple[int, int]]:
    """``[(first, count)]``: consecutive blocks as runs."""
    out: list[tuple[int, int]] = []
    for index in sorted(blocks):
        if out and out[-1][0] + out[-1][1] == index:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((index, 1))
    return out


def copy_image(image: str, copy: str) -> None:
    """``copy`` (qcow2 version 3, standalone): ``image``'s content, sparse."""
    if os.path.exists(copy):
        os.unlink(copy)
    _run("qemu-img", "convert", "-O", "qcow2", "-o", f"compat={CAN_CHECKPOINT}", image, copy)


def write_delta(raw: str, blocks: list[int], length: int, delta: str, scratch: str) -> None:
    """``delta`` (qcow2, virtual size ``length``): ``raw``'s content at
    ``blocks``, unallocated elsewhere (``scratch``: a sparse raw file on
    the way, deleted)."""
    try:
        with open(raw, "rb") as source, open(scratch, "wb") as out:
            out.truncate(length)
            for index in blocks:
                source.seek(index * BLOCK)
                data = source.read(BLOCK)
                if data.strip(b"\0"):       # all-zero blocks: apply_delta zeroes them
                    out.seek(index * BLOCK)
                    out.write(data)
        if os.path.exists(delta):
            os.unlink(delta)
        _run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-o",
             f"compat={CAN_CHECKPOINT}", scratch, delta)
        _dig_holes(delta)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)


def _dig_holes(path: str) -> None:
    """The zeros of ``path`` made holes, which a sparse copy does not send:
    a delta's qcow2 tables are mostly zeros (an L2 table is a whole 64 KiB
    cluster for a few entries), about 0.3 MiB a delta would carry for
    nothing.  Best effort: without ``fallocate`` the file is sent as is."""
    try:
        subprocess.run(["fallocate", "--dig-holes", path], capture_output=True, timeout=TIMEOUT,
                       check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


def apply_delta(delta: str, disk: str, blocks: list[int], length: int) -> None:
    """``disk`` (qcow2) with ``delta``'s content at ``blocks``."""
    commands = []
    for first, count in runs(blocks):
        start = first * BLOCK
        size = min(count * BLOCK, length - start)
        commands += ["-c", f"write -z {start} {size}"]
    for at in range(0, len(commands), 2 * 500):     # a bounded command line
        _run("qemu-io", "-f", "qcow2", *commands[at:at + 1000], disk)
    apply_increment(delta, disk)
