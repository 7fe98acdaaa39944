"""Asking before a destructive action, written once.

On a terminal the list is shown and the question asked (anything but yes:
exit 1, nothing done); without one, and without ``--yes``, the list is
shown and the command is a usage error (exit 2): nothing is written."""
from __future__ import annotations

import sys

from engine.errors import Failed, UsageError

from .context import say

__all__ = ["confirm", "ask"]


def confirm(verb: str, listing: list[str], what: str = "VMs", cancelled=None,
            question: str | None = None) -> None:
    """``verb`` (``destroy``, ``evacuate``) would act on ``listing`` (one
    line each): ask, or refuse without a terminal."""
    lines = "\n".join(f"  {line}" for line in listing)
    count = f"{len(listing)} {what}"
    if not sys.stdin.isatty():
        say(f"{verb} would act on {count}:\n{lines}")
        raise UsageError(f"{verb} matches {count}: add --yes to confirm "
                         "(no terminal to ask on)")
    say(f"{verb} will act on {count}:\n{lines}")
    ask(question or f"{verb.capitalize()} these {count}?", cancelled)


def ask(question: str, cancelled) -> None:
    """A yes/no question on the terminal; anything but yes: exit 1, nothing
    done, with ``cancelled`` as the JSON document."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise Failed("nothing done", result=cancelled)
