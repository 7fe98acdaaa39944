"""The cluster's image sources, as a test's setup sets them: the default
(``images/`` under each host's state directory) and the test's own
directory of images or loopback server, listed explicitly
(``allow_images(store, tmp_path)``), as an operator would with
``images sources --add``."""
from __future__ import annotations

import os

from engine.hypervisor.storage.image_sources import change_sources

__all__ = ["allow_images"]


def allow_images(store, *sources) -> list[str]:
    """Add ``sources`` (directories, or http(s) URL prefixes) to the
    cluster's image sources; a file names its directory.  The list now."""
    listed = [str(s) if "://" in str(s) or not os.path.isfile(str(s))
              else os.path.dirname(os.path.abspath(str(s))) for s in sources]
    return change_sources(store, "tests", add=listed)
