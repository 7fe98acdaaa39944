"""The steps of a lease's life, as requests (``requests/leases.py``).

Each is idempotent: run twice (a step re-sent after its executor died), it
finds the first run's work and changes nothing more.  Each answers the
lease's record as it left it, so that the ``lease`` automation
(``automations/leases.py``) decides from logged answers only.

- ``lease_read {name}``: ``{record}`` (None once deleted);
- ``lease_start {name}``: replaces dead hosts, holds the reservation
  (traits and ``reserved/`` marks, or the reservation consumer's
  allocation), state ``active`` (``degraded`` when short), event
  ``started``; ``{record, foreign}``: VMs not in the lease on its hosts;
- ``lease_heal {name}``: a host lease whose hosts died takes replacements,
  or turns ``degraded``;
- ``lease_warn {name}``: the warning before the end (event ``warning``);
- ``lease_end {name}``: state ``ending``; ``{record, vms}`` booted into it;
- ``lease_note {name, state?, error?, uncleared?}``: what went wrong;
- ``lease_release {name, forget?}``: everything freed, state ``ended``;
- ``lease_claim {lease, consumer, resources, required?, exclude?, name?}``:
  a VM's claim inside the lease (``boot --reservation``);
- ``lease_return {lease, consumer}``: a VM that was never built gives its
  share back to the lease.
"""
from __future__ import annotations

import functools
import time

from engine.placement import groups
from engine.core import keys
from engine.core.hosts import live_host_names
from engine.core.values import readable
from engine.errors import Conflict, NotFound, RequestError
from engine.placement import for_request, parse_query

from . import admission, records
from .model import LIVE_STATES, event, lease_trait
from .times import iso

__all__ = ["lease_read", "lease_start", "lease_heal", "lease_warn", "lease_end", "lease_note",
           "lease_release", "lease_claim", "lease_return", "unreserved", "unreserved_each"]


def _record(store, args, field: str = "name") -> dict:
    name = args.get(field)
    record = records.read(store, name) if isinstance(name, str) else None
    if record is None:
        raise RequestError(f"no lease {name!r}")
    return record


def lease_read(host, args: dict) -> dict:
    return {"record": records.read(host.store, args.get("name"))}


def _heal(store, placement, record: dict) -> dict:
    """Replace the lease's dead hosts (hosts leases); ``degraded`` when none fits."""
    if record["kind"] != "hosts" or record["state"] not in ("pending", "active", "degraded"):
        return record
    alive = live_host_names(store)
    dead = [h for h in record.get("hosts", []) if h not in alive]
    short = False
    for gone in dead:
        new = admission.replace_host(store, placement, record["lease"], gone)
        if new is None:
            short = True
            continue
        record = records.read(store, record["lease"]) or record
        if record["state"] != "pending":
            records.hold(store, placement, {**record, "hosts": [new]})
            records.free(store, placement, {**record, "hosts": [gone]})
    if record["state"] != "pending":
        state = "degraded" if short else "active"
        note = f"hosts {', '.join(h for h in record['hosts'] if h not in alive)} are gone " \
               "and no free host can take their place" if short else None
        if record["state"] != state:
            record = records.update(store, record["lease"], lambda r: event(
                {**r, "state": state}, state, note)) or record
    return record


def lease_start(host, args: dict) -> dict:
    store = host.store
    record = _record(store, args)
    if record["state"] not in ("pending", "active", "degraded"):
        return {"record": record, "foreign": []}
    with for_request(store) as placement:
        record = _heal(store, placement, record)
        if record["state"] == "pending":
            waiting = _blockers(store, record)
            if waiting:
                return {"record": record, "foreign": [], "wait": waiting}
        short = records.hold(store, placement, record)
    state = "degraded" if short or record["state"] == "degraded" else "active"
    note = f"{short['short']} slots no longer fit and are not held" if short else None

    def started(r):
        if r["state"] == "pending":
            r = event({**r, "state": state, "started": time.time()}, "started", note)
        return r
    record = records.update(store, record["lease"], started) or record
    return {"record": record, "foreign": _foreign(store, record)}


