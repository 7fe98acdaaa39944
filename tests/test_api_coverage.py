"""Every command but the local ones has a route, and every route of the
OpenAPI document is called by some test: an API that silently lags the
command line, or a route nothing exercises, fails here."""
from __future__ import annotations

import argparse
import glob
import os
import re

from engine.commandline.main import LOCAL, build_parser
from engine.web.openapi import document
from engine.web.routes import ROUTES
from tests.support import ROOT

LOCAL_VERBS = {("host", "add")}      # it needs the CA's key and etcd's root
OUTSIDE_THE_TABLE = {("console",): "GET /v1/vms/{name}/console, a websocket"}


def _commands(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                yield from _commands(sub, (*prefix, name)) if nested else [(*prefix, name)]


def _routed(command: tuple) -> bool:
    """Whether a route names ``command`` as its command line's equivalent."""
    if command in OUTSIDE_THE_TABLE:
        return True
    words = " ".join(command).replace(" ...", "").replace("...", "")
    for route in ROUTES:
        for alternative in route.command.split(", "):
            said = alternative.split(" --")[0].replace("...", "")
            if said == words or said.startswith(words + " ") or \
                    words in said.split(" ")[0].split("|"):
                return True
    return False


def test_every_command_but_the_local_ones_has_a_route():
    commands = [c for c in _commands(build_parser())
                if c[0] not in LOCAL and c not in LOCAL_VERBS]
    assert len(commands) > 40
    missing = [" ".join(c) for c in commands if not _routed(c)]
    assert missing == []


def _called(path: str, texts: str) -> bool:
    pattern = re.escape(path)
    pattern = re.sub(r"\\\{\w+\\\}", r"(?:[^\"'/?{}\\s]+|\\{[^}]+\\})", pattern)
    return re.search(pattern + r"(?![\w/])", texts) is not None


def test_every_route_of_the_openapi_document_is_called_by_a_test():
    texts = "\n".join(open(path).read()
                      for path in glob.glob(os.path.join(ROOT, "tests", "test_*.py"))
                      if not path.endswith("test_api_coverage.py"))
    untested = [path for path in document()["paths"] if not _called(path, texts)]
    assert untested == []
