"""The soak's judge: a cluster's whole etcd history in, the broken rules out.

Pure: no etcd, no process, no clock.  The input is every event of the
cluster's prefix in revision order (:class:`Event`: revision, ``put`` or
``delete``, the key relative to ``/peerctl/<cluster>/``, the decoded
msgpack value); :func:`check` replays it, revision by revision (a
transaction's events share one revision and are judged together), and
returns a :class:`Violation` per breach, each naming what broke the rule
(a VM's uuid and name, a provider, an automation), the rule and the
revision.  The rules (issue 47):

1. **one record**: a VM uuid has at most one ``vms/<host>/<uuid>`` record
   at every revision (docs/keyspace.md, "Which VMs exist");
2. **no vanishing**: a VM an automation reported running (a row of its
   ``auto/<id>/status`` result with the uuid and state ``running``), and
   that no ``destroy`` automation's spec named, has a record at every
   revision from then on; an HA one (``ha: restart``) is ``running`` on a
   live host (``hosts/<host>`` present) again within ``recovery_bound``
   seconds of the cluster's clock (the newest ``time``/``updated`` any put
   carried), and at the end of the history; the bound does not run while
   the VM is replicated with no complete replica and no fallback to its
   image (its restart is refused by design until then);
3. **no overcommit**: for every placement provider and resource class, the
   allocations of every ``placement/consumer/`` document add up to at most
   ``(total - reserved) * allocation_ratio``; a drained provider (reserved
   raised to total, ``COMPUTE_STATUS_DISABLED``) is held to the reserved it
   had before the drain (``placement/drained/<uuid>``, else none), so the
   VMs it still holds are no overcommit;
4. **every automation ends, no step answered twice**: each ``auto/<id>/``
   has a terminal status (``engine.core.keys.TERMINAL_STATES``) at the end,
   and each ``auto/<id>/resp/<index>`` is created once and never written
   again with another value.

A breach that lasts several revisions is one violation, at the revision it
began.  :func:`vm_history` gives the lines that tell one VM's story.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from engine.core import keys
from engine.placement.model import DISABLED_TRAIT

__all__ = ["Event", "Violation", "check", "vm_history", "RECOVERY_BOUND_S"]

RECOVERY_BOUND_S = 60.0

_VM = re.compile(r"^vms/([^/]+)/([^/]+)$")
_AUTO = re.compile(r"^auto/([^/]+)/(spec|status|resp/(\d+))$")
_RP = keys.placement("rp/")
_CONSUMER = keys.placement("consumer/")
_DRAINED = keys.placement("drained/")


@dataclass(frozen=True)
class Event:
    revision: int
    kind: str               # "put" or "delete"
    key: str                # relative to /peerctl/<cluster>/
    value: Any = None       # decoded msgpack; None for a delete


@dataclass(frozen=True)
class Violation:
    rule: int
    subject: str            # a VM uuid, a provider uuid, an automation id
    name: str | None        # the VM's or provider's name, the automation's kind
    revision: int
    why: str

    def __str__(self):
        named = f"{self.name} ({self.subject})" if self.name else self.subject
        return f"rule {self.rule} at revision {self.revision}: {named}: {self.why}"


@dataclass
class _World:
    """The cluster as of the revision being judged, and what was promised."""
    values: dict[str, Any] = field(default_factory=dict)
    records: dict[str, dict[str, dict]] = field(default_factory=lambda: defaultdict(dict))
    names: dict[str, str] = field(default_factory=dict)         # uuid -> VM name
    running: dict[str, int] = field(default_factory=dict)       # uuid -> reported at
    destroyed: set[str] = field(default_factory=set)
    ha: dict[str, Any] = field(default_factory=dict)            # uuid -> its last HA policy
    live_hosts: set[str] = field(default_factory=set)
    clock: float = 0.0
    kinds: dict[str, str] = field(default_factory=dict)         # automation -> kind
    states: dict[str, tuple[str, int]] = field(default_factory=dict)
    answered: dict[str, Any] = field(default_factory=dict)      # resp key -> first value
    allocated: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


def check(events: Iterable[Event], recovery_bound: float = RECOVERY_BOUND_S) -> list[Violation]:
    """Every breach of the four rules in the history ``events``."""
    world, found = _World(), []
    doubled: set[str] = set()                  # rule 1 breaches under way
    down_since: dict[str, tuple[int, float]] = {}   # HA uuid -> (revision, clock)
    late: set[str] = set()
    over: set[tuple[str, str]] = set()         # rule 3 breaches under way
    last = 0
    for revision, batch in _by_revision(events):
        last = revision
        touched_vms, touched_providers = set(), set()
        for event in batch:
            _apply(world, event, found, touched_vms, touched_providers)
        found += _one_record(world, revision, touched_vms, doubled)
        found += _still_there(world, revision, touched_vms)
        found += _ha_back_in_time(world, revision, down_since, late, recovery_bound)
        found += _within_capacity(world, revision, touched_providers, over)
    found += _ha_running_at_the_end(world, last)
    found += _automations_ended(world)
    return found


def _by_revision(events: Iterable[Event]):
    batch: list[Event] = []
    for event in sorted(events, key=lambda e: e.revision):
        if batch and event.revision != batch[0].revision:
            yield batch[0].revision, batch
            batch = []
        batch.append(event)
    if batch:
        yield batch[0].revision, batch


def _apply(world: _World, event: Event, found: list, touched_vms: set,
           touched_providers: set) -> None:
    key, value = event.key, event.value
    put = event.kind == "put"
    _advance_clock(world, value if put else None)
    if key.startswith(keys.host()):
        (world.live_hosts.add if put else world.live_hosts.discard)(keys.suffix(key, keys.host()))
    elif (vm := _VM.match(key)):
        host, uuid = vm.groups()
        if put and isinstance(value, dict):
            world.records[uuid][host] = value
            world.names.setdefault(uuid, value.get("name"))
            world.ha[uuid] = value.get("ha")
        else:
            world.records[uuid].pop(host, None)
        touched_vms.add(uuid)
    elif (auto := _AUTO.match(key)):
        _automation_event(world, event, auto, found, touched_vms)
    elif key.startswith(keys.placement()):
        _placement_event(world, event, touched_providers)
    if put:
        world.values[key] = value
    else:
        world.values.pop(key, None)


def _advance_clock(world: _World, value) -> None:
    if isinstance(value, dict):
        for stamp in (value.get("time"), value.get("updated")):
            if isinstance(stamp, (int, float)) and stamp > world.clock:
                world.clock = float(stamp)


def _automation_event(world, event, match, found, touched_vms) -> None:
    automation_id, part, index = match.groups()
    if event.kind != "put":
        return
    value = event.value if isinstance(event.value, dict) else {}
    if part == "spec":
        kind = value.get("kind", "?")
        world.kinds[automation_id] = kind
        world.states.setdefault(automation_id, ("running", event.revision))
        if kind == "destroy":
            world.destroyed.update(vm.get("uuid") for vm in _spec_vms(value))
    elif part == "status":
        world.states[automation_id] = (value.get("state", "?"), event.revision)
        for row in _result_rows(value):
            if row.get("state") == "running" and row.get("uuid") \
                    and row["uuid"] not in world.running:
                world.running[row["uuid"]] = event.revision
                world.names.setdefault(row["uuid"], row.get("name"))
                touched_vms.add(row["uuid"])
    else:
        found += _answered_once(world, event, automation_id, int(index))


def _answered_once(world, event, automation_id, index) -> list[Violation]:
    """A response is created once; the same value put again is harmless."""
    if event.key not in world.answered:
        world.answered[event.key] = event.value
        return []
    first = world.answered[event.key]
    if event.key in world.values and first == event.value:
        return []
    how = "rewritten" if event.key in world.values else "created again after a delete"
    return [Violation(4, automation_id, world.kinds.get(automation_id), event.revision,
                      f"step {index}'s answer {how}: {_brief(first)} -> {_brief(event.value)}")]


def _spec_vms(spec: dict) -> list[dict]:
    vms = (spec.get("args") or {}).get("vms") or []
    return [vm for vm in vms if isinstance(vm, dict)]


def _result_rows(status: dict) -> list[dict]:
    result = status.get("result")
    rows = result.get("vms") if isinstance(result, dict) else None
    return [row for row in rows or [] if isinstance(row, dict)]


def _placement_event(world, event, touched_providers) -> None:
    key = event.key
    if key.startswith(_CONSUMER):
        old = world.values.get(key)
        for sign, doc in ((-1, old), (1, event.value if event.kind == "put" else None)):
            for provider, resources in _allocations(doc):
                touched_providers.add(provider)
                for rc, amount in resources.items():
                    world.allocated[(provider, rc)] += sign * amount
    elif key.startswith(_RP):
        touched_providers.add(keys.suffix(key, _RP))
    elif key.startswith(_DRAINED):
        touched_providers.add(keys.suffix(key, _DRAINED))


def _allocations(doc) -> list[tuple[str, dict]]:
    allocations = doc.get("allocations") if isinstance(doc, dict) else None
    return [(p, r) for p, r in (allocations or {}).items() if isinstance(r, dict)]


# -- rule 1 -----------------------------------------------------------------

def _one_record(world, revision, touched_vms, doubled) -> list[Violation]:
    found = []
    for uuid in touched_vms:
        hosts = sorted(world.records.get(uuid, {}))
        if len(hosts) > 1 and uuid not in doubled:
            doubled.add(uuid)
            found.append(Violation(1, uuid, world.names.get(uuid), revision,
                                   f"{len(hosts)} records: on {', '.join(hosts)}"))
        elif len(hosts) <= 1:
            doubled.discard(uuid)
    return found


# -- rule 2 -----------------------------------------------------------------

def _still_there(world, revision, touched_vms) -> list[Violation]:
    found = []
    for uuid in touched_vms:
        if uuid in world.running and uuid not in world.destroyed \
                and not world.records.get(uuid):
            found.append(Violation(2, uuid, world.names.get(uuid), revision,
                                   f"reported running at revision {world.running[uuid]}, "
                                   "never destroyed, and now without a record"))
    return found


def _ha_up(world, uuid) -> bool:
    return any(host in world.live_hosts and record.get("state") == "running"
               for host, record in world.records.get(uuid, {}).items())


def _is_ha(world, uuid) -> bool:
    return world.ha.get(uuid) == "restart"


def _waits_for_its_replica(world, uuid) -> bool:
    """Replicated with no complete replica yet, and no restart from its
    image allowed (docs/replicas.md: never silently from its image): an
    HA restart refuses it by design until its replica is there or its
    replication stops, so its bound does not run meanwhile."""
    replication = world.values.get(keys.replica(uuid))
    return isinstance(replication, dict) and not replication.get("replica") \
        and replication.get("fallback") != "image"


def _ha_back_in_time(world, revision, down_since, late, bound) -> list[Violation]:
    found = []
    for uuid in world.running:
        if uuid in world.destroyed or not _is_ha(world, uuid) or _ha_up(world, uuid) \
                or _waits_for_its_replica(world, uuid):
            down_since.pop(uuid, None)
            late.discard(uuid)
            continue
        since, clock = down_since.setdefault(uuid, (revision, world.clock))
        if world.clock - clock > bound and uuid not in late:
            late.add(uuid)
            found.append(Violation(2, uuid, world.names.get(uuid), since,
                                   f"HA VM not running on a live host for more than "
                                   f"{bound:g} s (down from revision {since})"))
    return found


def _ha_running_at_the_end(world, revision) -> list[Violation]:
    return [Violation(2, uuid, world.names.get(uuid), revision,
                      "HA VM not running on a live host at the end: " + _where(world, uuid))
            for uuid in sorted(world.running)
            if uuid not in world.destroyed and _is_ha(world, uuid) and not _ha_up(world, uuid)]


def _where(world, uuid) -> str:
    """``h2 missing, h4 running (dead)``: the VM's records and their hosts."""
    return ", ".join(f"{host} {record.get('state')}"
                     + ("" if host in world.live_hosts else " (dead)")
                     for host, record in sorted(world.records[uuid].items())) or "no record"


