#!/usr/bin/env python3
"""peerctl: the command line of a masterless cluster manager for KVM hosts.

The one file a user runs (``python peerctl.py --help``).  The command line
itself is ``engine/commandline.py``: Python compiles the script it runs on
every start but caches the bytecode of the modules it imports, so this file
stays small.  Imported (the ``peerctl`` console script, the tests), it *is*
that module.  What it promises: ../shared/CONTRACT.md, beside this
repository.
"""
import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine import commandline  # noqa: E402

if __name__ == "__main__":
    commandline.main()
else:
    sys.modules[__name__] = commandline
