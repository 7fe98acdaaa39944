"""Hosts joining and leaving the cluster: ``host add``, ``host remove``
(run by an administrator) and ``join`` (run on the new machine).

Each verb's work is in a module of its own: :mod:`.host_add` (``host add``
and ``join``) and :mod:`.host_remove`; this module only registers them."""
from __future__ import annotations


def register(commands) -> None:
    from . import host_add, host_remove
    sub = commands.add(
        "host", "add a host to the cluster (a join token) or remove one",
        "python peerctl.py host add h4 --address 10.0.0.14\n"
        "python peerctl.py host remove h9 --evacuate --yes", None,
        "host add prints a one-time join token for a new machine, which redeems it with "
        "join; host remove takes a host out of the cluster for good (docs/deploy.md).")
    what = commands.verbs(sub)
    host_add.register_add(what)
    host_remove.register_remove(what)
    host_add.register_join(commands)
