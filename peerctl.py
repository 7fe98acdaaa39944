#!/usr/bin/env python3
"""peerctl: the command line of a masterless cluster manager for KVM hosts.

The one file a user runs (``python peerctl.py --help``); docs/cli.md is its
reference.  The command line itself is the package ``engine/commandline/``:
Python compiles the script it runs on every start but caches the bytecode of
the modules it imports, so this file stays small.
"""
import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine.commandline import main  # noqa: E402

if __name__ == "__main__":
    main()
