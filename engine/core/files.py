"""A file written whole or not at all: a temporary file beside it, then
``os.replace``; a private one (a key) is created 0600 and never readable by
others, even for an instant."""
from __future__ import annotations

import os

__all__ = ["write_whole"]


def write_whole(path: str, data: str | bytes, private: bool = False) -> None:
    """``data`` (text or bytes) at ``path``, mode 0600 if ``private`` else 0644."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)
