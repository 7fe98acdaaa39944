"""What a lease is: its record, names, states, and what it is called in placement.

A lease reserves, from ``start`` to ``end`` (epoch seconds), either

- ``kind: "hosts"``: ``count`` whole hosts (``hosts``: which ones), or
- ``kind: "capacity"``: ``amount`` slots of ``resources`` (a placement spec,
  ``{RC: n}`` per slot; ``slots``: how many slots on which host).

Both may ask for ``required`` traits and (hosts) an ``on`` host glob.  The
record lives at ``leases/<name>``; its calendar entries (``admission.py``)
repeat the window and the assignment for admission.

States: ``pending`` (granted, not started), ``active``, ``degraded`` (active
but short of what it holds: a host died and no replacement fitted),
``ending`` (its end runs), ``ended``, ``error`` (an event failed; it says
why and keeps retrying).

In placement, a host lease's hosts carry :data:`RESERVED_TRAIT` and the
lease's own :func:`lease_trait` while it is active: claims that do not ask
for the lease's trait forbid the reserved one (``requests/placement.py``).
A capacity lease's slots are allocations of consumer :func:`consumer_uuid`
(type ``RESERVATION``) while it is active; a VM booted into it takes its
share of that allocation in one atomic write.
"""
from __future__ import annotations

import hashlib
import re
import time
import uuid as uuidlib

from engine.core import keys
from engine.core.values import declare, shape
from engine.errors import UsageError

__all__ = ["STATES", "LIVE_STATES", "ON_END", "RESERVED_TRAIT", "LEASE_TRAIT_PREFIX",
           "CONSUMER_TYPE", "MAX_WINDOW", "MAX_EVENTS", "check_name", "check_new_name",
           "RESERVED_NAMES", "lease_trait",
           "consumer_uuid", "event", "LEASE", "CALENDAR_ENTRY", "LEASE_VM", "ACTIVE"]

STATES = ("pending", "active", "degraded", "ending", "ended", "error")
LIVE_STATES = ("pending", "active", "degraded", "ending", "error")     # hold capacity
ON_END = ("destroy", "stop", "keep")
RESERVED_TRAIT = "CUSTOM_RESERVED"
LEASE_TRAIT_PREFIX = "CUSTOM_LEASE_"
CONSUMER_TYPE = "RESERVATION"
MAX_WINDOW = 730 * 86400        # two years: the calendar's weeks fit one etcd transaction
MAX_EVENTS = 50                 # a record keeps its newest events only

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_NAMESPACE = uuidlib.UUID("8d3a6f0e-31b4-4d1c-9c5e-5a3e2b1f7c44")


def check_name(name) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(f"bad lease name {name!r}: want 1 to 63 lower-case letters, "
                         "digits, '-', '_' or '.', starting with a letter or digit")
    return name


# names a new lease may not take: the API's path of a lease is /v1/leases/NAME,
# and /v1/leases/calendar is the calendar
RESERVED_NAMES = ("calendar",)


def check_new_name(name) -> str:
    """A good name for a new lease: :func:`check_name`'s, and none of
    :data:`RESERVED_NAMES`."""
    check_name(name)
    if name in RESERVED_NAMES:
        raise UsageError(f"lease name {name!r} is reserved: /v1/leases/{name} is the "
                         "calendar of leases in the HTTP API")
    return name


def lease_trait(name: str) -> str:
    """The trait a host lease's hosts carry while it is active."""
    return LEASE_TRAIT_PREFIX + hashlib.sha1(name.encode()).hexdigest()[:12].upper()


def consumer_uuid(name: str, created: float) -> str:
    """The placement consumer holding a capacity lease's slots (a lease
    deleted and made again under its name gets another one)."""
    return str(uuidlib.uuid5(_NAMESPACE, f"{name}/{created!r}"))


def event(record: dict, what: str, note: str | None = None, now: float | None = None) -> dict:
    """``record`` with one more event (the newest :data:`MAX_EVENTS` kept)."""
    events = [*record.get("events", []), {"event": what, "time": now or time.time(),
                                          **({"note": note} if note else {})}]
    return {**record, "events": events[-MAX_EVENTS:]}


def _lease_problem(value) -> str | None:
    if value["kind"] not in ("hosts", "capacity"):
        return f"kind {value['kind']!r} is neither hosts nor capacity"
    if value["state"] not in STATES:
        return f"state {value['state']!r} is not one of {', '.join(STATES)}"
    if not value["start"] < value["end"]:
        return "its start is not before its end"
    return None


LEASE = shape("lease", _lease_problem, lease=str, kind=str, start=(int, float),
              end=(int, float), state=str)
CALENDAR_ENTRY = shape("lease calendar entry", lease=str, kind=str, start=(int, float),
                       end=(int, float))
ACTIVE = shape("active capacity lease", lease=str, slots=dict, resources=dict)
LEASE_VM = shape("lease VM", uuid=str, name=str)
RESERVED = shape("reserved host", host=str, lease=str)

declare(keys.lease() + "*", LEASE)
declare(keys.lease_calendar() + "*", CALENDAR_ENTRY)
declare(keys.lease_active() + "*", ACTIVE)
declare(keys.lease_vm() + "*", LEASE_VM)
declare(keys.reserved() + "*", RESERVED)
