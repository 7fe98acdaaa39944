"""The parser, and the options several commands share, each defined once
(as Ganeti's cli_opts.py): global options, listings' field options,
``--yes``, ``--dry-run``, ``--detach``; and :class:`Commands`, through which
each noun module registers its commands beside their code."""
from __future__ import annotations

import argparse
import functools
import math

from engine.errors import UsageError

from .settings import TLS_FLAGS

__all__ = ["Parser", "Commands", "positive", "seconds", "global_options", "listing_options",
           "yes_option", "dry_run_option", "detach_option"]

# argparse asks gettext for each of its own strings as it builds a parser,
# and gettext looks for a catalogue on disk every time: about half of
# building the ~30 subcommands (3 of 6 ms), on every command.  Same answers,
# looked up once.
argparse._ = functools.lru_cache(maxsize=None)(argparse._)

RAW = argparse.RawDescriptionHelpFormatter


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit 2."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds: "
                                         f"{text!r}")
    return value


def global_options() -> Parser:
    """The options every command also takes after its name."""
    common = Parser(add_help=False)
    group = common.add_argument_group("global options (also accepted before the command)")
    group.add_argument("--etcd", default=argparse.SUPPRESS, metavar="URLS",
                       help="comma-separated etcd endpoints [$PEERCTL_ETCD]")
    group.add_argument("--cluster", default=argparse.SUPPRESS, metavar="NAME",
                       help="cluster name [$PEERCTL_CLUSTER]")
    group.add_argument("--format", default=argparse.SUPPRESS, choices=("table", "json"),
                       help="table, or json: one JSON document on stdout [$PEERCTL_FORMAT]")
    group.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and debug logs")
    for name, what in TLS_FLAGS.items():
        group.add_argument(f"--{name}", default=argparse.SUPPRESS, metavar="FILE",
                           help=f"{what} [$PEERCTL_{name.upper()}]")
    return common


def detach_option(sub) -> None:
    sub.add_argument("--detach", action="store_true",
                     help="print the automation id and return at once")


def yes_option(sub, help="do not ask when several VMs match") -> None:
    sub.add_argument("--yes", "-y", action="store_true", help=help)


def dry_run_option(sub, help="only list the VMs that would be acted on") -> None:
    sub.add_argument("--dry-run", action="store_true", help=help)


def listing_options(sub, columns, default_sort: str) -> None:
    sub.add_argument("-o", "--output", metavar="FIELDS",
                     help="comma-separated fields to show, '+F1,F2' adds to the "
                          "defaults; fields: " + ",".join(c.field for c in columns))
    sub.add_argument("--sort", metavar="FIELDS",
                     help=f"sort by these fields, -FIELD for descending "
                          f"(default {default_sort})")
    sub.add_argument("--no-headers", action="store_true",
                     help="no header line and no totals (for scripts)")
    sub.add_argument("--separator", metavar="SEP",
                     help="separate fields with SEP instead of aligning them")


class Commands:
    """Where noun modules add their commands: each with a one-line summary,
    a description, an example that runs, and the function it calls."""

    def __init__(self, subparsers, common: Parser, called: str):
        self.subparsers = subparsers
        self.common = common
        self.called = called        # "python peerctl.py", or "peerctl"

    def example(self, text: str) -> str:
        """An example as the user would type it, however peerctl was called."""
        return text.replace("python peerctl.py", self.called)

    def add(self, name: str, summary: str, example: str, func, description: str | None = None):
        sub = self.subparsers.add_parser(
            name, help=summary, parents=[self.common],
            description=description or summary[0].upper() + summary[1:] + ".",
            epilog="example:\n  " + self.example(example).replace("\n", "\n  "),
            formatter_class=RAW)
        sub.set_defaults(func=func)
        return sub

    def verbs(self, parent, dest: str = "what", metavar: str = "WHAT"):
        """A noun's verbs (``lease create``, ``aside list``): their own subparsers."""
        return Verbs(parent.add_subparsers(dest=dest, metavar=metavar, required=True,
                                           parser_class=Parser), self)


class Verbs:
    """The verbs of one noun, each with a summary, a description and an example."""

    def __init__(self, subparsers, commands: Commands):
        self.subparsers = subparsers
        self.commands = commands

    def add(self, name: str, summary: str, example: str, func=None,
            description: str | None = None):
        sub = self.subparsers.add_parser(
            name, parents=[self.commands.common], help=summary,
            description=description or summary[0].upper() + summary[1:] + ".",
            epilog="example:\n  " + self.commands.example(example).replace("\n", "\n  "),
            formatter_class=RAW)
        if func is not None:
            sub.set_defaults(func=func)
        return sub
