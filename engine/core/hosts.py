"""Which hosts are alive: the one rule every part of peerctl that picks or
counts live hosts applies.

A host is alive while its peer holds ``hosts/<host>`` under the peer's
session lease.  Promises:

- a ``hosts/`` key counts only when it is bound to a lease (etcd deletes a
  key whose lease expired, so a bound key's lease is live), its value is a
  host record in shape, and the record names the host its key names: a
  value put by hand, with no lease or a wrong ``host``, is never a live
  host, wherever hosts are picked (ping, boot, moves, HA, leases);
- a key that does not count is reported once per process, saying why
  (``engine.core.values.report``: a peer logs it, a command prints one
  warning line), never raised;
- it reads once; callers that need the records get them, callers that need
  names get a set.
"""
from __future__ import annotations

from . import keys
from .values import readable, report

__all__ = ["live_hosts", "live_host_names", "is_live_record", "why_not_live"]


def why_not_live(kv) -> str | None:
    """Why ``kv`` (a ``hosts/`` key as read) is no live host's record, or
    None when it is one.  A value of the wrong shape is reported by
    :func:`readable` itself."""
    record = readable(kv)
    if record is None:
        return "unreadable"
    name = keys.suffix(kv.key, keys.host())
    if not kv.lease:
        why = "bound to no lease: no peer holds it, not a live host"
    elif not isinstance(record.get("host"), str):
        why = "names no host ('host' is no name): not a live host"
    elif record["host"] != name:
        why = f"names host {record['host']!r}, not {name!r}: not a live host"
    else:
        return None
    report(kv.key, why)
    return why


def is_live_record(kv) -> bool:
    """``kv`` (a ``hosts/`` key as read) is a live host's record."""
    return why_not_live(kv) is None


def live_hosts(store) -> dict[str, dict]:
    """``{host: record}`` of every live host."""
    kvs, _ = store.range(keys.host())
    return {keys.suffix(kv.key, keys.host()): kv.value for kv in kvs if is_live_record(kv)}


def live_host_names(store) -> set[str]:
    """The names of every live host."""
    return set(live_hosts(store))
