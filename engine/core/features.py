"""The cluster's feature level: which shapes peers may write.

Code that can write a new shape (a new automation worker's log, a new key)
declares the level it needs; it keeps writing the old shape until the
operator raises the cluster's level (``cluster feature-level N``), after
MongoDB's feature compatibility version.  So versions N and N+1 run side by
side for as long as needed, and a host can go back to its previous release
until the level is raised.

Promises:
- :data:`SUPPORTED` is the highest level this code knows; every peer
  reports it in its host record (``feature_level``);
- the level is ``cluster/feature_level`` ``{level, time}``, 1 when unset;
  a value of the wrong shape reads as an error, never as a level;
- a new cluster (one that never had a host) starts at :data:`SUPPORTED`:
  the first peer writes it (:func:`found_cluster`), so nothing new waits
  for an operator where no older release ever ran;
- raising it is refused while any live peer supports less, naming each
  (:func:`raise_level`); it never goes down;
- a peer whose code supports less than the cluster's level refuses to
  start (:func:`check_supported`).
"""
from __future__ import annotations

import time

from engine.errors import Refused, Unreadable, UsageError

from .values import declare, shape

__all__ = ["SUPPORTED", "BASE", "level_key", "cluster_level", "raise_level",
           "check_supported", "found_cluster"]

SUPPORTED = 5       # the highest cluster feature level this code knows
BASE = 1            # the level of a cluster nobody raised
# Level 2 (issue 34): migrate's max_downtime_ms, and the automation versions
# registered with feature_level=2 (docs/upgrade.md lists them).
# Level 3 (issue 34, part 2): the automation versions registered with
# feature_level=3 (docs/upgrade.md lists them).
# Level 4 (issue 48): restore version 2 (holds its backups) and
# backup_schedule version 2 (records which schedule made a backup).
# Level 5 (issue 53): restore version 3 (the chain served over NBD by its
# host: restore_export, restore_unexport).


def level_key() -> str:
    return "cluster/feature_level"


def _why_not_level(value: dict) -> str | None:
    level = value.get("level")
    if isinstance(level, bool) or not isinstance(level, int) or level < BASE:
        return f"level {level!r} is no whole number from {BASE}"
    return None


LEVEL = shape("feature level", _why_not_level, level=int)
declare(level_key(), LEVEL)


def _level(kv) -> int:
    if kv is None:
        return BASE
    why = LEVEL.problem(kv.value)
    if why is not None:
        raise Unreadable(kv.key, why)
    return kv.value["level"]


def cluster_level(store) -> int:
    """The cluster's feature level now."""
    return _level(store.get(level_key()))


def found_cluster(store, supported: int = SUPPORTED) -> bool:
    """In a cluster that never had a host (no host config) and no level,
    write ``supported`` as its level: True when this call wrote it."""
    from engine.core import keys
    from engine.core.store import Put, absent
    if store.get(level_key()) is not None or store.range(keys.host_config(), keys_only=True)[0]:
        return False
    return store.txn([absent(level_key())],
                     [Put(level_key(), {"level": supported, "time": time.time()})]).succeeded


def check_supported(store, supported: int = SUPPORTED) -> int:
    """The cluster's level; :class:`Refused` when this code supports less."""
    level = cluster_level(store)
    if level > supported:
        raise Refused(f"the cluster's feature level is {level}, this code supports up to "
                      f"{supported}: run a release that supports it")
    return level


def raise_level(store, level: int) -> dict:
    """Raise the cluster's level to ``level``: ``{level, previous, hosts}``.
    Refused (nothing written) below the current level or while a live
    peer supports less; the same level again is a no-op."""
    from engine.core.hosts import live_hosts
    from engine.core.store import Put, absent, modified_at
    if not isinstance(level, int) or level < BASE:
        raise UsageError(f"feature level {level!r}: a whole number from {BASE}")
    for _ in range(10):
        kv = store.get(level_key())
        current = _level(kv)
        if level < current:
            raise Refused(f"the feature level is {current}: it never goes down "
                          f"(asked {level})")
        hosts = live_hosts(store)
        short = sorted(f"{host} ({record.get('version', 'unknown version')}, up to "
                       f"{record.get('feature_level', BASE)})"
                       for host, record in hosts.items()
                       if not isinstance(record.get("feature_level"), int)
                       or record["feature_level"] < level)
        if short:
            raise Refused(f"feature level {level} is not supported by "
                          + ", ".join(short) + ": upgrade them first")
        if level == current:
            return {"level": current, "previous": current, "hosts": sorted(hosts)}
        result = store.txn([absent(level_key()) if kv is None
                            else modified_at(level_key(), kv.mod_revision)],
                           [Put(level_key(), {"level": level, "time": time.time()})])
        if result.succeeded:
            return {"level": level, "previous": current, "hosts": sorted(hosts)}
    raise Refused("the feature level kept changing under this command: try again")
