"""``host add NAME`` and ``join TOKEN`` (to be built)."""
from __future__ import annotations


def register_add(what) -> None:
    """Register ``host add`` on the ``host`` noun's verbs."""


def register_join(commands) -> None:
    """Register the top-level ``join`` command."""
