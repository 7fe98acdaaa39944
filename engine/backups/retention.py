"""Which of a VM's backups a schedule keeps: Proxmox's prune semantics, and
the chains incremental backups form.

The options apply in the order ``last``, ``daily``, ``weekly``, each to the
backups the ones before it did not keep, newest first, as Proxmox's
``keep-*`` options do:

- ``last: N`` keeps the N newest;
- ``daily: N`` keeps the newest backup of each of the N newest days (UTC)
  that have one and whose day no earlier option already covered;
- ``weekly: N`` likewise for ISO weeks.

With no option at all, every backup is kept.  A backup the options drop is
still kept while a kept backup is built on it (an incremental's parent, or
the parent's parent...): a chain is never cut.  Deletion goes children
first, so that a crash between two deletions leaves whole chains.

A schedule prunes only what it made (:func:`schedule_drops`): its own
backups (``schedule`` in the record), never a protected one, one held by a
running restore, or one that any backup left standing builds on -- a
manual backup's parent made by the schedule included.  Protected backups
do not count toward the ``keep`` options.
"""
from __future__ import annotations

import datetime

__all__ = ["OPTIONS", "plan", "check_keep", "schedule_drops"]

OPTIONS = ("last", "daily", "weekly")


def check_keep(keep) -> dict:
    """``{last?, daily?, weekly?}`` with whole counts of at least 1."""
    if not isinstance(keep, dict) or set(keep) - set(OPTIONS) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in keep.values()):
        raise ValueError(f"keep must map {', '.join(OPTIONS)} to whole numbers of at least "
                         f"1, got {keep!r}")
    return dict(keep)


def _period(option: str, when: float):
    day = datetime.datetime.fromtimestamp(when, datetime.timezone.utc)
    if option == "daily":
        return day.date()
    if option == "weekly":
        return day.isocalendar()[:2]
    return when             # last: every backup its own


def _ancestors(backup: dict, by_id: dict[str, dict]) -> set[str]:
    """The ids ``backup`` builds on: its parent, the parent's parent..."""
    found, at = set(), backup
    while at.get("kind") == "incremental" and at.get("parent") in by_id \
            and at["parent"] not in found:
        found.add(at["parent"])
        at = by_id[at["parent"]]
    return found


def plan(backups: list[dict], keep: dict) -> tuple[list[dict], list[dict]]:
    """``(kept, dropped)`` of one VM's ``backups`` (records with ``id``,
    ``time``, ``kind``, ``parent``); ``dropped`` in deletion order."""
    if not keep:
        return list(backups), []
    newest_first = sorted(backups, key=lambda b: b["time"], reverse=True)
    marked: dict[str, bool] = {}
    for option in OPTIONS:
        count = keep.get(option)
        if not count:
            continue
        covered = {_period(option, b["time"]) for b in newest_first if marked.get(b["id"])}
        chosen = set()
        for backup in newest_first:
            if backup["id"] in marked:
                continue
            period = _period(option, backup["time"])
            if period in covered:
                continue
            if period not in chosen:
                if len(chosen) >= count:
                    break
                chosen.add(period)
                marked[backup["id"]] = True
            else:
                marked[backup["id"]] = False
    by_id = {b["id"]: b for b in backups}
    needed: set[str] = set()
    for backup_id in [i for i, kept in marked.items() if kept]:
        needed |= _ancestors(by_id[backup_id], by_id)
    kept = [b for b in newest_first if marked.get(b["id"]) or b["id"] in needed]
    dropped = [b for b in newest_first if b not in kept]     # newest first: children first
    return kept, dropped


def schedule_drops(backups: list[dict], schedule: str, keep: dict,
                   spared=frozenset()) -> list[dict]:
    """What schedule ``schedule`` deletes of one VM's ``backups`` (all of
    them, whoever made them), in deletion order: of its own unprotected
    backups, those ``keep`` does not keep, less ``spared`` (ids held by a
    running restore) and less every backup one left standing builds on."""
    own = [b for b in backups if b.get("schedule") == schedule and not b.get("protected")]
    _kept, dropped = plan(own, keep)
    by_id = {b["id"]: b for b in backups}
    gone = {b["id"] for b in dropped} - set(spared)
    needed: set[str] = set()
    for backup in backups:
        if backup["id"] not in gone:
            needed |= _ancestors(backup, by_id)
    return [b for b in dropped if b["id"] in gone - needed]
