"""The requests of a lease's life (see ``automations/leases.py``), each the
function of the same name in :mod:`engine.leases.events` (arguments and
promises there)."""
from engine.core.handlers import handler
from engine.leases import events

for _name in ("lease_read", "lease_start", "lease_heal", "lease_warn", "lease_end",
              "lease_note", "lease_release", "lease_claim", "lease_return"):
    handler(_name)(getattr(events, _name))
