"""What the ``lease`` commands and ``boot --reservation`` do, below the
command line: each function checks, writes, and returns lease records; it
raises :class:`UsageError` for bad input, :class:`Refused` for what the
cluster cannot grant, :class:`Failed` for what went wrong, always before
writing anything it cannot finish.

- :func:`create`: the lease and the automation that carries it, granted in
  one etcd transaction against every other lease (``admission.grant``);
- :func:`extend`: a new end, checked against the calendar, then the
  automation is nudged;
- :func:`delete`: the lease ends now (its ``on_end`` policy applied by its
  automation) and is forgotten; when its automation cannot do it (ended,
  failed, or nobody answers within ``wait``), the capacity is freed here;
- :func:`boot_into`: what a VM booted into the lease needs (traits) after
  checking that the lease is active and the VM fits one of its slots.
"""
from __future__ import annotations

import time

from engine.core import api, keys
from engine.errors import Failed, NoSuch, Refused, UsageError
from engine.wording import option, value

from . import admission, records
from .model import (MAX_WINDOW, ON_END, check_new_name, consumer_uuid, event,
                    lease_trait)
from .times import human_span, iso

__all__ = ["create", "extend", "delete", "boot_into", "TERMINAL"]

TERMINAL = ("done", "failed", "aborted", "stuck")


def create(store, placement, name: str, start: float, end: float, *, count: int | None = None,
           resources: dict | None = None, amount: int | None = None,
           required: str | None = None, on: str | None = None, on_end: str = "destroy",
           warn: float | None = None, now: float | None = None) -> dict:
    check_new_name(name)
    now = time.time() if now is None else now
    if (count is None) == (resources is None):
        raise UsageError(f"say what the lease holds: {option('hosts')} N, or "
                         f"{option('resources')} SPEC {option('amount')} K")
    if resources is not None and not amount:
        raise UsageError(f"a capacity lease needs {option('amount')} K (how many slots of SPEC)")
    if on_end not in ON_END:
        raise UsageError(f"bad {option('on_end')} {value(on_end)}: want one of {', '.join(ON_END)}")
    if end <= start:
        raise UsageError(f"the lease must end after it starts ({iso(end)} is not after "
                         f"{iso(start)})")
    if end - start > MAX_WINDOW:
        raise UsageError(f"a lease lasts at most {human_span(MAX_WINDOW)}")
    if end <= now:
        raise UsageError(f"the lease would end in the past ({iso(end)})")
    if warn is not None and warn >= end - max(start, now):
        raise UsageError(f"{option('warn')} {human_span(warn)} is not shorter than the lease")
    start = max(start, now)
    if records.read(store, name) is not None:
        raise Failed(f"lease {name} exists (lease delete {name} first)")
    created = time.time()
    automation, _, ops = api.automation_ops(store, "lease", {"name": name})
    lease = {"lease": name, "kind": "hosts" if count is not None else "capacity",
             "start": start, "end": end, "required": required or None, "on": on,
             "on_end": on_end, "warn": warn, "automation": automation, "created": created,
             "events": [{"event": "granted", "time": created}]}
    if count is not None:
        lease["count"] = count
    else:
        lease.update(resources=resources, amount=amount,
                     consumer=consumer_uuid(name, created))
    return admission.grant(store, placement, lease, extra_ops=ops, now=now)


def _live(name: str, store) -> dict:
    record = records.read(store, name)
    if record is None:
        raise NoSuch(f"no lease {name!r}")
    return record


def extend(store, placement, name: str, end: float) -> dict:
    """A new end (later or earlier); the automation wakes to it."""
    record = _live(name, store)
    if record["state"] in ("ending", "ended"):
        raise Failed(f"lease {name} has ended")
    record = admission.reschedule(store, placement, name, end)
    if record.get("automation"):
        api.nudge(store, record["automation"], f"new end {iso(end)}")
    return records.update(store, name, lambda r: event(
        r, "rescheduled", f"ends at {iso(end)}")) or record


def delete(store, placement, name: str, wait: float = 120.0, on_progress=None) -> dict:
    """End the lease now and forget it; ``{lease, state: "deleted", freed_by}``."""
    record = _live(name, store)
    automation = record.get("automation")
    state = _task_state(store, automation)
    if record["state"] != "ended" and state not in TERMINAL and state is not None:
        records.update(store, name, lambda r: event({**r, "deleting": True}, "deleting")
                       if not r.get("deleting") else r)
        api.nudge(store, automation, "deleted")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            state = _task_state(store, automation)
            if on_progress:
                on_progress(state)
            if state in TERMINAL or state is None or records.read(store, name) is None:
                break
            time.sleep(0.2)
    if records.read(store, name) is None:
        return {"lease": name, "state": "deleted", "freed_by": "automation"}
    records.release(store, placement, name, forget=True)    # idempotent, whoever else runs
    if automation and _task_state(store, automation) not in TERMINAL + (None,):
        api.abort(store, automation, wait=5.0, cleanup_wait=5.0)
    return {"lease": name, "state": "deleted", "freed_by": "command"}


def _task_state(store, automation: str | None) -> str | None:
    if not automation:
        return None
    kv = store.get(keys.status(automation))
    return (kv.value or {}).get("state") if kv is not None and isinstance(kv.value, dict) \
        else None


def boot_into(store, name: str, resources: dict) -> list[str]:
    """The traits a VM booted into lease ``name`` requires (the lease's own,
    for a host lease, so that moves keep it there); refused unless the
    lease is active and, for a capacity lease, the VM fits one slot."""
    record = records.read(store, name)
    if record is None:
        raise Refused(f"no lease {name!r}")
    if record["state"] == "pending":
        raise Refused(f"lease {name} has not started (it starts at {iso(record['start'])})")
    if record["state"] not in ("active", "degraded"):
        raise Refused(f"lease {name} is {record['state']}: VMs boot into it only while active")
    if record["kind"] == "hosts":
        return [lease_trait(name)]
    slot = record.get("resources") or {}
    over = [f"{rc}:{n} (a slot has {slot.get(rc, 0)})" for rc, n in sorted(resources.items())
            if n > slot.get(rc, 0)]
    if over:
        raise Refused(f"the VM does not fit a slot of lease {name}: " + ", ".join(over))
    return []
