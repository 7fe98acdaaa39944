"""The API's routes, one per command of the contract, each a thin call of
the operations layer (engine/operations/) answering the JSON that the
command's ``--format json`` prints.

A route is a :class:`Route`: its method and path, whether it writes (a
viewer is refused before it runs), the JSON Schema of its body (unknown
fields and wrong types are refused before it runs) and its query
parameters, and a handler ``handler(ctx, call) -> Answer`` that runs on the
server's pool of threads, where blocking on etcd is fine.  The table also
feeds the OpenAPI document (:mod:`.openapi`).

A write that starts an automation answers ``202 {"automation": ID}`` with
``Location: /v1/automations/ID``.  Work that the command line asks a person
to confirm (several VMs, a whole host) needs ``"yes": true`` in the body,
else ``409`` says what it would act on; ``"dry_run": true`` answers the
plan as ``--dry-run`` prints it.
"""
from __future__ import annotations

# each noun's module adds its routes to the table, in this order (the
# OpenAPI document's, and its names of a path item that two routes share)
from . import vms, hosts, moves, tasks, leases, backups, placement, graphs  # noqa: F401  # isort: skip
from . import tokens, code, upgrade, balance_auto  # noqa: F401  # isort: skip
from . import snapshots, replicas, aside, images, admin  # noqa: F401  # isort: skip
from .core import Answer, Call, ROUTES, Refusal, Route

__all__ = ["Route", "Call", "Answer", "ROUTES", "Refusal"]
