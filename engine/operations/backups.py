"""Backups of VMs' disks, kept on another host (docs/cli.md, "Backups"):
list them, and plan taking, deleting and restoring them.

A backup is a record under ``backups/``, written by the engine once its
data is complete on the target host and verified; a record that cannot be
read is skipped (reported once), never a crash of a listing.  Every refusal
here is one line with nothing written: a pattern matching nothing, a VM
whose host is down, no other live, undrained host to back up to, an unknown
backup, a backup whose host is down, a parent whose child is kept, a
restore onto a name or a VM that exists.

Schedules (``schedules/backup/<id>``, :mod:`engine.backups.schedules`)
are set, listed and deleted here too: a bad pattern, interval, count or
``to`` is a ``UsageError`` before anything is read or written; deleting a
schedule keeps its backups."""
from __future__ import annotations

import fnmatch
import re
import time

from engine.errors import Failed, NoSuch, UsageError
from engine.wording import given, option

from .plans import Plan, check_somewhere, failed_doc, refuse_down_hosts
from .select import host_pattern, select_vms, vm_pattern
from .specs import check_name
from .tasks import iso

__all__ = ["LISTED", "ORDER", "list_backups", "newest_by_uuid", "count_backups", "plan_backup", "plan_delete",
           "set_protected", "plan_restore", "check_id", "set_schedule", "list_schedules", "find_schedules",
           "delete_schedules", "KEEP_OPTIONS", "SCHEDULE_FIELDS"]


# backup list's JSON: each row's fields, and the order of the rows
LISTED = ["id", "vm", "uuid", "host", "target", "time", "age_s", "kind", "parent", "bytes",
          "consistency", "reason", "newest", "schedule", "protected", "lost"]
ORDER = "vm,time"


def check_id(text: str) -> str:
    """A backup id as a user gives it: one key's last part."""
    if not text or "/" in text or any(c.isspace() or not c.isprintable() for c in text):
        raise UsageError(f"bad backup id {text!r}")
    return text


def _records(store) -> tuple[list[dict], set[str]]:
    """Every readable backup record, its ``id`` its key's (what deleting it
    names), and the ids whose record is unreadable (reported once each)."""
    from engine.core import keys
    from engine.core.values import readable
    import engine.backups.records  # noqa: F401  (declares backups/)
    records, garbled = [], set()
    for kv in store.range(keys.backup())[0]:
        backup_id = keys.suffix(kv.key, keys.backup())
        record = readable(kv)
        if record is None:
            garbled.add(backup_id)
        else:
            records.append(dict(record, id=backup_id))
    return records, garbled


def _newest(records: list[dict]) -> dict[str, dict]:
    """``{uuid: record}``: each VM's newest backup (the later id on a tie)."""
    newest: dict[str, dict] = {}
    for record in records:
        best = newest.get(record["uuid"])
        if best is None or (record["time"], record["id"]) > (best["time"], best["id"]):
            newest[record["uuid"]] = record
    return newest


def newest_by_uuid(store) -> dict[str, dict]:
    """``{uuid: {id, time}}`` (time ISO 8601 UTC): each VM's newest backup,
    from one range read; what vmlist shows as its ``backup``."""
    return {uuid: {"id": record["id"], "time": iso(record["time"])}
            for uuid, record in _newest(_records(store)[0]).items()}


def count_backups(ctx, uuids) -> dict[str, int]:
    """``{uuid: N}``: how many backups each of ``uuids`` has (those with
    none left out), from one range read; what destroy says it keeps."""
    from engine.backups.records import recorded
    wanted, counts = set(uuids), {}
    if wanted:
        for record in recorded(ctx.store()):
            if record["uuid"] in wanted:
                counts[record["uuid"]] = counts.get(record["uuid"], 0) + 1
    return counts


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _row(record: dict, newest: bool, now: float) -> dict:
    size = record.get("bytes")
    return {"id": record["id"], "vm": record["vm"], "uuid": record["uuid"],
            "host": _text(record.get("host")), "target": record["target"],
            "time": iso(record["time"]), "age_s": round(max(now - record["time"], 0.0), 1),
            "kind": record["kind"], "parent": _text(record.get("parent")),
            "bytes": size if type(size) is int else None,
            "consistency": _text(record.get("consistency")),
            "reason": _text(record.get("reason")), "newest": newest,
            "schedule": _text(record.get("schedule")),
            "protected": record.get("protected") is True,
            "lost": _lost(record.get("lost"))}


