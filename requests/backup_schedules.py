"""The requests of a backup schedule's automation
(``automations/backup_schedules.py``), run by the initiator (no target),
reading and writing etcd only.

- ``schedule_read {schedule}`` -> ``{record}`` (None once deleted);
- ``schedule_due {schedule}`` -> ``{vms: [{name, uuid, host, state,
  full}], skipped: [{name, host}]}``: the VMs matching the pattern now
  (those on a down host are skipped and named); ``full`` once a VM's newest
  chain holds :data:`FULL_EVERY` backups;
- ``schedule_prune {schedule, uuids, keep}`` -> ``{drop: [{id, vm, uuid,
  target}]}``: what retention ``keep`` (the run's) drops of the backups
  this schedule made of those VMs (never a manual, protected or held one,
  nor one a backup left standing builds on:
  :func:`engine.backups.retention.schedule_drops`), children first;
  backups on a down host wait for a later run;
- ``schedule_ran {schedule, at, now, summary}`` -> ``{record}``: ``last``,
  ``last_run`` (the summary) and ``runs`` (how many so far) recorded, ``next`` one interval after
  ``at`` (or after ``now``, when the run outlasted the interval);
- ``schedule_continue {schedule, owner}`` -> ``{automation}``: a new
  automation carries the schedule, swapped into the record in the same
  transaction that creates it, once (the same owner asking again gets the
  same answer).
"""
from __future__ import annotations

from engine.backups import retention, schedules
from engine.backups.records import live_holds, recorded
from engine.cluster import read_vms
from engine.core import api, keys
from engine.core.handlers import handler
from engine.core.hosts import live_host_names
from engine.core.store import Put, modified_at
from engine.core.values import readable
from engine.errors import RequestError
from engine.operations.select import match_vms


FULL_EVERY = 7          # a chain holds at most this many backups, its full one included


def _schedule(args: dict) -> str:
    value = args.get("schedule")
    if not isinstance(value, str) or not value:
        raise RequestError("a schedule request needs the schedule's id")
    return value


@handler("schedule_read")
def schedule_read(host, args: dict) -> dict:
    return {"record": schedules.read(host.store, _schedule(args))}


def _chain_length(by_id: dict, newest: dict) -> int:
    length, at = 1, newest
    while at.get("kind") == "incremental" and at.get("parent") in by_id and length < 10_000:
        at = by_id[at["parent"]]
        length += 1
    return length


@handler("schedule_due")
def schedule_due(host, args: dict) -> dict:
    record = schedules.read(host.store, _schedule(args))
    if record is None:
        return {"vms": [], "skipped": []}
    matched, _ = match_vms(read_vms(host.store), [record["pattern"]])
    backups = recorded(host.store)
    by_id = {b["id"]: b for b in backups}
    vms, skipped = [], []
    for vm in matched:
        if vm.get("state") == "unknown":
            skipped.append({"name": vm["name"], "host": vm["host"]})
            continue
        mine = [b for b in backups if b["uuid"] == vm["uuid"]]
        newest = max(mine, key=lambda b: b["time"]) if mine else None
        vms.append({"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"],
                    "state": vm.get("state"),
                    "full": newest is not None and _chain_length(by_id, newest) >= FULL_EVERY})
    return {"vms": vms, "skipped": skipped}


@handler("schedule_prune")
def schedule_prune(host, args: dict) -> dict:
    uuids = args.get("uuids") or []
    try:
        keep = retention.check_keep(args.get("keep") or {})
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    if not isinstance(uuids, list):
        raise RequestError("schedule_prune needs the uuids of the run's VMs")
    schedule = _schedule(args)
    alive = live_host_names(host.store)
    backups = recorded(host.store)
    held = {b["id"] for b in backups if live_holds(host.store, b)}
    drop = []
    for uuid in uuids:
        dropped = retention.schedule_drops([b for b in backups if b["uuid"] == uuid],
                                           schedule, keep, held)
        for backup in dropped:
            if backup["target"] not in alive:
                break           # its parents wait with it: a chain is never cut
            drop.append({"id": backup["id"], "vm": backup["vm"], "uuid": uuid,
                         "target": backup["target"]})
    return {"drop": drop}


def _change(store, schedule: str, change):
    """Read the schedule and write ``change(record)`` -> ``(answer, record,
    compares, ops)`` in one transaction guarded by what was read, again
    while someone else changes it meanwhile; ``change`` answers without
    writing by giving ``record`` None.  No schedule: ``change(None)``."""
    key = keys.backup_schedule(schedule)
    for _ in range(10):
        kv = store.get(key)
        answer, record, compares, ops = change(readable(kv) if kv is not None else None)
        if record is None:
            return answer
        if store.txn([modified_at(key, kv.mod_revision), *compares],
                     [Put(key, record), *ops]).succeeded:
            return answer
    raise RequestError(f"schedule {schedule} kept changing: try again")


@handler("schedule_ran")
def schedule_ran(host, args: dict) -> dict:
    at, now = float(args.get("at") or 0), float(args.get("now") or 0)

    def ran(record):
        if record is None or record.get("last") == at:     # gone, or recorded already
            return {"record": record}, None, [], []
        following = at + record["every"]
        record = {**record, "last": at, "last_run": args.get("summary"),
                  "runs": int(record.get("runs") or 0) + 1,
                  "next": following if following > now else now + record["every"]}
        return {"record": record}, record, [], []
    return _change(host.store, _schedule(args), ran)


@handler("schedule_continue")
def schedule_continue(host, args: dict) -> dict:
    schedule, owner = _schedule(args), args.get("owner")

    def carried(record):
        if record is None or record.get("automation") != owner:    # done already, or taken
            return {"automation": (record or {}).get("automation")}, None, [], []
        automation_id, compares, ops = api.automation_ops(host.store, schedules.KIND,
                                                          {"schedule": schedule})
        record = {**record, "automation": automation_id}
        return {"automation": automation_id}, record, compares, ops
    return _change(host.store, schedule, carried)
