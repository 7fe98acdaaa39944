"""``host remove NAME`` (to be built)."""
from __future__ import annotations


def register_remove(what) -> None:
    """Register ``host remove`` on the ``host`` noun's verbs."""