def _lost(lost) -> dict | None:
    """``{host, time}``: the host keeping the backup was removed (``host remove``)."""
    if not isinstance(lost, dict) or not isinstance(lost.get("host"), str):
        return None
    when = lost.get("time")
    return {"host": lost["host"], "time": iso(when) if isinstance(when, (int, float)) else None}


def _rows(ctx) -> list[dict]:
    records = _records(ctx.store())[0]
    newest = {record["id"] for record in _newest(records).values()}
    now = time.time()
    return [_row(record, record["id"] in newest, now) for record in records]


def list_backups(ctx, pattern: str | None = None) -> list[dict]:
    """``[{id, vm, uuid, host, target, time, age_s, kind, parent, bytes,
    consistency, reason, newest, schedule, protected, lost}]``: every backup, or
    those of the VMs ``pattern`` matches (``HOSTGLOB/VMGLOB`` or ``VMGLOB``,
    on the VM's name or uuid and the host it was on); ``newest``: the VM's
    newest backup; ``schedule``: the id of the schedule that made it (None:
    taken by hand, or by a schedule before backups recorded theirs);
    ``protected``: kept from every prune and from backup delete; ``lost``:
    ``{host, time}`` once its target was removed (``host remove``), else None."""
    if pattern is None:
        return _rows(ctx)
    named = select_vms(lambda: [dict(row, name=row["vm"]) for row in _rows(ctx)], [pattern],
                       what="backup", key="backups", by_uuid=True)
    for row in named:
        del row["name"]
    return named


# -- backup -----------------------------------------------------------------------

def _targets_for(hosts: list[dict], to: str | None) -> set[str]:
    """Hosts a backup may go to: alive, not drained, matching ``to``."""
    return {h["host"] for h in hosts if h.get("alive") and not h.get("drained")
            and fnmatch.fnmatchcase(h["host"], to or "*")}


def _nowhere(vms: list[dict], to: str | None, hosts: list[dict]) -> str:
    """The one line saying why ``vms`` have no host to be backed up to."""
    what = (f"VM {vms[0]['name']!r}" if len(vms) == 1
            else "VMs " + ", ".join(repr(vm["name"]) for vm in vms))
    head = f"no host to back up {what} to: "
    where = given("to", to) if to is not None else "the cluster"
    matched = [h for h in hosts if fnmatch.fnmatchcase(h["host"], to or "*")]
    if not matched:
        return head + f"{where} matches no host"
    usable = sorted(_targets_for(matched, None))
    if not usable:
        return head + f"{where} has no live, undrained host (" + ", ".join(
            f"{h['host']} {'drained' if h.get('drained') and h.get('alive') else 'down'}"
            for h in matched) + ")"
    return head + f"{where} offers only {', '.join(usable)}, " + (
        "where it is" if len(vms) == 1 else "where they are")


def plan_backup(ctx, patterns: list[str], to: str | None = None, full: bool = False,
                protect: bool = False) -> Plan:
    """Back up the disks of the VMs matching ``patterns``, each to another
    live, undrained host (matching ``to``); ``full``: not incremental;
    ``protect``: each backup recorded protected."""
    for text in patterns:
        vm_pattern(text)        # bad patterns and --to are usage errors before any read
    to = host_pattern(to) if to is not None else None
    from engine.cluster import read_hosts, read_vms
    store = ctx.store()
    vms = select_vms(lambda: read_vms(store), list(patterns))
    refuse_down_hosts(vms, "it can be backed up")
    hosts = read_hosts(store)
    targets = _targets_for(hosts, to)
    stuck = [vm for vm in vms if not targets - {vm["host"]}]
    if stuck:
        raise Failed(_nowhere(stuck, to, hosts), result=failed_doc())
    chosen = [{"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"],
               "state": vm["state"]} for vm in vms]
    args = {"vms": chosen, "to": to, "full": bool(full)}
    if protect:             # only when asked: older peers run the rest alike
        args["protect"] = True
    return Plan("backup", args, [dict(vm) for vm in chosen], ask=len(chosen) > 1)


# -- backup delete ----------------------------------------------------------------

def _unknown(ids: list[str], garbled: set[str], result) -> Failed:
    """What to raise for backups ``ids`` that are not there: unreadable
    (``Failed``), or no such backup (``NoSuch``, the API's 404)."""
    bad = [i for i in ids if i in garbled]
    if bad:
        return Failed(f"backup {bad[0]} is unreadable: scrub lists it, and scrub --delete "
                      "removes it", result=result)
    return NoSuch("no backup " + ", ".join(repr(i) for i in ids), result=result)


