"""Finding and removing the values in a cluster's keyspace that nobody can
read: what ``peerctl scrub`` does.

Every kind of key declares its shape in the room that writes it (see
``engine/core/values.py``); this module imports those rooms' declarations
and checks every key of the cluster against them.  Deleting is guarded: a
key is deleted only if it is still the value that was found unreadable (its
mod revision is unchanged), so a key rewritten meanwhile by its owner stays.
"""
from __future__ import annotations

from engine.core import values
from engine.core.store import Delete, Store, modified_at
from engine.errors import Unreadable
import engine.hypervisor.domain.shapes  # noqa: F401  (declares vms/, disowned/)
import engine.placement.etcd  # noqa: F401  (declares placement/)
from engine.placement.view import stamped
import engine.backups.records  # noqa: F401  (declares backups/)
import engine.backups.schedules  # noqa: F401  (declares schedules/backup/)
import engine.core.tokens  # noqa: F401  (declares tokens/)
import engine.placement.groups  # noqa: F401  (declares groups/, groupof/)
import engine.planning.holds  # noqa: F401  (declares balanced/, settings/balance, balancer/status)
import engine.releases.catalog  # noqa: F401  (declares code/)
import engine.core.features  # noqa: F401  (declares cluster/feature_level)
import engine.core.removed  # noqa: F401  (declares removed/)

__all__ = ["find_unreadable", "delete_unreadable"]


def _values(store: Store):
    """Every key with its value, a kind at a time: the chunks of releases
    (``code/chunks/``, up to 16 MiB each release) are read one release at a
    time, so no read holds them all."""
    names, _ = store.range("", keys_only=True)
    kinds = sorted({kv.key.split("/", 1)[0] for kv in names})
    for kind in kinds:
        if kind != "code":
            yield from store.range(kind + "/")[0]
            yield from (kv for kv in store.range(kind)[0] if kv.key == kind)
            continue
        yield from store.range("code/releases/")[0]
        versions = sorted({kv.key.split("/")[2] for kv in names
                           if kv.key.startswith("code/chunks/") and kv.key.count("/") >= 3})
        for version in versions:
            yield from store.range(f"code/chunks/{version}/")[0]


def find_unreadable(store: Store) -> list[Unreadable]:
    """Every key of the cluster whose value cannot be read, by key."""
    kvs = _values(store)
    found = []
    for kv in kvs:
        why = values.problem(kv)
        if why is not None:
            found.append(Unreadable(kv.key, why, kv.mod_revision))
    return sorted(found, key=lambda bad: bad.key)


def delete_unreadable(store: Store, found: list[Unreadable]) -> list[str]:
    """Delete each of ``found`` that is still as it was found; the keys deleted."""
    deleted = []
    for bad in found:
        if store.txn([modified_at(bad.key, bad.mod_revision)], stamped([Delete(bad.key)])).succeeded:
            deleted.append(bad.key)
    return deleted
