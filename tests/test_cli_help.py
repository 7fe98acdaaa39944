"""Every command's help has a description and an example, and every
example runs: each parses, and those that only read run against real peers
without a usage error (exit 2).  An example is what a new user types
first; one that fails teaches the wrong thing."""
from __future__ import annotations

import argparse
import importlib
import shlex
import sys

import pytest

from engine.commandline import build_parser
from engine.commandline.main import values_after_options
from tests.support.cluster import start_peers

READ_ONLY = {"vmlist", "hostlist", "hoststats", "tasks", "task", "placement", "aside list",
             "lease list", "lease show", "lease calendar", "scrub", "ping", "backup list",
             "backup schedule list", "token list", "code list", "version", "group list"}


def peerctl_parser():
    """The parser as ``python peerctl.py`` builds it: its examples name how
    peerctl was called (sys.argv[0]), which under pytest-xdist is ``-c``."""
    called = sys.argv[0]
    sys.argv[0] = "peerctl.py"
    try:
        return build_parser()
    finally:
        sys.argv[0] = called


def parsers(parser=None, path=()):
    """(command path, parser) for every command and verb."""
    parser = parser or peerctl_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from parsers(sub, (*path, name))


def examples(sub) -> list[str]:
    """The example lines of a help's epilog, without 'python peerctl.py'."""
    text = (sub.epilog or "").split("example:", 1)[-1]
    found = []
    for line in text.splitlines():
        line = line.strip()
        if "peerctl.py " in line:
            found.append(line.split("peerctl.py ", 1)[1])
    return found


ALL = list(parsers())


def test_every_command_and_verb_has_a_description_and_an_example():
    missing = [" ".join(path) for path, sub in ALL
               if not (sub.description and "example:" in (sub.epilog or "") and examples(sub))]
    assert missing == []


@pytest.mark.parametrize("path, line", [(path, line) for path, sub in ALL
                                        for line in examples(sub)],
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_every_example_parses(path, line):
    args = build_parser().parse_args(values_after_options(shlex.split(line)))
    assert args.command in (path[0], "boot")     # lease's example boots into one


def test_the_read_only_examples_run_without_a_usage_error(cluster, store):
    start_peers(cluster, store, ["host1", "host2"])
    ran = 0
    for path, sub in ALL:
        if " ".join(path) not in READ_ONLY or (path[0] in ("placement", "lease", "aside")
                                               and len(path) == 1):
            continue
        for line in examples(sub):
            done = cluster.cli(*shlex.split(line))
            assert done.returncode in (0, 1), (line, done.stderr)
            assert "Traceback" not in done.stderr, (line, done.stderr)
            ran += 1
    assert ran >= 12


def test_each_command_loads_only_its_noun_and_parses_as_the_whole_parser_does():
    """main.NOUNS names exactly what each noun module registers, so that a
    command loads its own noun alone (pip's lazy commands) and means the same."""
    main = importlib.import_module("engine.commandline.main")   # the package's main() shadows it
    registered = {path[0] for path, _ in ALL if len(path) == 1}
    assert set(main.NOUN_OF) == registered
    for noun, names in main.NOUNS.items():
        alone = build_parser(noun)
        assert alone.command_names == list(names), noun
    for argv in (["--etcd", "http://127.0.0.1:9", "vmlist", "web*", "--sort", "-memory_mb"],
                 ["--format", "json", "lease", "create", "m", "--start", "now", "--end", "+1h",
                  "--hosts", "2"], ["drain", "host1", "--yes"]):
        fixed = values_after_options(argv)
        assert main.noun_of(fixed) is not None
        assert vars(build_parser(main.noun_of(fixed)).parse_args(fixed)) == \
            vars(build_parser().parse_args(fixed))
    assert main.noun_of(["--help", "vmlist"]) is None and main.noun_of(["nosuch"]) is None