def _depth(record: dict, by_id: dict[str, dict]) -> int:
    """How many backups ``record``'s chain holds before it (a loop ends it)."""
    depth, seen = 0, {record["id"]}
    parent = record.get("parent")
    while isinstance(parent, str) and parent in by_id and parent not in seen:
        seen.add(parent)
        depth += 1
        parent = by_id[parent].get("parent")
    return depth


def _down_hosts(store, names) -> list[str]:
    from engine.cluster import read_hosts
    alive = {h["host"] for h in read_hosts(store) if h["alive"]}
    return sorted(set(names) - alive)


def plan_delete(ctx, ids: list[str]) -> Plan:
    """Delete the backups ``ids`` on their target hosts (which must be up),
    children before parents; a backup that a kept one builds on, a
    protected one and one a running restore reads are refused."""
    ids = list(dict.fromkeys(check_id(i) for i in ids))
    store = ctx.store()
    records, garbled = _records(store)
    by_id = {record["id"]: record for record in records}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise _unknown(unknown, garbled, failed_doc("backups"))
    from engine.backups.records import why_kept
    for backup_id in ids:
        why = why_kept(store, by_id[backup_id])
        if why:
            raise Failed(why, result=failed_doc("backups"))
    chosen = set(ids)
    for record in sorted(records, key=lambda r: r["id"]):
        parent = record.get("parent")
        if parent in chosen and record["id"] not in chosen:
            raise Failed(f"backup {parent} is the parent of {record['id']} ({record['kind']}): "
                         f"delete {record['id']} first, or both",
                         result=failed_doc("backups"))
    down = _down_hosts(store, {by_id[i]["target"] for i in ids})
    if down:
        raise Failed(f"host {down[0]} is down: its backups can be deleted once it is back",
                     result=failed_doc("backups"))
    order = sorted(ids, key=lambda i: (-_depth(by_id[i], by_id), -by_id[i]["time"], i))
    rows = [{"id": i, "vm": by_id[i]["vm"], "uuid": by_id[i]["uuid"],
             "target": by_id[i]["target"], "kind": by_id[i]["kind"],
             "time": iso(by_id[i]["time"])} for i in order]
    return Plan("backup_delete",
                {"backups": [{k: row[k] for k in ("id", "vm", "uuid", "target")}
                             for row in rows]},
                rows, ask=len(rows) > 1, what="backups", key="backups")


def delete_lost(ctx, ids: list[str], *, dry_run: bool = False) -> list[dict] | None:
    """Backups whose target host was removed (``lost`` in their record, see
    ``host remove``): their data went with it, so only the records go, here
    and now, each guarded by its revision; ``[{id, vm, target, state,
    error}]``, or None unless every one of ``ids`` is such a backup (the
    others are deleted by ``backup_delete`` on their hosts)."""
    from engine.backups.records import why_kept
    from engine.core import keys
    from engine.core.store import Delete, modified_at
    ids = list(dict.fromkeys(check_id(i) for i in ids))
    store = ctx.store()
    by_id = {record["id"]: record for record in _records(store)[0]}
    if not ids or any(not (by_id.get(i) or {}).get("lost") for i in ids):
        return None
    for backup_id in ids:
        why = why_kept(store, by_id[backup_id])
        if why:
            raise Failed(why, result=failed_doc("backups"))
    rows = []
    for backup_id in ids:
        record = by_id[backup_id]
        if not dry_run:
            kv = store.get(keys.backup(backup_id))
            if kv is not None and not store.txn([modified_at(kv.key, kv.mod_revision)],
                                                [Delete(kv.key)]).succeeded:
                raise Failed(f"backup {backup_id} changed meanwhile: try again",
                             result={"automation": None, "state": "failed", "backups": rows})
        rows.append({"id": backup_id, "vm": record["vm"], "target": record["target"],
                     "state": "dry-run" if dry_run else "deleted", "error": None})
    return rows


# -- backup protect, backup unprotect ----------------------------------------------

def set_protected(ctx, ids: list[str], protected: bool) -> list[dict]:
    """Protect (or unprotect) the backups ``ids``: all are found before any
    is changed; each as listed after."""
    ids = list(dict.fromkeys(check_id(i) for i in ids))
    store = ctx.store()
    records, garbled = _records(store)
    known = {record["id"] for record in records}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise _unknown(unknown, garbled, failed_doc("backups", "failed"))
    from engine.backups import records as marks
    for backup_id in ids:
        marks.set_protected(store, backup_id, protected)
    listed = {row["id"]: row for row in _rows(ctx)}
    return [listed[i] for i in ids if i in listed]


