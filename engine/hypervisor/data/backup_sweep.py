"""What backups that did not complete left on this host, swept when its
peer starts and periodically after (beside the ghost sweep).

A backup attempt cleans up after itself (``backup_discard``), but not when
the peer that must clean up is dead at that moment: a source peer killed
mid-copy comes back to a scratch volume, a checkpoint no record names,
perhaps a backup job still running in libvirtd; a target whose peer was
down keeps a partial volume.  Each is swept once no running automation
names its backup id:

- on the VM's host: backup jobs of peerctl's scratch volumes (a push job's
  target, a pull job's scratch: a pull job nobody finished) are aborted,
  scratch volumes ``backup-<id>-*`` deleted, and checkpoints ``peerctl-<id>``
  that no backup record names deleted (libvirt merges their bitmaps into
  their neighbours', so the recorded checkpoints still count every block
  written since them);
- on a target: volumes ``bk-<id>-*`` of the backup pool with no record,
  and the socket directories of ``qemu-nbd`` a pull left when its peer was
  killed (:func:`engine.hypervisor.storage.nbdpull.sweep_sockets`);
- replicas (:mod:`engine.hypervisor.data.replicas`): their checkpoints are
  spared while a ``replicas/`` record names them; volumes ``bk-replica*``
  of the image pool that no record names on this host (as its replica or
  as the disk a move onto the replica ``kept``) (a replica this host
  kept before it died and another host took over, an update cut short,
  the block maps of a delta update, ``bk-<id>-<dev>.map``, ``.srcmap``) are
  deleted;
- restores (:mod:`engine.hypervisor.data.restore_exports`): the NBD exports
  of restores that are no longer running are ended.

What is listed is read *before* the running automations and the records,
so that anything an attempt starting meanwhile makes is never listed: a
sweep never touches a backup in progress.  An automation that cannot be
read counts as naming every id: nothing is swept while it runs.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.core import keys
from engine.backups.records import recorded
from engine.core.values import readable
from engine.backups import replicas
from engine.hypervisor.storage import images, nbdpull
from engine.hypervisor.data import restore_exports
from engine.hypervisor.data.backups import CHECKPOINT, SCRATCH, is_test, store_pool
from engine.hypervisor.domain.records import owned_by

__all__ = ["sweep_backups"]

log = structlog.get_logger("peerctl.backups")

EVERY = object()        # an unreadable running automation: it may name any id
KINDS = ("backup", "backup_schedule", "replicate")     # the automations that take backups
REPLICA_VOLUME = "bk-" + replicas.checkpoint_prefix()  # a replica's volumes, in the image pool


def _running_backup_ids(store):
    """Backup ids named by the steps of running automations, or EVERY."""
    named = set()
    for kv in store.range(keys.task())[0]:
        summary = readable(kv)
        if summary is None:
            return EVERY
        if summary.get("state", "running") != "running" or summary.get("kind") not in KINDS:
            continue
        automation_id = keys.suffix(kv.key, keys.task())
        for entry in store.range(keys.auto(automation_id, "log/"))[0]:
            args = (readable(entry) or {}).get("args")
            if isinstance(args, dict) and isinstance(args.get("id"), str):
                named.add(args["id"])
    return named


def _id_of(name: str, prefix: str) -> str:
    return name[len(prefix):].split("-", 1)[0].split(".", 1)[0]


def sweep_backups(store, host) -> list[str]:
    """Sweep this host; returns what was removed."""
    if is_test(host.conn):
        return []
    exports = restore_exports.sweep(store, host)    # by restore: apart from the ids below
    pool = images.ensure_pool(host)
    pool.refresh(0)
    scratch = [v for v in pool.listAllVolumes(0) if v.name().startswith(SCRATCH)]
    kept = store_pool(host)
    kept.refresh(0)
    stored = [v for v in kept.listAllVolumes(0) if v.name().startswith("bk-")]
    held = [v for v in pool.listAllVolumes(0) if v.name().startswith(REPLICA_VOLUME)]
    domains = [d for d in host.conn.listAllDomains(0) if owned_by(d, host.host)]
    checkpoints = [(d, c) for d in domains for c in d.listAllCheckpoints(0)
                   if c.getName().startswith(CHECKPOINT)]
    running = _running_backup_ids(store)
    if running is EVERY:
        return exports
    records = {value["id"]: value for value in recorded(store)}
    replicated = replicas.read_all(store)
    named = {r.get("checkpoint") for r in records.values()} \
        | {(r.get("replica") or {}).get("checkpoint") for r in replicated}
    replica_volumes = {d["volume"] for r in replicated
                       if (r.get("replica") or {}).get("host") == host.host
                       for d in [*r["replica"]["disks"], *(r["replica"].get("pending") or [])]}
    replica_volumes |= {d["volume"] for r in replicated        # a hand-off's frozen disk
                        if (r.get("kept") or {}).get("host") == host.host
                        for d in r["kept"]["disks"]}
    removed = list(exports)
    for dom in domains:
        removed += _abort_stray_job(dom, running)
    for vol in scratch:
        if _id_of(vol.name(), SCRATCH) not in running:
            removed.append(_delete(vol))
    for vol in stored:
        backup_id = _id_of(vol.name(), "bk-")
        if backup_id not in running and backup_id not in records:
            removed.append(_delete(vol))
    for vol in held:
        if vol.name() not in replica_volumes and _id_of(vol.name(), "bk-") not in running:
            removed.append(_delete(vol))
    for dom, checkpoint in checkpoints:
        name = checkpoint.getName()
        if name[len(CHECKPOINT):] not in running and name not in named:
            try:
                checkpoint.delete(0)
                removed.append(name)
            except libvirt.libvirtError as exc:
                log.warning("checkpoint_not_swept", vm=dom.name(), checkpoint=name,
                            error=exc.get_error_message())
    removed += nbdpull.sweep_sockets()       # a pull's, its peer killed mid-read
    removed = [r for r in removed if r]
    if removed:
        log.warning("backup_leftovers_swept", host=host.host, removed=removed)
    return removed


def _abort_stray_job(dom, running) -> list[str]:
    try:
        xml = dom.backupGetXMLDesc(0)
    except libvirt.libvirtError:
        return []           # no backup job
    for target in [*ET.fromstring(xml).iter("target"), *ET.fromstring(xml).iter("scratch")]:
        path = target.get("file") or ""      # a push job's target, a pull job's scratch
        base = path.rsplit("/", 1)[-1]
        if base.startswith(SCRATCH) and _id_of(base, SCRATCH) not in running:
            try:
                dom.abortJob()
            except libvirt.libvirtError:
                return []
            return [f"job of {base}"]
    return []


def _delete(vol) -> str | None:
    try:
        name = vol.name()
        vol.delete(0)
        return name
    except libvirt.libvirtError:
        return None