def _blockers(store, record: dict) -> list[str]:
    """Leases whose end has come but who still hold this lease's hosts (their
    end is under way): the lease starts once they have freed them."""
    mine = set(record.get("hosts") or record.get("slots") or ())
    holders = {holder for host, holder in records.reserved_hosts(store).items()
               if host in mine and holder != record["lease"]}
    for kv in store.range(keys.lease_active())[0]:
        active = readable(kv)
        if active is None or active["lease"] == record["lease"] \
                or not mine & set(active["slots"]):
            continue
        # Capacity leases may overlap; only one whose end came before our start blocks.
        other = records.read(store, active["lease"])
        if record["kind"] == "hosts" or other is not None and other["end"] <= record["start"]:
            holders.add(active["lease"])
    return sorted(holders)


def _foreign(store, record: dict) -> list[dict]:
    """VMs on the lease's hosts that were not booted into it."""
    if record["kind"] != "hosts":
        return []
    mine = {keys.suffix(kv.key, keys.lease_vm(record["lease"]))
            for kv in store.range(keys.lease_vm(record["lease"]), keys_only=True)[0]}
    found = []
    for host in record.get("hosts", []):
        for kv in store.range(keys.vm(host))[0]:
            vm = readable(kv)
            if vm is not None and vm["uuid"] not in mine:
                found.append({"uuid": vm["uuid"], "name": vm["name"], "host": vm["host"],
                              "state": vm["state"]})
    return sorted(found, key=lambda v: (v["host"], v["name"]))


def lease_heal(host, args: dict) -> dict:
    with for_request(host.store) as placement:
        return {"record": _heal(host.store, placement, _record(host.store, args))}


def lease_warn(host, args: dict) -> dict:
    def warned(r):
        if r.get("warned"):
            return r
        return event({**r, "warned": time.time()}, "warning",
                             f"ends at {iso(r['end'])}")
    return {"record": records.update(host.store, _record(host.store, args)["lease"], warned)}


def lease_end(host, args: dict) -> dict:
    store = host.store
    record = _record(store, args)

    def ending(r):
        if r["state"] in ("ending", "ended", "error"):
            return r
        return event({**r, "state": "ending"}, "ending")
    record = records.update(store, record["lease"], ending) or record
    return {"record": record, "vms": records.lease_vms(store, record["lease"])}


def lease_note(host, args: dict) -> dict:
    def noted(r):
        new = dict(r)
        for field in ("state", "error", "uncleared"):
            if field in args:
                new[field] = args[field]
        if new != r and args.get("error"):
            new = event(new, args.get("state") or "note", args["error"])
        return new
    return {"record": records.update(host.store, _record(host.store, args)["lease"], noted)}


def lease_release(host, args: dict) -> dict:
    with for_request(host.store) as placement:
        return {"record": records.release(host.store, placement, args.get("name"),
                                          forget=bool(args.get("forget")))}


# -- VMs booted into a lease ----------------------------------------------------------

def unreserved(store, required: str | None) -> str | None:
    """``required`` as a claim outside any lease must have it: reserved
    hosts forbidden (while some host is reserved at all)."""
    if required and "CUSTOM_LEASE_" in required:
        return required
    if not store.range(keys.reserved(), keys_only=True)[0]:
        return required
    return f"{required},!CUSTOM_RESERVED" if required else "!CUSTOM_RESERVED"


def unreserved_each(store):
    """:func:`unreserved` for the many claims of one step: etcd is read
    once per distinct ``required``."""
    return functools.cache(functools.partial(unreserved, store))


def _amounts(resources) -> dict:
    if isinstance(resources, dict):
        return {rc: int(n) for rc, n in resources.items()}
    wanted: dict = {}
    for group in parse_query(resources).groups:
        for rc, n in group.resources.items():
            wanted[rc] = wanted.get(rc, 0) + n
    return wanted