# -- restore ----------------------------------------------------------------------

def plan_restore(ctx, backup_id: str, as_name: str | None = None,
                 on: str | None = None) -> Plan:
    """Rebuild a VM from backup ``backup_id`` (and the chain it ends): the
    destroyed VM under its old name and uuid, or with ``as_name`` a new VM;
    placed where its size fits (on hosts matching ``on``)."""
    check_id(backup_id)
    if as_name is not None:
        check_name(as_name)
    on = host_pattern(on) if on is not None else None
    from engine.core import keys
    from engine.core.values import readable
    import engine.backups.records  # noqa: F401  (declares backups/)
    store = ctx.store()
    kv = store.get(keys.backup(backup_id))
    record = readable(kv)
    if record is None:
        raise _unknown([backup_id], {backup_id} if kv is not None else set(), failed_doc())
    down = _down_hosts(store, [record["target"]])
    if down:
        raise Failed(f"host {down[0]}, which keeps backup {backup_id}, is down: it can be "
                     "restored once that host is back", result=failed_doc())
    from engine.cluster import read_vms
    vms = read_vms(store)
    if as_name is None:
        same = [vm for vm in vms if vm["uuid"] == record["uuid"]]
        if same:
            raise Failed(f"VM {same[0]['name']!r} still exists (on {same[0]['host']}): "
                         f"restore it as a new VM with {option('as')} NAME",
                         result=failed_doc())
    name = as_name or record["vm"]
    clash = [vm for vm in vms if vm["name"] == name]
    if clash:
        raise Failed(f"VM name already in use: {name} (on {clash[0]['host']})"
                     + ("" if as_name else f"; restore it as a new VM with {option('as')} NAME"),
                     result=failed_doc())
    if on is not None:
        check_somewhere(ctx, on, None)
    uuid = None if as_name else record["uuid"]
    return Plan("restore", {"backup": backup_id, "name": name, "uuid": uuid, "on": on},
                [{"name": name, "uuid": uuid, "host": None, "state": None,
                  "restored_from": backup_id}])


# -- backup schedules ---------------------------------------------------------------

KEEP_OPTIONS = ("last", "daily", "weekly")     # Proxmox's keep-* options, in their order
# backup schedule list's JSON
SCHEDULE_FIELDS = ["schedule", "pattern", "every", "keep", "to", "next", "last", "runs",
                   "last_run", "automation"]
MAX_EVERY = 366 * 86400.0       # a longer interval is no schedule (and its times overflow)
MAX_KEEP = 1_000_000


def _every(value) -> float:
    from engine.backups.schedules import MIN_EVERY
    from engine.core.validate import parse_duration
    every = parse_duration(value, "interval")
    if not MIN_EVERY <= every <= MAX_EVERY:
        raise UsageError(f"bad interval {value!r}: at least {MIN_EVERY:g}s and at most "
                         f"{MAX_EVERY / 86400:g}d")
    return every


def _keep(keep: dict | None) -> dict:
    """``{last?, daily?, weekly?}`` as whole counts of at least 1 (None: not set)."""
    checked = {}
    for option, value in (keep or {}).items():
        if option not in KEEP_OPTIONS:
            raise UsageError(f"unknown retention option {option!r} (want "
                             f"{', '.join(KEEP_OPTIONS)})")
        if value is None:
            continue
        text = str(value).strip()
        if isinstance(value, bool) or not re.fullmatch(r"[0-9]+", text) \
                or not 1 <= int(text) <= MAX_KEEP:
            raise UsageError(f"bad keep-{option} {value!r}: want a whole number from 1 to "
                             f"{MAX_KEEP}")
        checked[option] = int(text)
    return {option: checked[option] for option in KEEP_OPTIONS if option in checked}


