"""Draining hosts: no new VM is placed on a drained host; its VMs stay.

The operator's word is ``drained/<host>`` in etcd (listings read it, with
the host records); placement is told too, so that no claim fits there
(reserved = total and trait ``COMPUTE_STATUS_DISABLED``, see
:meth:`engine.placement.api.Placement.drain`), whichever backend runs.

Promises:
- :func:`set_drained` writes the key first when draining and drops it first
  when undraining, then tells placement; repeating it is harmless, so an
  interrupted call is finished by calling it again;
- a peer starting up brings its provider in line with the key
  (:func:`align`), so a drain that was interrupted between the two writes,
  or made while the peer was away, holds once the peer is back;
- undraining moves no VM back, and once :func:`set_drained` returns, any
  boot sees the hosts open (claims place on views up to
  ``CLAIM_VIEW_AGE`` old: it waits that out once, whatever the hosts).
"""
from __future__ import annotations

import time

from engine.core import keys
from engine.core.store import Delete, Put
from engine.core.values import readable
from engine.errors import NotFound
from engine.placement import open_placement

__all__ = ["set_drained", "drained_hosts", "align"]


def drained_hosts(store) -> set[str]:
    """The hosts an operator drained."""
    return {keys.suffix(kv.key, keys.drained()) for kv in store.range(keys.drained())[0]
            if readable(kv) is not None}


def set_drained(store, hosts: list[str], drained: bool = True, *, by: str | None = None,
                placement=None) -> list[dict]:
    """Drain (or undrain) each of ``hosts``: ``[{host, drained}]``."""
    own = placement is None
    placement = placement or open_placement(None, store)
    try:
        done = []
        for host in hosts:
            if drained:
                store.txn([], [Put(keys.drained(host), {"host": host, "time": time.time(),
                                                         "by": by})])
            else:
                store.txn([], [Delete(keys.drained(host))])
            _tell_placement(placement, host, drained, settle=False)
            done.append({"host": host, "drained": drained})
        placement.settle()      # once for all: any claim placed from now on sees them open
        return done
    finally:
        if own:
            placement.close()


def align(store, placement, host: str) -> bool:
    """Make ``host``'s provider drained exactly when ``drained/<host>`` says
    so; returns whether it is drained."""
    drained = readable(store.get(keys.drained(host))) is not None
    _tell_placement(placement, host, drained)
    return drained


def _tell_placement(placement, host: str, drained: bool, settle: bool = True) -> None:
    try:
        placement.drain(host, drained, settle=settle)
    except NotFound:
        pass        # no provider yet: the peer aligns it when it registers
