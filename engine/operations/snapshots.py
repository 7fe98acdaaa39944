"""Snapshots of VMs, kept in their disks on their hosts (docs/snapshots.md):
list them from etcd alone, and plan creating, reverting and deleting them.

Every refusal here is one line with nothing written: a bad snapshot name
(``[A-Za-z0-9._-]``, at most 64: a usage error, exit 2), a pattern
matching nothing, a VM whose host is down or that is not running, paused
or shut off, a name the VM already has, ``--memory`` for a shut-off VM, an
unknown snapshot, a snapshot its VM has left behind (on another host)."""
from __future__ import annotations

import time

from engine.errors import Failed, UsageError

from .plans import Plan, failed_doc
from .select import NoMatch, select_vms, vm_pattern
from .tasks import iso

__all__ = ["check_name", "default_name", "list_snapshots", "grouped", "plan_create",
           "plan_revert", "plan_delete", "SETTLED"]

SETTLED = ("running", "paused", "shutoff")       # states a snapshot request can act in


def check_name(text) -> str:
    from engine.backups.snapshots import MAX_NAME, valid_name
    if not valid_name(text):
        raise UsageError(f"bad snapshot name {text!r}: letters, digits, '.', '_' and '-' "
                         f"only, 1 to {MAX_NAME} of them")
    return text


def default_name(now: float | None = None) -> str:
    """``snap-20261125-224512`` (UTC)."""
    return time.strftime("snap-%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))


def _records(store) -> list[dict]:
    from engine.backups.snapshots import recorded
    return recorded(store)


def _row(record: dict, now: float) -> dict:
    return {"vm": record["vm"], "uuid": record["uuid"], "host": record["host"],
            "name": record["name"], "time": iso(record["time"]),
            "age_s": round(max(now - record["time"], 0.0), 1), "memory": record["memory"],
            "state": record.get("state") if isinstance(record.get("state"), str) else None}


def list_snapshots(ctx, pattern: str | None = None) -> list[dict]:
    """``[{vm, uuid, host, name, time, age_s, memory, state}]``: every
    snapshot, or those of the VMs ``pattern`` matches (``HOSTGLOB/VMGLOB``
    or ``VMGLOB``, on the VM's name or uuid and its host); from etcd only."""
    if pattern is not None:
        vm_pattern(pattern)         # a bad pattern is a usage error before any read
    now = time.time()
    rows = [_row(record, now) for record in _records(ctx.store())]
    if pattern is None:
        return rows
    def back(named):
        return [{k: v for k, v in row.items() if k != "id"} | {"name": row["id"]}
                for row in named]
    try:
        named = select_vms(lambda: [dict(row, name=row["vm"], id=row["name"]) for row in rows],
                           [pattern], what="snapshot", key="snapshots", by_uuid=True)
    except NoMatch as exc:
        exc.matched = back(exc.matched)
        raise
    return back(named)


def grouped(rows: list[dict]) -> list[dict]:
    """Rows as the contract's ``[{vm, uuid, host, snapshots: [{name, time,
    age_s, memory, state}]}]``, one entry per VM, in the rows' order."""
    by_vm: dict[str, dict] = {}
    for row in rows:
        entry = by_vm.setdefault(row["uuid"], {"vm": row["vm"], "uuid": row["uuid"],
                                               "host": row["host"], "snapshots": []})
        entry["snapshots"].append({k: row[k] for k in ("name", "time", "age_s", "memory",
                                                       "state")})
    return list(by_vm.values())


def _vms(ctx, patterns: list[str], one: bool = False) -> list[dict]:
    """The VMs ``patterns`` match (``one``: exactly one), each in a state a
    snapshot request can act in."""
    from engine.cluster import read_vms
    for text in patterns:
        vm_pattern(text)
    vms = select_vms(lambda: read_vms(ctx.store()), list(patterns))
    if one and len(vms) > 1:
        raise Failed(f"VM pattern {patterns[0]!r} matches {len(vms)} VMs ("
                     + ", ".join(f"{vm['host']}/{vm['name']}" for vm in vms[:5])
                     + "): name one", result=failed_doc())
    for vm in vms:
        if vm["state"] == "unknown":
            raise Failed(f"VM {vm['name']!r} is on {vm['host']}, which is down: its snapshots "
                         "can be acted on once its host is back", result=failed_doc())
        if vm["state"] not in SETTLED:
            raise Failed(f"VM {vm['name']!r} is {vm['state']}: try again once it is running "
                         "or shut off", result=failed_doc())
    return vms


def _one_vm(ctx, text: str) -> dict:
    return _vms(ctx, [text], one=True)[0]


def _target(vm: dict, **more) -> dict:
    return {"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"], "state": vm["state"],
            **more}