def _seconds(value):
    """An interval as JSON shows it: whole seconds as an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _schedule_doc(record: dict) -> dict:
    """A schedule as every face shows it: ``{schedule, pattern, every, keep,
    to, next, last, runs, last_run, automation}`` (times ISO 8601 UTC)."""
    keep = record.get("keep") if isinstance(record.get("keep"), dict) else {}
    runs = record.get("runs")
    return {"schedule": record["id"], "pattern": record["pattern"],
            "every": _seconds(record["every"]),
            "keep": {option: keep[option] for option in KEEP_OPTIONS if option in keep},
            "to": _text(record.get("to")), "next": iso(record.get("next")),
            "last": iso(record.get("last")), "runs": runs if type(runs) is int else 0,
            "last_run": record.get("last_run") if isinstance(record.get("last_run"), dict)
            else None,
            "automation": _text(record.get("automation"))}


def set_schedule(ctx, pattern: str, every, keep: dict | None = None,
                 to: str | None = None, dry_run: bool = False) -> dict:
    """Back up the VMs matching ``pattern`` (as they are at each run) every
    ``every`` (seconds, or ``30m``, ``12h``, ``1d``), keeping what ``keep``
    says (``{last, daily, weekly}``: Proxmox's prune semantics; none: all),
    on hosts matching ``to``.  Scheduling a pattern again changes its
    schedule.  The schedule, with ``state``: ``created`` or ``changed``
    (``dry-run``: nothing written, ``would`` says which), and ``matching``:
    the VMs ``[{name, host}]`` the pattern matches now -- none is accepted
    (a schedule may be meant for VMs to come) and said."""
    if not isinstance(pattern, str):
        raise UsageError(f"bad VM pattern {pattern!r}")
    vm_pattern(pattern)
    every, keep = _every(every), _keep(keep)
    to = host_pattern(to) if to is not None else None
    from engine.backups import schedules
    from engine.cluster import read_vms
    from engine.errors import NoPeers
    from .select import by_host_and_name, match_vms
    store = ctx.store()
    matching = [{"name": vm["name"], "host": vm["host"]} for vm in
                by_host_and_name(match_vms(read_vms(store), [pattern])[0])]
    if dry_run:
        known = schedules.read(store, schedules.schedule_id(pattern))
        now = time.time()
        record = {**(known or {}), "id": schedules.schedule_id(pattern), "pattern": pattern,
                  "every": every, "keep": keep, "to": to,
                  "next": now + every if known is None else min(known.get("next", now),
                                                                now + every)}
        return dict(_schedule_doc(record), state="dry-run",
                    would="create" if known is None else "change", matching=matching)
    try:
        record = schedules.put(store, pattern, every, keep, to)
    except NoPeers as exc:          # nothing written: the record goes with its automation
        raise Failed(str(exc), result={"schedule": None, "state": "failed"}) from None
    new = record["created"] == record["changed"]
    return dict(_schedule_doc(record), state="created" if new else "changed",
                matching=matching)


def _schedules(store) -> tuple[list[dict], set[str]]:
    """Every readable schedule, and the ids whose record is unreadable."""
    from engine.core import keys
    from engine.core.values import readable
    import engine.backups.schedules  # noqa: F401  (declares schedules/backup/)
    records, garbled = [], set()
    for kv in store.range(keys.backup_schedule())[0]:
        record = readable(kv)
        if record is None:
            garbled.add(keys.suffix(kv.key, keys.backup_schedule()))
        else:
            records.append(record)
    return records, garbled


def list_schedules(ctx) -> list[dict]:
    """Every backup schedule (an unreadable record is reported and skipped)."""
    return [_schedule_doc(record) for record in _schedules(ctx.store())[0]]


def find_schedules(ctx, which: list[str]) -> list[dict]:
    """The schedules ``which`` names, each by its id or the pattern it was
    made with, each once; one naming none is ``Failed``."""
    for word in which:
        if not isinstance(word, str):
            raise UsageError(f"bad backup schedule {word!r}")
        vm_pattern(word)        # an id, or a pattern: either is a well-formed pattern
    records, garbled = _schedules(ctx.store())
    by_id = {record["id"]: record for record in records}
    by_pattern = {record["pattern"]: record for record in records}
    found: dict[str, dict] = {}
    for word in which:
        record = by_id.get(word) or by_pattern.get(word)
        if record is None:
            why = (f"backup schedule {word} is unreadable: scrub lists it, and scrub "
                   "--delete removes it" if word in garbled else
                   f"no backup schedule {word!r} (see backup schedule list)")
            unknown = Failed if word in garbled else NoSuch
            raise unknown(why, result={"state": "failed", "schedules": []})
        found[record["id"]] = record
    return [_schedule_doc(record) for record in found.values()]


def delete_schedules(ctx, which: list[str]) -> list[dict]:
    """Delete the schedules ``which`` names (ids or patterns; all are found
    before any is deleted); each as it was.  Their backups are kept."""
    chosen = find_schedules(ctx, which)
    from engine.backups import schedules
    for doc in chosen:
        try:
            schedules.delete(ctx.store(), doc["schedule"])
        except Failed:
            pass                # deleted meanwhile: as good
    return chosen
