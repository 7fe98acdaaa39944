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
"""
from __future__ import annotations

import datetime

__all__ = ["OPTIONS", "plan", "check_keep"]

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
    needed = set()
    for backup_id in [i for i, kept in marked.items() if kept]:
        at = by_id[backup_id]
        while at.get("kind") == "incremental" and at.get("parent") in by_id:
            at = by_id[at["parent"]]
            needed.add(at["id"])
    kept = [b for b in newest_first if marked.get(b["id"]) or b["id"] in needed]
    dropped = [b for b in newest_first if b not in kept]     # newest first: children first
    return kept, dropped