def plan_create(ctx, patterns: list[str], name: str | None = None,
                memory: bool = False) -> Plan:
    """Snapshot the VMs matching ``patterns`` as ``name`` (default
    ``snap-<UTC time>``); ``memory``: with the guest's RAM (running or paused
    VMs only)."""
    name = check_name(name) if name is not None else default_name()
    vms = _vms(ctx, patterns)
    if memory:
        off = [vm for vm in vms if vm["state"] not in ("running", "paused")]
        if off:
            raise Failed(f"VM {off[0]['name']!r} is {off[0]['state']}: --memory needs a "
                         "running or paused VM", result=failed_doc())
    from engine.backups.snapshots import snapshots_of
    for vm in vms:
        if any(s["name"] == name for s in snapshots_of(ctx.store(), vm["uuid"])):
            raise Failed(f"VM {vm['name']!r} already has a snapshot {name!r}: choose another "
                         "--name", result=failed_doc())
    chosen = [_target(vm) for vm in vms]
    return Plan("snapshot_create", {"vms": chosen, "snapshot": name, "memory": bool(memory)},
                [dict(vm, snapshot=name) for vm in chosen])


def _snapshot(ctx, vm: dict, name: str) -> dict:
    """``vm``'s recorded snapshot ``name``, on the host the VM is on."""
    from engine.backups.snapshots import snapshots_of
    mine = snapshots_of(ctx.store(), vm["uuid"])
    found = [s for s in mine if s["name"] == name]
    if not found:
        have = ", ".join(repr(s["name"]) for s in mine[-5:])
        raise Failed(f"VM {vm['name']!r} has no snapshot {name!r}"
                     + (f" (it has {have})" if have else " (it has none)"),
                     result=failed_doc())
    return found[0]


def plan_revert(ctx, vm_text: str, name: str) -> Plan:
    """Bring VM ``vm_text`` (a name or a pattern matching one VM) back to its
    snapshot ``name``; a person confirms it (what was written since is lost)."""
    check_name(name)
    vm = _one_vm(ctx, vm_text)
    snap = _snapshot(ctx, vm, name)
    if snap["host"] != vm["host"]:
        raise Failed(f"snapshot {name!r} of VM {vm['name']!r} was taken on {snap['host']}; "
                     f"the VM is now on {vm['host']} without it: delete it "
                     f"(snapshot delete {vm['name']} {name})", result=failed_doc())
    target = _target(vm, snapshot=name, time=snap["time"], memory=snap["memory"])
    return Plan("snapshot_revert", {"vms": [target], "snapshot": name},
                [dict(target, time=iso(snap["time"]))], ask=True)


def plan_delete(ctx, vm_text: str, names: list[str]) -> Plan:
    """Delete VM ``vm_text``'s snapshots ``names`` (all recorded); several
    ask for confirmation."""
    names = list(dict.fromkeys(check_name(n) for n in names))
    vm = _one_vm(ctx, vm_text)
    for name in names:
        _snapshot(ctx, vm, name)
    target = _target(vm, snapshots=names)
    return Plan("snapshot_delete", {"vms": [target]},
                [_target(vm, snapshot=n) for n in names], ask=len(names) > 1,
                what="snapshots")
