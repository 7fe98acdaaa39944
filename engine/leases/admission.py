"""Admission: a lease is granted only if it fits over its whole window,
checked and written in one etcd transaction.

Every lease has a calendar entry in each week its window touches
(``leasecal/<week>/<name>``).  Checking a window reads those weeks in one
transaction (one revision) and the active capacity leases; the grant writes
the record, its entries and the caller's operations (the lease's
automation) comparing that no key of those weeks was written since the
read (``untouched_since``).  A racing grant over overlapping weeks fails the
compare, reads again and sees the winner: nothing is ever double-booked.
The cost follows the leases in the window's weeks, not all leases.

Promises:
- :func:`grant` writes everything or nothing, once even when etcd loses
  the reply; it raises
  :class:`~engine.errors.Refused` (one line: what was asked, what is free,
  who holds the rest, when it would fit), ``UsageError`` (a name taken, a
  window in the past) or ``Conflict`` (lost too many races);
- :func:`reschedule` moves the end, checking only the added time, against
  everything but the lease itself (an active lease's own slots count once);
  a refusal names only what holds the hosts that fall short;
  :func:`replace_host` swaps a dead host of a host lease for
  a free one; both are guarded the same way;
- :func:`release_ops` / :func:`activate_ops`: the writes that drop a
  lease's entries, or mark a capacity lease as held in placement.
"""
from __future__ import annotations

import fnmatch
import math
import random
import time

from engine.core import keys
from engine.core.hosts import live_host_names
from engine.core.store import Delete, Get, Put, absent, modified_at, untouched_since
from engine.core.values import readable
from engine.errors import Conflict, Refused, UsageError
from engine.placement.model import DISABLED_TRAIT

from .model import MAX_WINDOW, event
from .times import iso

__all__ = ["grant", "reschedule", "replace_host", "release_ops", "activate_ops",
           "overlapping", "fit_hosts", "fit_capacity", "WEEK"]

WEEK = 7 * 86400
RACES = 30
HINT_HORIZON = 60 * 86400       # how far "it would fit from" looks


