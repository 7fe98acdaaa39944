"""A command whose first word is a verb or, as any other word, its first
PATTERN: ``backup web1`` and ``backup list``, ``backup schedule 'web*'``
and ``backup schedule list``.

The patterns are parsed by a verb nobody can type (:data:`PATTERNS`: a
pattern has no space); a thing named like a verb is reached by its host
(``'*/list'``).  Help lists the choices as ``{PATTERN...,list,delete}``."""
from __future__ import annotations

import argparse
from collections.abc import Mapping

from .options import RAW

__all__ = ["PATTERNS", "VerbOrPatterns", "verbs_or_patterns", "add_patterns", "told_choices"]

PATTERNS = "PATTERN ..."


class _AnyWord(Mapping):
    """The verbs by name, as ``choices``: any word is one (a pattern)."""

    def __init__(self, verbs: dict):
        self.verbs = verbs

    def __getitem__(self, word):
        return self.verbs[word]

    def __iter__(self):
        return iter(self.verbs)

    def __len__(self) -> int:
        return len(self.verbs)

    def __contains__(self, word) -> bool:
        return True


class VerbOrPatterns(argparse._SubParsersAction):
    """The first word: a verb, or else the first PATTERN (parsed by the
    verb :data:`PATTERNS`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.choices = _AnyWord(self._name_parser_map)

    def __call__(self, parser, namespace, values, option_string=None):
        if values[0] not in self._name_parser_map:
            values = [PATTERNS, *values]
        super().__call__(parser, namespace, values, option_string)


def verbs_or_patterns(commands, parser, dest: str = "what"):
    """``parser``'s verbs (:class:`~.options.Verbs`), its first word a verb
    or a pattern."""
    parser.register("action", "parsers", VerbOrPatterns)
    return commands.verbs(parser, dest=dest)


def add_patterns(verbs, prog: str, summary: str, example: str, description: str):
    """The parser of the patterns, among ``verbs``, as ``Verbs.add`` makes a verb's."""
    commands = verbs.commands
    return verbs.subparsers.add_parser(
        PATTERNS, parents=[commands.common], prog=prog, help=summary,
        description=description,
        epilog="example:\n  " + commands.example(example).replace("\n", "\n  "),
        formatter_class=RAW)


def told_choices(verbs) -> None:
    """The command alone is told what it takes: ``{PATTERN...,list,delete}``
    (call once every verb is added)."""
    verbs.subparsers.metavar = "{" + ",".join(
        "PATTERN..." if word == PATTERNS else word for word in verbs.subparsers.choices) + "}"
