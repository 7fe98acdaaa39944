"""Upgrade: hosts moved to another release of peerctl one at a time
(``automations/upgrade.py``), back to the release each ran before
(``--rollback``), and the cluster's feature level (docs/upgrade.md).

Promises:
- a bad HOSTGLOB or ``parallel`` is a ``UsageError`` before anything is
  read; an unknown or incomplete release, a HOSTGLOB matching no live host,
  an upgrade already running, and a rollback once the feature level is
  above what a host's previous release supports are one line each (exit 1),
  nothing started;
- hosts are taken in natural name order; those already on the release are
  listed as such and are not handed over again;
- the feature level is shown with every live host's version and level, and
  raised only when every live host supports it (:mod:`engine.core.features`).
"""
from __future__ import annotations

import fnmatch

from engine.errors import Failed, UsageError
from engine.wording import given

from .plans import Plan
from .select import host_pattern

__all__ = ["plan_upgrade", "plan_rollback", "feature_level", "raise_feature_level",
           "HOST_FIELDS"]

HOST_FIELDS = ["host", "from", "to", "state", "out_of_service_s", "error"]
MAX_PARALLEL = 16


def _parallel(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLEL:
        raise UsageError(f"bad {given('parallel', value)} (1 to {MAX_PARALLEL})")
    return value


def _live(ctx, glob: str) -> tuple[list[dict], list[str]]:
    """The records of the live hosts matching ``glob``, and the names of
    every live host (those the waits may run on), in natural order."""
    from engine.core.hosts import live_hosts
    from engine.natural import natural_key
    hosts = live_hosts(ctx.store())
    chosen = [dict(record, host=name) for name, record in hosts.items()
              if fnmatch.fnmatchcase(name, glob)]
    if not chosen:
        raise Failed(f"no live host matches {glob!r}")
    return (sorted(chosen, key=lambda r: natural_key(r["host"])),
            sorted(hosts, key=natural_key))


def _refuse_second(ctx) -> None:
    from engine.core.api import running_kinds
    running = running_kinds(ctx.store(), ("upgrade",))
    if running:
        raise Failed(f"upgrade {running[0]} is running: wait for it (peerctl.py wait "
                     f"{running[0]}) or abort it first")


def plan_upgrade(ctx, release: str, hostglob: str | None = None, *, parallel: int = 1,
                 deadline: float | None = None) -> Plan:
    """Hand the live hosts matching ``hostglob`` over to ``release`` (as
    ``code list`` names it), ``parallel`` at a time."""
    glob = host_pattern(hostglob)
    _parallel(parallel)
    if not isinstance(release, str) or not release:
        raise UsageError("--to needs a release (code list shows them)")
    from engine.releases import catalog
    catalog.get(ctx.store(), release)       # unknown or incomplete: one line
    hosts, watchers = _live(ctx, glob)
    _refuse_second(ctx)
    rows = [{"host": h["host"], "from": h.get("version"), "to": release,
             "state": "current" if h.get("release") == release else "planned"} for h in hosts]
    return _plan(rows, {"release": release}, parallel, deadline, watchers)


def plan_rollback(ctx, hostglob: str | None = None, *, parallel: int = 1,
                  deadline: float | None = None) -> Plan:
    """Return each live host matching ``hostglob`` that ran another release
    before to that release; refused while the cluster's feature level is
    above what one of them supports."""
    glob = host_pattern(hostglob)
    _parallel(parallel)
    from engine.core import features
    live, watchers = _live(ctx, glob)
    hosts = [h for h in live if h.get("previous")]
    if not hosts:
        raise Failed(f"no live host matching {glob!r} has a previous release to go back to")
    level = features.cluster_level(ctx.store())
    short = [f"{h['host']} ({h['previous'].get('version')}, up to "
             f"{h['previous'].get('feature_level')})" for h in hosts
             if (h["previous"].get("feature_level") or features.BASE) < level]
    if short:
        raise Failed(f"the cluster's feature level is {level}: the previous release of "
                     + ", ".join(short) + " does not support it; rollback is possible only "
                     "before the level is raised")
    _refuse_second(ctx)
    rows = [{"host": h["host"], "from": h.get("version"),
             "to": h["previous"].get("release") or h["previous"].get("version"),
             "state": "planned"} for h in hosts]
    return _plan(rows, {"release": None, "rollback": True}, parallel, deadline, watchers)


def _plan(rows: list[dict], target: dict, parallel: int, deadline: float | None,
          watchers: list[str]) -> Plan:
    """The ``upgrade`` automation over the hosts of ``rows``, to ``target``
    (``{release}``, or a rollback's)."""
    from engine.releases.handover import DEFAULT_DEADLINE
    args = {"hosts": [row["host"] for row in rows], **target, "parallel": parallel,
            "deadline": float(deadline or DEFAULT_DEADLINE), "watchers": watchers}
    return Plan("upgrade", args, rows, ask=True, what="hosts", key="hosts")


def feature_level(ctx) -> dict:
    """``{level, supported, hosts: [{host, version, feature_level}]}``:
    the cluster's level, the highest every live host supports, each host."""
    from engine.core import features
    from engine.core.hosts import live_hosts
    from engine.natural import natural_key
    store = ctx.store()
    level = features.cluster_level(store)
    hosts = sorted(({"host": name, "version": r.get("version"),
                     "feature_level": r.get("feature_level")}
                    for name, r in live_hosts(store).items()),
                   key=lambda r: natural_key(r["host"]))
    levels = [h["feature_level"] if isinstance(h["feature_level"], int) else features.BASE
              for h in hosts]
    return {"level": level, "supported": min(levels) if levels else None, "hosts": hosts}


def raise_feature_level(ctx, level: int) -> dict:
    from engine.core import features
    done = features.raise_level(ctx.store(), level)
    return {**feature_level(ctx), "previous": done["previous"]}
