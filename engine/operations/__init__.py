"""peerctl's operations: what a user can do to the cluster, once, for every face.

Each function takes plain typed arguments and a :class:`Context` (the
cluster's store, its placement, who is asking), checks them, raising the
error root's classes (engine/errors.py: a bad argument is a
``UsageError``, exit 2, with nothing written), and returns the dictionaries
``peerctl --format json`` prints.  Nothing here touches argparse, a terminal
or stdout: the command line (engine/commandline/) renders what these return,
and an HTTP face can return it as it is.

- :mod:`.select`: patterns, and choosing VMs and hosts by them;
- :mod:`.specs`: names, resource specs and traits;
- :mod:`.vms`, :mod:`.hosts`, :mod:`.moves`, :mod:`.tasks`, :mod:`.leases`,
  :mod:`.placement`, :mod:`.aside`, :mod:`.admin`: one module per noun.

Work that takes an automation is planned first (:class:`~.plans.Plan`: its
kind, arguments and what it acts on), so that a face can show it, ask, or
stop at a dry run before :func:`~.tasks.start` starts it.
"""
from .context import Context
from .plans import Plan

__all__ = ["Context", "Plan"]
