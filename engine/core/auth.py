"""Roles on a cluster's keys, enforced by etcd's own RBAC.

Three roles, each granted on key ranges under ``/peerctl/<cluster>/``:

- ``viewer`` reads everything and writes nothing;
- ``operator`` reads everything and writes what commands write: it starts
  and aborts automations (``auto/``, ``tasks/``, ``member/``), drains
  (``drained/``, ``placement/``), makes and ends leases (``leases/``,
  ``leasecal/``, ``leaseactive/``, ``leasevm/``, ``reserved/``), takes
  VM locks (``locks/``), mints and deletes API tokens (``tokens/``) and
  the page's sessions made from them (``sessions/``, which ``serve --api``
  writes as its own identity), and records what ``cluster verify`` found
  (``verified/``).
  It cannot write what only hosts know: host records, VM records, a
  host's inbox, elections of singletons;
- ``peer`` reads and writes everything of the cluster: a host's peer runs
  any request of any automation, leads them and the singletons.

Roles are etcd-wide names; granting a second cluster adds its ranges to the
same roles.  etcd 3.4 checks no permission for lease grants, compaction,
status or alarms: any user it knows may call them.

:func:`setup` (run as etcd's ``root``) creates the roles, one user per
client certificate (the certificate's CN, with a random password nobody
keeps: the certificate is how it logs in) and enables authentication.  It is
idempotent: run it again to add a cluster or a user.
"""
from __future__ import annotations

import secrets

from . import keys

__all__ = ["ROLES", "OPERATOR_WRITES", "ranges", "setup"]

ROLES = ("peer", "operator", "viewer")

OPERATOR_WRITES = (keys.auto(), keys.task(), keys.member(), keys.drained(),
                   keys.placement(), keys.lease(), keys.lease_calendar(),
                   keys.lease_active(), keys.lease_vm(), keys.reserved(), keys.lock(),
                   keys.token(), keys.session(), keys.verified())


def _end(prefix: bytes) -> bytes:
    """The end of the range of every key starting with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def ranges(cluster: str, role: str) -> list[tuple[str, bytes, bytes]]:
    """``[(READ|WRITE|READWRITE, key, range_end)]`` ``role`` is granted."""
    prefix = f"/peerctl/{cluster}/".encode()
    whole = (prefix, _end(prefix))
    if role == "peer":
        return [("READWRITE", *whole)]
    if role == "viewer":
        return [("READ", *whole)]
    if role == "operator":
        writes = [("READWRITE", prefix + part.encode(), _end(prefix + part.encode()))
                  for part in OPERATOR_WRITES]
        return [("READ", *whole), *writes]
    raise ValueError(f"unknown role {role!r} (want one of {', '.join(ROLES)})")


def setup(store, users: dict[str, str]) -> dict:
    """Roles on ``store``'s cluster, ``users`` ({user: role}, ``root`` among
    them or already in etcd) made and granted, authentication on.  Needs
    etcd's root (or auth still off).  Returns what it did:
    ``{roles: [...], users: {user: role}, enabled: True}``."""
    store.auth_setup(users, {role: ranges(store.cluster, role) for role in ROLES},
                     password=lambda: secrets.token_urlsafe(32))
    return {"roles": list(ROLES), "users": dict(users), "enabled": True}
