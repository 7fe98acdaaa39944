"""Every error peerctl raises on purpose, under one root, each concept once.

Cheap to import (nothing but the standard library: no grpc, no libvirt, no
engine module), so the command line can catch classes, never names, before
it has loaded anything else.  ``exit_code`` is what the command line makes
of each: 1 failed, 2 usage, 3 unreachable, 4 permission denied, 130
detached.

    try:
        ...
    except PeerctlError as exc:
        print(f"peerctl: {exc}"); sys.exit(exc.exit_code)
"""
from __future__ import annotations

__all__ = [
    "PeerctlError", "UsageError", "Failed", "Refused", "Unavailable", "StoreUnavailable",
    "StoreRefused", "PlacementUnavailable", "PermissionDenied", "Deposed", "Conflict", "PlacementError",
    "NotFound", "RequestError", "NonDeterminism", "UnknownAutomation", "UnknownTask",
    "NoPeers", "Unreadable", "WorkerFailed", "WatchBroken", "Compacted", "Detached",
    "FieldError", "NoSuch",
]


class PeerctlError(Exception):
    """The root: something peerctl knows how to explain in one line."""
    exit_code = 1


# -- what the command line maps to exit codes -----------------------------------

class UsageError(PeerctlError):
    """Bad input (a flag, spec, pattern, endpoint, config value): the message
    names the bad part.  Nothing was written."""
    exit_code = 2


class FieldError(UsageError):
    """An unknown or missing listing field in ``-o`` or ``--sort``: the
    message names it.  Nothing was written."""


class Detached(PeerctlError):
    """Ctrl-C while following an automation: it goes on without this
    command, which exits 130 (as the shell does for an interrupt)."""
    exit_code = 130


class Failed(PeerctlError):
    """The operation ran and failed.  ``result`` is what is still reported:
    raised by a worker, the automation's result (it ends ``failed`` with this
    message); raised to the command line, the JSON document it prints."""

    def __init__(self, message: str = "", result=None):
        super().__init__(message)
        self.result = result


class NoSuch(Failed):
    """A name or id the caller gave (a lease, a backup, a schedule, an
    automation, a VM) names nothing that exists: exit 1, the API's 404.
    Nothing was written."""


class Refused(Failed):
    """The cluster cannot grant what was asked (a lease that does not fit
    over its window, a boot into a lease that is not active or is full);
    the message says what did not fit, and when it would.  Nothing was
    written."""


class Unavailable(PeerctlError):
    """A service cannot be reached; ``where`` names the endpoint or URL.
    Nothing is known to have been written."""
    exit_code = 3
    service = "a service"

    def __init__(self, message: str = "", where: str | None = None):
        super().__init__(message)
        self.where = where


class StoreUnavailable(Unavailable):
    """etcd did not answer (down, restarting, unreachable, timed out);
    ``timed_out``: it was reached but did not answer in time."""
    service = "etcd"
    timed_out: float | None = None      # the seconds it had, when it timed out


class StoreRefused(StoreUnavailable):
    """etcd answered, and refused for a reason of its own that is not this
    identity's (database space exceeded with a NOSPACE alarm, a request too
    large): the message says what etcd said.  Nothing was written; it may
    succeed again once an operator has acted.  Exit 1: etcd is there."""
    exit_code = 1


class PlacementUnavailable(Unavailable):
    """The configured OpenStack Placement did not answer (refused, reset,
    timed out, 502/503/504)."""
    service = "placement"

    @property
    def url(self) -> str | None:
        return self.where


class PermissionDenied(PeerctlError):
    """etcd refused the request for this identity; ``role`` names it."""
    exit_code = 4

    def __init__(self, message: str = "", role: str | None = None):
        super().__init__(message)
        self.role = role


# -- what the engine and its rooms tell each other ------------------------------

class Deposed(PeerctlError):
    """A leader (initiator, singleton) lost its election: etcd refused its
    fenced write.  It must stop acting at once; the new leader carries on."""


class Conflict(PeerctlError):
    """Someone else got there first; ``reason`` says what to do next.

    - ``concurrent_update``: a provider or consumer changed meanwhile;
      retrying at once may well succeed;
    - ``capacity_exceeded``: a provider can no longer fit the request; take
      an alternate candidate.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class PlacementError(PeerctlError):
    """Bad input to placement: the message names the bad part.  Nothing was
    written."""


class NotFound(PlacementError):
    """A provider or consumer named in the request does not exist."""


class RequestError(PeerctlError):
    """A request failed on its host; the message becomes the response's
    error, for its worker to act on."""


class NonDeterminism(PeerctlError):
    """A worker yielded something else than its log holds at that step."""


class WorkerFailed(PeerctlError):
    """A child worker failed: thrown into its parent at the ``yield`` that
    waited for it, carrying the child's error text.  A parent that does not
    catch it fails with the same text.  Deliberately not a :class:`Failed`:
    a worker's ``except Failed`` is not meant to catch its children."""


class WatchBroken(PeerctlError):
    """A watch stream ended: resume from the last revision seen."""


class Compacted(WatchBroken):
    """The revision a watch wanted to resume from was compacted away: read
    the whole range again, then watch from its revision."""

    def __init__(self, compacted_revision: int):
        super().__init__(f"revision compacted up to {compacted_revision}")
        self.compacted_revision = compacted_revision


class UnknownAutomation(PeerctlError, LookupError):
    """No worker is registered for this automation kind (and version)."""


class UnknownTask(PeerctlError, LookupError):
    """No automation has this id."""


class NoPeers(PeerctlError):
    """No live peer can take part in a new automation."""


class Unreadable(PeerctlError):
    """A value in etcd that cannot be decoded or has the wrong shape:
    skipped by every reader, listed by ``peerctl scrub``."""

    def __init__(self, key: str, why: str, mod_revision: int = 0):
        super().__init__(f"{key}: {why}")
        self.key = key
        self.why = why
        self.mod_revision = mod_revision