# -- rule 3 -----------------------------------------------------------------

def _within_capacity(world, revision, touched_providers, over) -> list[Violation]:
    found = []
    for provider in touched_providers:
        doc = world.values.get(_RP + provider)
        if not isinstance(doc, dict):
            continue
        for rc, inventory in (doc.get("inventories") or {}).items():
            used = world.allocated.get((provider, rc), 0)
            limit = _limit(world, provider, doc, rc, inventory)
            if used > limit and (provider, rc) not in over:
                over.add((provider, rc))
                found.append(Violation(3, provider, doc.get("name"), revision,
                                       f"{rc} allocated {used} > capacity {limit}: "
                                       + _holders(world, provider, rc)))
            elif used <= limit:
                over.discard((provider, rc))
    return found


def _limit(world, provider, doc, rc, inventory) -> int:
    reserved = inventory.get("reserved", 0)
    saved = world.values.get(_DRAINED + provider)
    if isinstance(saved, dict):
        reserved = saved.get(rc, 0)
    elif DISABLED_TRAIT in (doc.get("traits") or []):
        reserved = 0            # drained before the reserved amounts were kept
    return int((inventory.get("total", 0) - reserved) * inventory.get("allocation_ratio", 1.0))


def _holders(world, provider, rc) -> str:
    held = []
    for key, doc in world.values.items():
        if key.startswith(_CONSUMER):
            amount = dict(_allocations(doc)).get(provider, {}).get(rc)
            if amount:
                uuid = keys.suffix(key, _CONSUMER)
                held.append(f"{world.names.get(uuid) or uuid} {amount}")
    return ", ".join(sorted(held))


