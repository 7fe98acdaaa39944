"""peerctl's command line, behind ``peerctl.py`` (the one file a user runs,
also installed as the ``peerctl`` console script); docs/cli.md is its
reference.

It lives in this package rather than in ``peerctl.py`` because Python never
caches the bytecode of the script it is given.  The framework:

- :mod:`.main`: the parser, built from the noun modules, and the one ladder
  from exception to exit code;
- :mod:`.settings`: flag > environment > a running `up` > config file > default;
- :mod:`.context`: what each command gets, and where output goes;
- :mod:`.options`: the options several commands share, defined once;
- :mod:`.listing`, :mod:`.confirm`, :mod:`.follow`: listings, asking before
  destructive work, and running a planned automation, each written once;
- :mod:`.table`, :mod:`.progress`, :mod:`.lease_views`: rendering.

One module per noun registers its commands beside their code and calls the
operations layer (engine/operations/), which a second face calls too:
:mod:`.vms`, :mod:`.hosts`, :mod:`.moves`, :mod:`.tasks`, :mod:`.leases`,
:mod:`.placement`, :mod:`.aside`, :mod:`.admin`, :mod:`.local`.  No noun
imports another.

What it promises (docs/cli.md):
- exit 0 on success, 1 when the operation ran and failed, was cancelled or a
  pattern matched nothing, 2 on a usage error (one line naming the bad part,
  nothing written), 3 when etcd is unreachable (one line naming the
  endpoint), 4 when etcd denies this identity; 130 after Ctrl-C detached
  from an automation, which goes on;
- ``--format json`` prints exactly one JSON document on stdout, messages and
  progress go to stderr;
- no traceback reaches the user unless ``--debug`` is given.

Engine modules are imported inside the commands, so ``--help`` answers fast
and works whatever else is installed.
"""
from .main import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
