"""peerctl's placement service: where may this VM go, and claim it there.

Resource providers, inventories, traits, aggregates, nested providers,
allocation candidates and claims with generations, as OpenStack Placement
defines them, over one of two backends chosen by configuration:

- ``etcd`` (default): kept in the cluster's etcd beside everything else;
  claims are single etcd transactions (see :mod:`engine.placement.etcd`);
- an OpenStack Placement URL: the same interface over its REST API at
  microversion 1.39 (see :mod:`engine.placement.rest`).

    placement = open_placement(None, store)              # etcd, or $PEERCTL_PLACEMENT
    placement = open_placement("http://127.0.0.1:8778")  # OpenStack Placement
    best, *alternates = placement.candidates("VCPU:1,MEMORY_MB:256", limit=5)
    placement.claim(vm_uuid, best["allocations"], project=p, user=u)
"""
from __future__ import annotations

import contextlib
import os

from engine.placement.api import ANY, Placement
from engine.errors import Conflict, NotFound, PlacementError, PlacementUnavailable, RequestError
from engine.placement.query import Query, RequestGroup, parse_query

__all__ = ["open_placement", "configure", "for_request", "Placement", "PlacementError", "Conflict", "NotFound",
           "PlacementUnavailable",
           "ANY", "Query", "RequestGroup", "parse_query"]


_configured = None


def configure(config) -> None:
    """This process's backend, for every ``open_placement(None, ...)``: the
    command line sets it from its settings (the config file's
    ``placement``, or ``$PEERCTL_PLACEMENT``), so a peer's handlers use it."""
    global _configured
    _configured = config


def open_placement(config=None, store=None) -> Placement:
    """The configured backend.

    ``config``: None (the one :func:`configure` set, else ``$PEERCTL_PLACEMENT``,
    default ``etcd``), ``"etcd"``,
    an ``http(s)://`` URL of an OpenStack Placement API, or a mapping
    ``{"backend": "etcd"|"openstack", "url": ..., "token": ...}``.
    ``store`` (an :class:`engine.core.store.Store`) is needed for etcd.
    """
    if config is None:
        config = _configured or os.environ.get("PEERCTL_PLACEMENT") or "etcd"
    if isinstance(config, str):
        config = ({"backend": "openstack", "url": config}
                  if config.startswith(("http://", "https://")) else {"backend": config})
    backend = config.get("backend", "etcd")
    if backend == "etcd":
        if store is None:
            raise PlacementError("the etcd placement backend needs a store")
        from engine.placement.etcd import EtcdPlacement
        return EtcdPlacement(store)
    if backend in ("openstack", "rest"):
        from engine.placement.rest import RestPlacement
        if not config.get("url"):
            raise PlacementError("the openstack placement backend needs a url")
        return RestPlacement(config["url"], token=config.get("token", "admin"))
    raise PlacementError(f"unknown placement backend {backend!r} (want etcd or a URL)")


@contextlib.contextmanager
def for_request(store):
    """The cluster's placement for a request handler: its refusals (bad
    input, a lost race, the service unreachable) raised as the request's
    :class:`RequestError`, and the connection closed."""
    placement = open_placement(None, store)
    try:
        yield placement
    except (PlacementError, PlacementUnavailable, Conflict) as exc:
        raise RequestError(str(exc)) from None
    finally:
        placement.close()
