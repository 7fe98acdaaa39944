"""The requests of backups and restores (see ``automations/backups.py``).

On hosts, from :mod:`engine.hypervisor.data.backups`,
:mod:`engine.hypervisor.data.backup_pull` (pull-mode backups) and
:mod:`engine.hypervisor.data.restores`: ``backup_store``, ``backup_verify`` and
``backup_delete`` (the target), ``backup_take``, ``backup_finish`` and
``backup_prune`` (the VM's host), ``backup_discard`` (either),
``restore_disks`` (the host the restored VM runs on); from
:mod:`engine.hypervisor.data.restore_exports`, ``restore_export`` and
``restore_unexport`` (the host keeping the chain).

Run by the initiator (no target), reading etcd:

- ``backup_plan`` ``{uuid, host, to, full}`` -> ``{candidates: [HOST...],
  parent: {id, checkpoint, target} | None, why_full}``: the hosts that may
  keep the backup (alive, not drained, not the VM's own, matching ``to``),
  the newest backup's target first when it is one of them, so that the
  chain goes on there; ``parent`` is the VM's newest recorded backup.
- ``restore_plan`` ``{backup, owner?}`` -> ``{chain: [{id, host, libvirt_uri,
  pool, disks}], record}``: the backup's chain back to its full backup, each
  link's target alive; with ``owner`` (a restore's automation id) each link
  is held for it (:func:`engine.backups.records.hold`), refused when one is
  being deleted;
- ``backup_release`` ``{backups, owner}`` -> ``{released}``: those holds
  dropped, and stale ones met on the way.
"""
from __future__ import annotations

import fnmatch

from engine.core.handlers import handler
from engine.core.hosts import live_hosts
from engine.placement.drains import drained_hosts
from engine.errors import Conflict, Failed, RequestError
from engine.backups import records
from engine.backups.records import recorded
from engine.hypervisor.data import backup_pull, backups, restore_exports, restores
from engine.hypervisor.host.reachability import reached_at
from engine.natural import natural_key

handler("backup_store")(backup_pull.prepare_store)
handler("backup_take")(backup_pull.take)
handler("backup_verify")(backup_pull.verify)
handler("backup_finish")(backup_pull.finish)
handler("backup_prune")(backups.prune)
handler("backup_discard")(backups.discard)
handler("backup_delete")(backups.delete)
handler("restore_disks")(restores.restore_disks)
handler("restore_export")(restore_exports.serve)
handler("restore_unexport")(restore_exports.unserve)

MAX_CHAIN = 1000


@handler("backup_plan")
def backup_plan(host, args: dict) -> dict:
    uuid, home = args.get("uuid"), args.get("host")
    if not isinstance(uuid, str) or not isinstance(home, str):
        raise RequestError("backup_plan needs the VM's uuid and host")
    pattern = args.get("to") or "*"
    alive, drained = live_hosts(host.store), drained_hosts(host.store)
    eligible = sorted((name for name in alive
                       if name != home and name not in drained
                       and fnmatch.fnmatchcase(name, pattern)), key=natural_key)
    if not eligible:
        others = sorted(set(alive) - {home})
        raise RequestError(
            f"no host to keep the backup: {'none of ' + ', '.join(others) if others else 'no host'}"
            f"{' matching --to ' + pattern if args.get('to') else ''} is up, undrained and "
            f"not the VM's own ({home})")
    mine = sorted((r for r in recorded(host.store)      # one being deleted is no parent
                   if r["uuid"] == uuid and not r.get("deleting")),
                  key=lambda r: r["time"])
    newest = mine[-1] if mine else None
    parent, why_full = None, None
    if newest is not None:
        if newest["target"] in eligible:
            eligible.remove(newest["target"])
            eligible.insert(0, newest["target"])
            parent = {"id": newest["id"], "checkpoint": newest.get("checkpoint"),
                      "target": newest["target"]}
        else:
            why_full = (f"the previous backup {newest['id']} is on {newest['target']}, "
                        "which cannot take this one (down, drained or not in --to)")
    return {"candidates": eligible, "parent": parent, "why_full": why_full,
            "hosts": {name: reached_at(alive[name]) for name in eligible}}


@handler("restore_plan")
def restore_plan(host, args: dict) -> dict:
    backup_id = args.get("backup")
    if not isinstance(backup_id, str):
        raise RequestError("restore_plan needs a backup id")
    by_id = {r["id"]: r for r in recorded(host.store)}
    alive = live_hosts(host.store)
    chain, at = [], backup_id
    while at is not None:
        record = by_id.get(at)
        if record is None:
            raise RequestError(f"backup {at} is not recorded (deleted, or its record is "
                               "unreadable)" + (f": backup {backup_id} needs it" if chain
                                                 else ""))
        if record["target"] not in alive:
            raise RequestError(f"backup {at} is on {record['target']}, which is down")
        chain.append({"id": record["id"], "host": record["target"],
                      "libvirt_uri": reached_at(alive[record["target"]]),
                      "pool": record.get("pool"), "disks": record["disks"]})
        at = record.get("parent") if record.get("kind") == "incremental" else None
        if len(chain) > MAX_CHAIN:
            raise RequestError(f"backup {backup_id}: its chain loops or is too long")
    chain.reverse()
    owner = args.get("owner")
    if isinstance(owner, str) and owner:
        try:
            records.hold(host.store, [link["id"] for link in chain], owner)
        except (Failed, Conflict) as exc:
            raise RequestError(str(exc)) from None
    return {"chain": chain, "record": by_id[backup_id]}


@handler("backup_release")
def backup_release(host, args: dict) -> dict:
    backups, owner = args.get("backups"), args.get("owner")
    if not isinstance(backups, list) or not isinstance(owner, str):
        raise RequestError("backup_release needs the backups and their owner")
    records.release(host.store, [b for b in backups if isinstance(b, str)], owner)
    return {"released": backups}