# -- rule 4 -----------------------------------------------------------------

def _automations_ended(world) -> list[Violation]:
    return [Violation(4, automation_id, world.kinds.get(automation_id), revision,
                      f"never ended: last state {state}")
            for automation_id, (state, revision) in sorted(world.states.items())
            if state not in keys.TERMINAL_STATES]


# -- telling a VM's story ---------------------------------------------------

def vm_history(events: Iterable[Event], uuid: str, width: int = 200) -> list[str]:
    """One line per event that touches VM ``uuid``: its records, lock,
    disown and restart marks, definition, allocation, and the automations'
    specs, statuses, steps and answers that name it.  Given a provider's
    uuid, its documents and the allocations on it; an automation's id, its
    keys."""
    lines = []
    for event in sorted(events, key=lambda e: e.revision):
        if uuid in event.key or (event.key.startswith((keys.auto(), _CONSUMER))
                                 and _names(event.value, uuid)):
            text = "-" if event.kind == "delete" else _brief(event.value, width)
            lines.append(f"  {event.revision:>7} {event.kind:<6} {event.key}  {text}"[:width])
    return lines


def _names(value, uuid) -> bool:
    if isinstance(value, str):
        return uuid in value
    if isinstance(value, dict):
        return any(_names(v, uuid) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_names(v, uuid) for v in value)
    return False


_SHOWN = ("state", "kind", "request", "name", "host", "target", "ha", "status", "error",
          "owner", "why", "from", "to", "executor", "result")


def _brief(value, width: int = 120) -> str:
    """A value in one line: the telling fields of a map first."""
    if isinstance(value, dict):
        shown = {k: value[k] for k in _SHOWN if k in value}
        text = " ".join(f"{k}={v!r}" for k, v in shown.items()) or repr(value)
    else:
        text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."