def lease_claim(host, args: dict) -> dict:
    store = host.store
    record = _record(store, args, "lease")
    consumer, name = args.get("consumer"), record["lease"]
    if record["state"] not in ("active", "degraded"):
        raise RequestError(f"lease {name} is {record['state']}: VMs boot into it only "
                           "while it is active")
    store.create(keys.lease_vm(name, consumer), {"uuid": consumer, "name": args.get("name") or consumer})
    group = args.get("group")
    if not isinstance(group, dict):
        return _claim_in_lease(store, record, args, lambda host_name: True)

    def choose(allowed, taken, rule):
        done = _claim_in_lease(store, record, args, allowed,
                               f" (group {group.get('name')!r}, {rule}, rules out some)")
        return done["host"], done
    return groups.place(store, str(group.get("name")), group.get("rule"), consumer,
                        args.get("name") or consumer, choose)


def _claim_in_lease(store, record: dict, args: dict, allowed, ruled: str = "") -> dict:
    """``lease_claim``'s pick: a host of the lease (or a slot of its
    capacity) that ``allowed`` accepts (a group's rule; ``ruled``: words
    for the refusal when it had a say)."""
    consumer, name = args.get("consumer"), record["lease"]
    excluded = set(args.get("exclude") or ())
    with for_request(store) as placement:
        held = placement.allocations(consumer)["allocations"]
        if held and allowed(_host_named(placement, held)):
            return {"consumer": consumer, "allocations": held, "host": _host_named(placement, held)}
        if held:
            lease_return_claim(placement, record, consumer)
        amounts = _amounts(args.get("resources"))
        if record["kind"] == "hosts":
            required = ",".join(filter(None, [args.get("required"), lease_trait(name)]))
            query = ",".join(f"{rc}:{n}" for rc, n in sorted(amounts.items()))
            for candidate in placement.candidates(query, required=required):
                if candidate["host"] in excluded or candidate["host"] not in record["hosts"] \
                        or not allowed(candidate["host"]):
                    continue
                try:
                    doc = placement.claim(consumer, candidate["allocations"],
                                          project=args.get("project") or "peerctl", user=name)
                except Conflict:
                    continue
                return {"consumer": consumer, "allocations": doc["allocations"],
                        "host": candidate["host"]}
            raise RequestError(f"lease {name} is full: none of its hosts "
                               f"({', '.join(record['hosts'])}) fits {query}{ruled}")
        traits = [t for t in (args.get("required") or "").split(",") if t]
        holding = placement.allocations(record["consumer"])["allocations"]
        for rp, there in sorted(holding.items(), key=lambda item: -sum(item[1].values())):
            provider = placement.provider(rp)
            host_name, has = provider["name"], set(provider["traits"])
            if host_name in excluded or not allowed(host_name) \
                    or any(there.get(rc, 0) < n for rc, n in amounts.items()) \
                    or any((t[1:] in has) if t.startswith("!") else (t not in has)
                           for t in traits):
                continue
            try:
                doc = placement.take(record["consumer"], consumer, rp, amounts,
                                     project=args.get("project") or "peerctl", user=name)
            except Conflict:
                continue
            return {"consumer": consumer, "allocations": doc["allocations"], "host": host_name}
        raise RequestError(f"lease {name} is full: no slot of "
                           f"{','.join(f'{rc}:{n}' for rc, n in sorted(amounts.items()))} "
                           f"left{ruled}")


def lease_return_claim(placement, record: dict, consumer: str) -> None:
    """Give back what ``consumer`` took in the lease (to its reservation,
    for a capacity lease), so that it can be placed again."""
    if record["kind"] == "capacity":
        placement.give_back(consumer, record["consumer"])
    else:
        placement.release(consumer)


def _host_named(placement, allocations: dict) -> str | None:
    for rp in allocations:
        try:
            doc = placement.provider(rp)
            return placement.provider(doc["root"])["name"]
        except NotFound:
            continue
    return None


def lease_return(host, args: dict) -> dict:
    store = host.store
    consumer = args.get("consumer")
    record = records.read(store, args.get("lease"))
    with for_request(store) as placement:
        if record and record["kind"] == "capacity" and record["state"] in LIVE_STATES \
                and record["state"] != "ending":
            placement.give_back(consumer, record["consumer"])
        else:
            placement.release(consumer)
    store.delete(keys.lease_vm(args.get("lease"), consumer))
    return {"consumer": consumer, "returned": True}
