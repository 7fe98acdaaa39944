"""Natural order: ``host2`` before ``host10``, the order peerctl lists
hosts and VMs in everywhere (listings, progress lines, the local cluster)."""
from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["natural_key"]

_DIGITS = re.compile(r"(\d+)")


def natural_key(value: Any) -> tuple:
    """Sort key: numbers inside strings compare as numbers; None sorts last.

    A kind first (0 number, 1 text, 2 None), then for text its parts:
    ``host12-vm3`` becomes ``(1, "host", 12, "-vm", 3, "")``.  Splitting on
    digit runs puts text at even places and numbers at odd ones, so two keys
    always compare like with like (a name starting with a digit has ``""``
    first, and sorts before letters)."""
    if type(value) is str:
        return _text_key(value)
    if value is None:
        return (2,)
    if isinstance(value, bool):
        return (0, int(value))
    if isinstance(value, (int, float)):
        return (0, value)
    return _text_key(str(value))


@functools.lru_cache(maxsize=65536)
def _text_key(text: str) -> tuple:
    parts = _DIGITS.split(text)
    parts[1::2] = map(int, parts[1::2])
    return (1, *parts)
