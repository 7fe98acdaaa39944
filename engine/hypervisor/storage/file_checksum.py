"""The checksum of a file of this host (:mod:`~engine.hypervisor.storage.checksum`'s
``sha256-1m:``), read straight from the file, its holes skipped, its 1 MiB
blocks hashed on several threads at once.

It gives the same value as a :class:`~engine.hypervisor.storage.checksum.ContentHash`
fed through libvirt's sparse stream of the same file (what a backup's record
holds): a block is hashed alike whether it was read as data, zeros or a
hole.  ``hashlib`` lets go of the GIL while it hashes, so the threads use
every CPU; the blocks' digests are then put together in file order.

:func:`file_checksum` calls ``tick(done, total)`` as it goes and stops with
:class:`~engine.hypervisor.storage.volcopy.Interrupted` when ``stop()`` says so.
"""
from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import os

from engine.hypervisor.storage.checksum import BLOCK, PREFIX
from engine.hypervisor.storage.volcopy import Interrupted

__all__ = ["file_checksum"]

THREADS = max(1, min(4, os.cpu_count() or 1))
_BATCH = 64                     # blocks handed to the threads at a time
_ZERO = hashlib.sha256(bytes(BLOCK)).digest()


def _data_ranges(fd: int, length: int) -> list[tuple[int, int]]:
    """``(start, end)`` of the file's data (SEEK_DATA/SEEK_HOLE; the whole
    file where the filesystem cannot say)."""
    ranges, at = [], 0
    try:
        while at < length:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:        # no data past ``at``
                    break
                raise
            end = os.lseek(fd, start, os.SEEK_HOLE)
            ranges.append((start, min(end, length)))
            at = end
    except OSError:
        return [(0, length)]
    return ranges


def _touches(ranges: list[tuple[int, int]], start: int, end: int, hint: list[int]) -> bool:
    """Whether [start, end) meets a data range (``hint``: where to look from,
    blocks being asked in order)."""
    i = hint[0]
    while i < len(ranges) and ranges[i][1] <= start:
        i += 1
    hint[0] = i
    return i < len(ranges) and ranges[i][0] < end


def file_checksum(path: str, tick=lambda done, total: None,
                  stop=lambda: False) -> tuple[str, int]:
    """``(checksum, bytes of data read)`` of the file at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        length = os.lseek(fd, 0, os.SEEK_END)      # a block device's size too
        ranges = _data_ranges(fd, length)
        hint = [0]

        def digest(start: int) -> bytes:
            size = min(BLOCK, length - start)
            data = os.pread(fd, size, start)
            if len(data) != size:
                raise OSError(f"{path}: short read at {start}")
            return hashlib.sha256(data).digest()

        outer, read = hashlib.sha256(), 0
        starts = range(0, length, BLOCK)
        with concurrent.futures.ThreadPoolExecutor(THREADS, "checksum") as pool:
            for first in range(0, len(starts), _BATCH):
                if stop():
                    raise Interrupted("stopped: asked to abort")
                batch = starts[first:first + _BATCH]
                jobs = []
                for start in batch:
                    end = min(start + BLOCK, length)
                    if _touches(ranges, start, end, hint):
                        jobs.append(pool.submit(digest, start))
                        read += end - start
                    elif end - start == BLOCK:
                        jobs.append(_ZERO)
                    else:
                        jobs.append(hashlib.sha256(bytes(end - start)).digest())
                for job in jobs:
                    outer.update(job if isinstance(job, bytes) else job.result())
                tick(min(batch[-1] + BLOCK, length), length)
        outer.update(str(length).encode())
        return PREFIX + outer.hexdigest(), read
    finally:
        os.close(fd)