def _week(t: float) -> int:
    return int(t // WEEK)


def _weeks(start: float, end: float) -> range:
    return range(_week(start), _week(max(start, end - 1e-6)) + 1)


def _entry(record: dict) -> dict:
    entry = {"lease": record["lease"], "kind": record["kind"], "start": record["start"],
             "end": record["end"]}
    if record["kind"] == "hosts":
        entry["hosts"] = list(record.get("hosts", []))
    else:
        entry.update(slots=dict(record.get("slots", {})), resources=dict(record["resources"]))
    return entry


def _window(store, start: float, end: float) -> tuple[dict, list, int, range]:
    """Calendar entries overlapping ``[start, end)`` by lease, the active
    capacity leases, the read's revision and the weeks read."""
    weeks = _weeks(start, end)
    result = store.txn([], [Get(keys.lease_calendar(w), True) for w in weeks]
                       + [Get(keys.lease_active(), True)])
    found = {}
    for kvs in result.ranges[:-1]:
        for kv in kvs:
            entry = readable(kv)
            if entry is not None and entry["start"] < end and entry["end"] > start:
                found[entry["lease"]] = entry
    active = [a for a in (readable(kv) for kv in result.ranges[-1]) if a is not None]
    return found, active, result.revision, weeks


def overlapping(store, start: float, end: float) -> list[dict]:
    """Calendar entries of the leases whose windows overlap ``[start, end)``."""
    return sorted(_window(store, start, end)[0].values(), key=lambda e: (e["start"], e["lease"]))


def _guard(weeks: range, revision: int):
    return untouched_since(keys.lease_calendar(weeks.start),
                           keys.lease_calendar(weeks.stop), revision)


# -- who is free: pure functions ----------------------------------------------------

def _hosts(providers: list[dict], alive: set, drained: set, required: str | None,
           on: str | None) -> dict[str, dict]:
    """Host providers (roots named like a live host) that may hold a lease."""
    wanted = [t for t in (required or "").split(",") if t]
    hosts = {}
    for p in providers:
        if p.get("parent") or p["name"] not in alive or p["name"] in drained:
            continue
        traits = set(p["traits"])
        if DISABLED_TRAIT in traits or not fnmatch.fnmatchcase(p["name"], on or "*"):
            continue
        if any((t[1:] in traits) if t.startswith("!") else (t not in traits) for t in wanted):
            continue
        hosts[p["name"]] = p
    return hosts


def _capacity(provider: dict) -> dict:
    return {rc: (inv["total"] - inv.get("reserved", 0)) * inv.get("allocation_ratio", 1.0)
            for rc, inv in provider["inventories"].items()}


def fit_hosts(lease: dict, hosts: dict, others: list[dict]) -> tuple[list[str], dict]:
    """Up to ``count`` free hosts (empty ones first) and who holds the others."""
    held: dict[str, str] = {}
    for other in others:
        for host in other.get("hosts") or other.get("slots") or ():
            held.setdefault(host, other["lease"])
    free = [h for h in hosts if h not in held and h not in lease.get("avoid", ())]
    free.sort(key=lambda h: (sum(hosts[h]["usages"].values()) > 0,
                             sum(hosts[h]["usages"].values()), h))
    return free[:lease["count"]], {h: held[h] for h in hosts if h in held}


def fit_capacity(lease: dict, hosts: dict, others: list[dict],
                 active: list[dict]) -> dict[str, int]:
    """Slots per host for ``amount`` slots of ``resources`` (as many as fit)."""
    slot = lease["resources"]
    blocked = {h for o in others if o["kind"] == "hosts" for h in o.get("hosts", ())}
    fits = {}
    for name, provider in hosts.items():
        if name in blocked:
            continue
        free = _capacity(provider)
        used = dict(provider["usages"])
        for a in active:            # held in placement now: counted by the calendar instead
            for rc, n in a["resources"].items():
                used[rc] = used.get(rc, 0) - n * a["slots"].get(name, 0)
        for o in others:
            if o["kind"] == "capacity":
                for rc, n in o["resources"].items():
                    used[rc] = used.get(rc, 0) + n * o["slots"].get(name, 0)
        counts = [math.floor((free.get(rc, 0) - max(used.get(rc, 0), 0)) / n)
                  for rc, n in slot.items() if n > 0]
        fits[name] = max(0, min(counts)) if counts else 0
    chosen, left = {}, lease["amount"]
    for name in sorted(fits, key=lambda h: (-fits[h], h)):
        if left <= 0 or fits[name] <= 0:
            continue
        chosen[name] = min(fits[name], left)
        left -= chosen[name]
    return chosen


# -- reading what placement and the hosts say ------------------------------------------

def _cluster(store, placement, lease: dict) -> dict:
    alive = live_host_names(store)
    drained = {keys.suffix(kv.key, keys.drained())
               for kv in store.range(keys.drained(), keys_only=True)[0]}
    return _hosts(placement.providers(), alive, drained, lease.get("required"),
                  lease.get("on") if lease["kind"] == "hosts" else None)


def _fit(lease: dict, hosts: dict, others: list[dict], active: list[dict]):
    """``(assignment, why)``: hosts or slots when it fits, else None and the reason."""
    if lease["kind"] == "hosts":
        chosen, held = fit_hosts(lease, hosts, others)
        if len(chosen) == lease["count"]:
            return sorted(chosen), None
        holders = sorted({o["lease"] for o in others
                          if set(o.get("hosts") or o.get("slots") or ()) & set(held)})
        why = (f"needs {lease['count']} host{'s' if lease['count'] != 1 else ''}"
               + (f" with {lease['required']}" if lease.get("required") else "")
               + (f" on {lease['on']!r}" if lease.get("on") else "")
               + f" over {iso(lease['start'])}..{iso(lease['end'])}; {len(chosen)} "
               + ("is" if len(chosen) == 1 else "are") + " free"
               + (f" ({', '.join(sorted(held))} held by lease{'s' if len(holders) > 1 else ''} "
                  f"{', '.join(holders)})" if held else ""))
        return None, why
    chosen = fit_capacity(lease, hosts, others, active)
    got = sum(chosen.values())
    if got == lease["amount"]:
        return chosen, None
    spec = ",".join(f"{rc}:{n}" for rc, n in sorted(lease["resources"].items()))
    holders = sorted({o["lease"] for o in others})
    return None, (f"needs {lease['amount']} slots of {spec}"
                  + (f" with {lease['required']}" if lease.get("required") else "")
                  + f" over {iso(lease['start'])}..{iso(lease['end'])}; {got} fit"
                  + (f" (leases {', '.join(holders)} hold the rest)" if holders else ""))


def _when_it_fits(store, lease: dict, hosts: dict, others: list[dict]) -> str:
    span = lease["end"] - lease["start"]
    for start in sorted({o["end"] for o in others if o["end"] > lease["start"]}):
        if start - lease["start"] > HINT_HORIZON:
            break
        found, active, _, _ = _window(store, start, start + span)
        found.pop(lease["lease"], None)
        if _fit({**lease, "start": start, "end": start + span}, hosts,
                list(found.values()), active)[0] is not None:
            return f"it would fit from {iso(start)}"
    return f"it would not fit within {HINT_HORIZON // 86400} days"


def _check_window(start: float, end: float, now: float) -> None:
    if end <= start:
        raise UsageError(f"the lease must end after it starts ({iso(end)} is not after "
                         f"{iso(start)})")
    if end - start > MAX_WINDOW:
        raise UsageError(f"a lease lasts at most {MAX_WINDOW // 86400} days")
    if start < now - 60:
        raise UsageError(f"the lease starts in the past ({iso(start)})")


def _backoff(attempt: int) -> None:
    time.sleep(random.uniform(0, 0.005 * (attempt + 1)))


# -- writing -------------------------------------------------------------------------

def _entry_ops(record: dict, weeks, old_weeks=()) -> list:
    ops = [Put(keys.lease_calendar(w, record["lease"]), _entry(record)) for w in weeks]
    ops += [Delete(keys.lease_calendar(w, record["lease"])) for w in old_weeks
            if w not in weeks]
    return ops


def grant(store, placement, lease: dict, extra_ops=(), now: float | None = None) -> dict:
    """Write ``lease`` (state ``pending``, with its ``hosts`` or ``slots``)
    and ``extra_ops`` if it fits over its window; see the module's promises."""
    now = time.time() if now is None else now
    _check_window(lease["start"], lease["end"], now)
    name = lease["lease"]
    for attempt in range(RACES):
        hosts = _cluster(store, placement, lease)
        found, active, revision, weeks = _window(store, lease["start"], lease["end"])
        if name in found or store.get(keys.lease(name)) is not None:
            raise UsageError(f"lease {name} exists")
        others = list(found.values())
        assignment, why = _fit(lease, hosts, others, active)
        if assignment is None:
            raise Refused(f"lease {name}: {why}; {_when_it_fits(store, lease, hosts, others)}")
        record = {**lease, "state": "pending", "granted": now,
                  ("hosts" if lease["kind"] == "hosts" else "slots"): assignment}
        ops = [Put(keys.lease(name), record), *_entry_ops(record, weeks), *extra_ops]
        if store.txn_once([_guard(weeks, revision), absent(keys.lease(name))], ops,
                          proof=keys.lease(name)):
            return record
        placement.races_lost += 1
        _backoff(attempt)
    raise Conflict("concurrent_update", f"lease {name}: lost {RACES} races for the calendar")


def reschedule(store, placement, name: str, end: float, now: float | None = None) -> dict:
    """The lease ends at ``end`` instead; a later end must be free for the
    lease's own hosts or slots over the added time."""
    now = time.time() if now is None else now
    for attempt in range(RACES):
        kv = store.get(keys.lease(name))
        record = readable(kv)
        if record is None:
            raise UsageError(f"no lease {name!r}")
        if record["state"] in ("ending", "ended"):
            raise Refused(f"lease {name} has ended")
        if end <= max(now, record["start"]):
            raise UsageError(f"the new end {iso(end)} is not after "
                             f"{'now' if now > record['start'] else 'the start'}")
        if end - record["start"] > MAX_WINDOW:
            raise UsageError(f"a lease lasts at most {MAX_WINDOW // 86400} days")
        old_weeks = _weeks(record["start"], record["end"])
        weeks = _weeks(record["start"], end)
        compares = [modified_at(kv.key, kv.mod_revision)]
        if end > record["end"]:
            found, active, revision, added = _window(store, record["end"], end)
            found.pop(name, None)
            mine = set(record.get("hosts") or record.get("slots") or ())
            if record["kind"] == "hosts":
                clash = {h: o["lease"] for o in found.values()
                         for h in (o.get("hosts") or o.get("slots") or ()) if h in mine}
                if clash:
                    raise Refused(f"lease {name} cannot run to {iso(end)}: "
                                  + ", ".join(f"{h} is held by lease {lease}"
                                              for h, lease in sorted(clash.items())))
            else:
                short, gone = _short_hosts(store, placement, record, end, found, active)
                if short:
                    raise Refused(f"lease {name} cannot run to {iso(end)}: its slots on "
                                  f"{', '.join(short)} are taken then "
                                  f"({_in_the_way(short, gone, found)})")
            compares.append(_guard(added, revision))
        new = {**record, "end": end}
        ops = [Put(kv.key, new), *_entry_ops(new, weeks, old_weeks)]
        if store.txn(compares, ops).succeeded:
            return new
        _backoff(attempt)
    raise Conflict("concurrent_update", f"lease {name}: lost {RACES} races for the calendar")


def _short_hosts(store, placement, record: dict, end: float, found: dict,
                 active: list[dict]) -> tuple[list[str], set[str]]:
    """The hosts where a capacity lease's own slots do not fit from its end
    to ``end``, and those of them that cannot hold a lease now (dead,
    drained, disabled).  Checked against everything but the lease itself:
    its calendar entry is not in ``found``, and while it is active its
    allocation is in ``active``, so that placement's usage counts its slots
    once (as its own), not twice."""
    mine = set(record.get("slots") or ())
    hosts = {h: p for h, p in _cluster(store, placement, record).items() if h in mine}
    extra = {**record, "start": record["end"], "end": end, "amount": 10 ** 9}
    fits = fit_capacity(extra, hosts, list(found.values()), active)
    short = sorted(h for h, n in record["slots"].items() if fits.get(h, 0) < n)
    return short, {h for h in short if h not in hosts}


def _in_the_way(short: list[str], gone: set[str], found: dict) -> str:
    """What holds the ``short`` hosts over the added time: the leases whose
    hosts or slots are there, hosts that cannot hold a lease, else the VMs
    that use them now."""
    holders = sorted({o["lease"] for o in found.values()
                      if set(o.get("hosts") or o.get("slots") or ()) & set(short)})
    why = []
    if holders:
        why.append(f"held by lease{'s' if len(holders) > 1 else ''} {', '.join(holders)}")
    if gone:
        why.append(f"{', '.join(sorted(gone))} cannot hold a lease now (dead, drained or "
                   "disabled)")
    return "; ".join(why) or "used now by VMs outside leases"


def replace_host(store, placement, name: str, gone: str, now: float | None = None) -> str | None:
    """A free host in place of ``gone`` for the rest of the window; None when none fits."""
    now = time.time() if now is None else now
    for attempt in range(RACES):
        kv = store.get(keys.lease(name))
        record = readable(kv)
        if record is None or record["kind"] != "hosts" or gone not in record.get("hosts", []):
            return None
        start = max(now, record["start"])
        hosts = _cluster(store, placement, record)
        found, _, revision, weeks = _window(store, start, record["end"])
        found.pop(name, None)
        chosen, _ = fit_hosts({**record, "count": 1, "avoid": record["hosts"]}, hosts,
                              list(found.values()))
        if not chosen:
            return None
        # the swap and its event in one write: nobody sees one without the other
        new = event({**record, "hosts": sorted([h for h in record["hosts"] if h != gone] + chosen)},
                    "replaced", f"{gone} is gone: {chosen[0]} took its place", now)
        all_weeks = _weeks(record["start"], record["end"])
        ops = [Put(kv.key, new), *_entry_ops(new, all_weeks)]
        if store.txn([modified_at(kv.key, kv.mod_revision), _guard(weeks, revision)],
                     ops).succeeded:
            return chosen[0]
        _backoff(attempt)
    return None


def release_ops(record: dict) -> list:
    return [*(Delete(keys.lease_calendar(w, record["lease"]))
              for w in _weeks(record["start"], record["end"])),
            Delete(keys.lease_active(record["lease"]))]


def activate_ops(record: dict) -> list:
    if record["kind"] != "capacity":
        return []
    return [Put(keys.lease_active(record["lease"]),
                {"lease": record["lease"], "slots": dict(record.get("slots", {})),
                 "resources": dict(record["resources"])})]
