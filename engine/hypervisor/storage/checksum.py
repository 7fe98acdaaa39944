"""A checksum of a file's content that holes and zeros cannot fool, and
that a sparse copy computes without reading its holes.

The content is cut into 1 MiB blocks; the checksum is the SHA-256 of the
blocks' SHA-256s, in order, then of the length.  A block that is all zeros
hashes to one known value, so a hole (never read, never sent) and written
zeros give the same checksum: a file and its sparse copy agree whatever
the filesystems made of their holes.

Feed it in file order: :meth:`ContentHash.data` for bytes read,
:meth:`ContentHash.hole` for a hole's length.
"""
from __future__ import annotations

import hashlib

__all__ = ["ContentHash", "BLOCK", "PREFIX"]

BLOCK = 1 << 20
PREFIX = "sha256-1m:"
_ZERO_BLOCK = hashlib.sha256(bytes(BLOCK)).digest()


class ContentHash:
    def __init__(self):
        self._blocks = hashlib.sha256()
        self._block = hashlib.sha256()
        self._filled = 0            # bytes of the current block fed so far
        self.length = 0             # bytes of content, holes included
        self.data_bytes = 0         # bytes that were data, not holes

    def data(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        self.data_bytes += len(view)
        while view:
            take = min(len(view), BLOCK - self._filled)
            self._feed(view[:take])
            view = view[take:]

    def hole(self, length: int) -> None:
        if length <= 0:
            return
        if self._filled:
            take = min(length, BLOCK - self._filled)
            self._feed(bytes(take))
            length -= take
        whole, rest = divmod(length, BLOCK)
        for _ in range(whole):
            self._blocks.update(_ZERO_BLOCK)
        self.length += whole * BLOCK
        if rest:
            self._feed(bytes(rest))

    def _feed(self, piece) -> None:
        self._block.update(piece)
        self._filled += len(piece)
        self.length += len(piece)
        if self._filled == BLOCK:
            self._blocks.update(self._block.digest())
            self._block = hashlib.sha256()
            self._filled = 0

    def hexdigest(self) -> str:
        blocks = self._blocks.copy()
        if self._filled:
            blocks.update(self._block.digest())
        blocks.update(str(self.length).encode())
        return PREFIX + blocks.hexdigest()
