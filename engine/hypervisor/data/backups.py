"""Backups of a VM's disks: taken live on the VM's host, kept in a storage
pool of another host's libvirt, recorded in etcd once verified there.

A backup is a replayed automation (``automations/backups.py``) sending
these requests; each is idempotent by backup id, so that a step run again
after a crash finds or redoes the first run's work, never half of it.

On the VM's host (the source):

- :func:`take`: the point in time is a libvirt push-mode backup job
  (``virDomainBackupBegin``) into scratch volumes ``backup-<id>-<dev>.qcow2``
  of the host's own pool, with a checkpoint ``peerctl-<id>`` created in the
  same call: QEMU's persistent dirty bitmap on the qcow2 disk counts every
  block written from then on.  The backup is **incremental** (only the
  blocks written since the parent's checkpoint) when the parent's checkpoint
  is on the domain and every disk is qcow2 version 3; otherwise **full**,
  and the reply says why.  When the guest agent answers, the guest's
  filesystems are frozen around the job's start (``filesystem-frozen``),
  else the backup is ``crash-consistent``.  A shut-off VM is copied whole
  (``shut-off``), after its qcow2 version 2 disks are amended to version 3,
  which is safe only then.  The scratch volumes then travel to the target's
  pool through libvirt (:mod:`engine.hypervisor.storage.volcopy`), checksummed, and
  are deleted.  Run again, it first undoes what an earlier run left (a job
  still running, scratch volumes, its checkpoint) and starts over.
- :func:`prune` keeps only the newest backup's checkpoint;
- :func:`discard` undoes an attempt that will not complete: on the source
  its job, scratch volumes and checkpoint (a checkpoint no backup record
  names is never trusted anyway: the next incremental starts from the
  newest *recorded* backup's checkpoint); on the target its volumes, unless
  a record says the backup completed.

On the target:

- :func:`prepare_store`: the backup pool (``backup_pool``, else a dir pool
  under the state directory), with room for the VM's disks;
- :func:`verify`: reads the volumes back, compares their checksums with
  what was sent, and only then writes ``backups/<id>``; a damaged copy is
  deleted, never recorded;
- :func:`delete`: the volumes, then the record (never a protected backup,
  nor one a running restore reads).

The test driver keeps no volume content and runs no backup jobs: a backup
there records the VM's disks with nothing copied (``reason`` says so), so
that the commands can be exercised on it.
"""
from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.core import failpoints, keys, steps
from engine.core.store import Put, absent
from engine.core.values import readable
from engine.errors import Conflict, Failed, RequestError
from engine.backups import records  # noqa: F401  (declares backups/)
from engine.hypervisor.storage import images, qcow2
from engine.hypervisor.storage.checksum import ContentHash
from engine.hypervisor.domain.definition import definition_of
from engine.hypervisor.domain.domain_xml import volume_xml
from engine.hypervisor.domain.guest_agent import freeze, thaw
from engine.hypervisor.domain.disks import ACTIVE, disks_of
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.domain.lookup import find_domain, uuid_arg, vm_label
from engine.hypervisor.storage.volcopy import checksum_volume, copy_volume, physical_size

__all__ = ["take", "prune", "discard", "prepare_store", "verify", "delete", "store_pool",
           "volume_name", "checkpoint_name", "is_test", "Ticker", "discard_source",
           "REPLICA_CHECKPOINT"]

log = structlog.get_logger("peerctl.backups")

POOL = "peerctl-backup"
SCRATCH = "backup-"
CHECKPOINT = "peerctl-"
REPLICA_CHECKPOINT = CHECKPOINT + "replica"     # engine.backups.replicas.replica_id's checkpoints
POLL = 0.1
NO_CONTENT = "the test driver keeps no disk content: nothing was copied"


def volume_name(backup_id: str, dev: str) -> str:
    """A backup's volume in the target's pool."""
    return f"bk-{backup_id}-{dev}.qcow2"


def scratch_name(backup_id: str, dev: str) -> str:
    return f"{SCRATCH}{backup_id}-{dev}.qcow2"


def checkpoint_name(backup_id: str) -> str:
    return f"{CHECKPOINT}{backup_id}"


def is_test(conn) -> bool:
    return conn.getType().upper() == "TEST"


def _backup_id(args: dict) -> str:
    value = args.get("id")
    if not isinstance(value, str) or not value.isalnum() or len(value) > 40:
        raise RequestError(f"bad backup id {value!r}")
    return value


def store_pool(host) -> libvirt.virStoragePool:
    """The pool this host keeps other hosts' backups in."""
    if host.backup_pool:
        try:
            pool = host.conn.storagePoolLookupByName(host.backup_pool)
        except libvirt.libvirtError:
            raise RequestError(f"host {host.host}: its backup_pool {host.backup_pool!r} is no "
                               "storage pool of its libvirt") from None
        if not pool.isActive():
            pool.create(0)
        return pool
    return images.ensure_dir_pool(host, f"{POOL}-{host.host}",
                                  os.path.join(os.path.abspath(host.state_dir), "backups"))


class Ticker:
    """Progress of a long copy as the step's progress, twice a second:
    ``{phase: "copying 12.0 MiB of 20.0 MiB", percent, bytes, total}``."""

    def __init__(self, verb: str, total: int):
        self.verb, self.total, self.base, self.last = verb, max(total, 1), 0, 0.0

    def __call__(self, done: int, _total: int = 0, force: bool = False) -> None:
        failpoints.crash(self.verb)         # "copying", "verifying", "restoring": tests
        now = time.monotonic()
        if not force and now - self.last < 0.5:
            return
        self.last = now
        done = min(self.base + done, self.total)
        steps.progress({"phase": f"{self.verb} {_mib(done)} of {_mib(self.total)}",
                        "percent": int(100 * done / self.total), "bytes": done,
                        "total": self.total})

    def next(self, size: int) -> None:
        self.base += size


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


# -- the target --------------------------------------------------------------

def prepare_store(host, args: dict) -> dict:
    """``{id, needed}`` -> ``{host, libvirt_uri, pool, free}``; an earlier
    try's volumes of this backup are removed first."""
    backup_id = _backup_id(args)
    needed = int(args.get("needed") or 0)
    pool = store_pool(host)
    pool.refresh(0)
    _delete_volumes(pool, f"bk-{backup_id}-")
    free = pool.info()[3]
    if free < needed:
        raise RequestError(f"host {host.host} has no room: {free >> 20} MiB free in pool "
                           f"{pool.name()}, the disks need up to {needed >> 20} MiB")
    return {"host": host.host, "libvirt_uri": host.remote_uri, "pool": pool.name(),
            "free": free}


def _delete_volumes(pool, prefix: str) -> list[str]:
    gone = []
    for vol in pool.listAllVolumes(0):
        if vol.name().startswith(prefix):
            try:
                vol.delete(0)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
                    raise
            gone.append(vol.name())
    return gone


def verify(host, args: dict) -> dict:
    """``{id, record}``: the volumes are read back and checksummed; the
    record is written (once) only when every disk matches."""
    backup_id = _backup_id(args)
    record = args.get("record")
    if not isinstance(record, dict) or not isinstance(record.get("disks"), list):
        raise RequestError("verify needs the backup's record")
    key = keys.backup(backup_id)
    known = readable(host.store.get(key))
    if known is not None:
        return known
    pool = store_pool(host)
    pool.refresh(0)
    test = is_test(host.conn)
    ticker = Ticker("verifying", sum(d.get("stored", 0) for d in record["disks"]))
    for disk in record["disks"]:
        vol = images.lookup(pool, disk["volume"])
        if test:
            vol = vol or pool.createXML(volume_xml(disk["volume"], 0, "raw"), 0)
            found, length = ContentHash().hexdigest(), 0
        elif vol is None:
            raise RequestError(f"backup {backup_id}: volume {disk['volume']} is not in pool "
                               f"{pool.name()} on {host.host}")
        else:
            found, length = checksum_volume(host.conn, vol, ticker, steps.abort_requested)
            ticker.next(physical_size(vol))
        if found != disk["checksum"]:
            _delete_volumes(pool, f"bk-{backup_id}-")
            raise RequestError(f"backup {backup_id}: disk {disk['dev']} arrived damaged on "
                               f"{host.host} ({length} bytes, checksum {found}, where "
                               f"{disk.get('stored')} bytes, checksum {disk['checksum']} were "
                               "sent): discarded")
    value = {**record, "id": backup_id, "target": host.host, "pool": pool.name()}
    if not host.store.txn([absent(key)], [Put(key, value)]).succeeded:
        return readable(host.store.get(key)) or value
    log.info("backup_recorded", backup=backup_id, vm=record.get("vm"), kind=record.get("kind"),
             bytes=record.get("bytes"))
    return value


def delete(host, args: dict) -> dict:
    """``{id}``: the backup's volumes in this host's pool, then its record;
    refused, nothing deleted, while it is protected or a running restore
    holds it (:func:`engine.backups.records.begin_delete` marks it first,
    so that no restore starts reading it meanwhile)."""
    backup_id = _backup_id(args)
    try:            # refused while protected or read by a running restore
        records.begin_delete(host.store, backup_id)
    except (Failed, Conflict) as exc:
        raise RequestError(str(exc)) from None
    pool = store_pool(host)
    pool.refresh(0)
    gone = _delete_volumes(pool, f"bk-{backup_id}-")
    host.store.delete(keys.backup(backup_id))
    log.info("backup_deleted", backup=backup_id, volumes=gone)
    return {"id": backup_id, "deleted": gone}


# -- the source --------------------------------------------------------------

def _vol(conn, path: str):
    try:
        return conn.storageVolLookupByPath(path)
    except libvirt.libvirtError as exc:
        raise RequestError(f"disk {path}: {exc.get_error_message()}") from None


def _job_running(dom) -> bool:
    try:
        return dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE
    except libvirt.libvirtError:
        return False


def _our_job(dom, backup_id: str) -> bool:
    try:
        return f"{SCRATCH}{backup_id}-" in dom.backupGetXMLDesc(0)   # its scratch files
    except libvirt.libvirtError:
        return False


def end_job(dom, backup_id: str) -> bool:
    """This backup's job on ``dom``, if it runs, aborted (a push job's
    abort; a pull job's normal end) and waited for; True if there was one."""
    if dom is None or not dom.isActive() or not _our_job(dom, backup_id):
        return False
    try:
        dom.abortJob()
    except libvirt.libvirtError:
        pass
    deadline = time.monotonic() + 60
    while _job_running(dom) and time.monotonic() < deadline:
        time.sleep(POLL)
    return True


def _undo_here(host, dom, backup_id: str) -> list[str]:
    """What an earlier run of this backup left on the source: its job is
    aborted, its scratch volumes and checkpoint deleted."""
    undone = []
    if dom is not None and dom.isActive():
        try:
            dom.fsThaw(None, 0)     # a run that died between freeze and thaw
        except libvirt.libvirtError:
            pass                    # nothing frozen, or no guest agent
    if end_job(dom, backup_id):
        undone.append("job")
    pool = images.ensure_pool(host)
    pool.refresh(0)
    undone += _delete_volumes(pool, f"{SCRATCH}{backup_id}-")
    if dom is not None:
        try:
            dom.checkpointLookupByName(checkpoint_name(backup_id)).delete(0)
            undone.append(checkpoint_name(backup_id))
        except libvirt.libvirtError:
            pass
    return undone


def discard_source(host, uuid: str, backup_id: str) -> list[str]:
    """What an attempt ``backup_id`` left on the VM's host: its job, its
    scratch volumes, its checkpoint."""
    return _undo_here(host, find_domain(host, uuid), backup_id)


def discard(host, args: dict) -> dict:
    """``{id, uuid}``: undo this attempt's leftovers on this host, source or
    target alike (a backup whose record exists keeps its volumes)."""
    backup_id = _backup_id(args)
    uuid = args.get("uuid")
    dom = find_domain(host, uuid) if isinstance(uuid, str) else None
    removed = _undo_here(host, dom, backup_id)
    if readable(host.store.get(keys.backup(backup_id))) is None:
        pool = store_pool(host)
        pool.refresh(0)
        removed += _delete_volumes(pool, f"bk-{backup_id}-")
    if removed:
        log.info("backup_discarded", backup=backup_id, removed=removed)
    return {"id": backup_id, "removed": removed}


def prune(host, args: dict) -> dict:
    """``{uuid, keep, only?}``: every backup checkpoint of the VM but
    ``keep`` is deleted (libvirt merges its bitmap into its neighbour's);
    with ``only`` (a name prefix), every checkpoint so named but ``keep``.
    Backups leave replicas' checkpoints alone, and replicas backups'."""
    uuid = uuid_arg(args)
    dom = find_domain(host, uuid)
    if dom is None or is_test(host.conn):
        return {"uuid": uuid, "deleted": []}
    only = args.get("only")
    deleted = []
    for checkpoint in dom.listAllCheckpoints(0):
        name = checkpoint.getName()
        ours = name.startswith(only) if only else \
            name.startswith(CHECKPOINT) and not name.startswith(REPLICA_CHECKPOINT)
        if ours and name != args.get("keep"):
            try:
                checkpoint.delete(0)
                deleted.append(name)
            except libvirt.libvirtError as exc:
                log.warning("checkpoint_not_deleted", vm=uuid, checkpoint=name,
                            error=exc.get_error_message())
    return {"uuid": uuid, "deleted": deleted}


def take(host, args: dict) -> dict:
    """``{uuid, name, id, store: {host, libvirt_uri, pool}, parent: {id,
    checkpoint} | None, full, why_full}`` -> ``{id, kind, parent, reason,
    consistency, checkpoint, time, bytes, disks: [{dev, volume, capacity,
    bytes, stored, checksum}]}``."""
    uuid, backup_id = uuid_arg(args), _backup_id(args)
    store = args.get("store")
    if not isinstance(store, dict) or not all(isinstance(store.get(k), str)
                                              for k in ("host", "libvirt_uri", "pool")):
        raise RequestError("take needs the target's store (backup_store)")
    dom = find_domain(host, uuid)
    if dom is None:
        raise RequestError(f"{vm_label(args, uuid)} is not on host {host.host}")
    _undo_here(host, dom, backup_id)
    disks = disks_of(host.conn, ET.fromstring(dom.XMLDesc(0)))
    if not disks:
        raise RequestError(f"{vm_label(args, uuid)} has no disk to back up")
    if is_test(host.conn):
        return _recorded_only(dom, backup_id, disks)
    started = time.time()
    pool = images.ensure_pool(host)
    if vm_state(dom) in ACTIVE:
        point = _live_point(host, dom, disks, backup_id, pool, args)
    else:
        point = _offline_point(host, dom, disks, backup_id, pool)
    copied = _send(host, disks, backup_id, pool, store)
    _delete_volumes(pool, f"{SCRATCH}{backup_id}-")
    log.info("backup_taken", vm=dom.name(), backup=backup_id, kind=point["kind"],
             bytes=sum(d["bytes"] for d in copied), reason=point["reason"])
    return {"id": backup_id, **point, "time": started, "build": _definition(dom),
            "bytes": sum(d["bytes"] for d in copied), "disks": copied}


def _definition(dom) -> dict:
    """``build``'s arguments for this VM, without its identity."""
    build = definition_of(dom)
    return {k: v for k, v in build.items() if k not in ("uuid", "name")}


def _recorded_only(dom, backup_id: str, disks: list[dict]) -> dict:
    return {"id": backup_id, "kind": "full", "parent": None, "reason": NO_CONTENT,
            "build": _definition(dom),
            "consistency": "crash-consistent", "checkpoint": None, "time": time.time(),
            "bytes": 0,
            "disks": [{"dev": d["dev"], "volume": volume_name(backup_id, d["dev"]),
                       "capacity": d["capacity"], "bytes": 0, "stored": 0,
                       "checksum": ContentHash().hexdigest()} for d in disks]}


def _old_disks(host, disks: list[dict]) -> list[str]:
    """The disks that cannot carry a checkpoint (not qcow2 version 3)."""
    return [d["dev"] for d in disks
            if d["format"] != "qcow2" or qcow2.version(_vol(host.conn, d["path"])) != "1.1"]


def _why_full(dom, old: list[str], args: dict) -> str | None:
    """Why this backup cannot be incremental, or None when it can."""
    if old:
        return (f"disk {', '.join(old)} cannot carry a checkpoint (not qcow2 version 3); "
                "it is amended when the VM is next shut off")
    parent = args.get("parent")
    if args.get("full"):
        return "a full backup was asked for"
    if not isinstance(parent, dict):
        return args.get("why_full") or "the VM's first backup"
    what = parent.get("what") or f"backup {parent.get('id')}"
    if not parent.get("checkpoint"):
        return f"{what} left no checkpoint to start from"
    names = {c.getName() for c in dom.listAllCheckpoints(0)}
    if parent.get("checkpoint") not in names:
        return (f"the checkpoint of {what} is gone from the VM (a move could not "
                "carry it, or the VM was rebuilt or restored since)")
    return None


def _backup_xml(root: ET.Element, disks: list[dict], backup_id: str, directory: str,
                incremental: str | None) -> tuple[str, str | None]:
    wanted = {d["dev"] for d in disks}
    backup = ET.Element("domainbackup", mode="push")
    if incremental:
        ET.SubElement(backup, "incremental").text = incremental
    listed = ET.SubElement(backup, "disks")
    checkpoint = ET.Element("domaincheckpoint")
    ET.SubElement(checkpoint, "name").text = checkpoint_name(backup_id)
    marked = ET.SubElement(checkpoint, "disks")
    for target in root.findall("./devices/disk/target"):
        dev = target.get("dev")
        if dev in wanted:
            disk = ET.SubElement(listed, "disk", name=dev, backup="yes", type="file")
            ET.SubElement(disk, "target",
                          file=os.path.join(directory, scratch_name(backup_id, dev)))
            ET.SubElement(disk, "driver", type="qcow2")
            ET.SubElement(marked, "disk", name=dev, checkpoint="bitmap")
        else:
            ET.SubElement(listed, "disk", name=dev, backup="no")
            ET.SubElement(marked, "disk", name=dev, checkpoint="no")
    return ET.tostring(backup, encoding="unicode"), ET.tostring(checkpoint, encoding="unicode")


def _live_point(host, dom, disks, backup_id, pool, args) -> dict:
    """The backup job, begun (with its checkpoint) and waited for."""
    old = _old_disks(host, disks)
    reason = _why_full(dom, old, args)
    parent = None if reason else args["parent"]
    can_checkpoint = not old
    root = ET.fromstring(dom.XMLDesc(0))
    directory = ET.fromstring(pool.XMLDesc(0)).findtext("./target/path")
    frozen = freeze(dom)
    try:
        try:
            _begin(dom, root, disks, backup_id, directory,
                   parent["checkpoint"] if parent else None, can_checkpoint)
        except libvirt.libvirtError as exc:
            if parent is None:
                raise RequestError(f"backup of {dom.name()} refused: "
                                   f"{exc.get_error_message()}") from None
            reason = f"QEMU refused an incremental backup ({exc.get_error_message()})"
            parent = None
            _undo_here(host, dom, backup_id)
            _begin(dom, root, disks, backup_id, directory, None, True)
    finally:
        if frozen:
            thaw(dom)
    _wait_for_job(dom)
    pool.refresh(0)
    for disk in disks:
        scratch = images.lookup(pool, scratch_name(backup_id, disk["dev"]))
        if scratch is None:
            raise RequestError(f"backup of {dom.name()}: QEMU wrote no {disk['dev']}")
        qcow2.detach_backing(scratch.path())
    return {"kind": "incremental" if parent else "full",
            "parent": parent["id"] if parent else None, "reason": reason,
            "consistency": "filesystem-frozen" if frozen else "crash-consistent",
            "checkpoint": checkpoint_name(backup_id) if can_checkpoint else None}


def _begin(dom, root, disks, backup_id, directory, incremental, with_checkpoint) -> None:
    backup, checkpoint = _backup_xml(root, disks, backup_id, directory, incremental)
    dom.backupBegin(backup, checkpoint if with_checkpoint else None, 0)
    failpoints.crash("backup begun")        # tests: a peer dead while its job runs


def _wait_for_job(dom) -> None:
    """Until the backup job ends; it must end well."""
    ticker = None
    while _job_running(dom):
        if steps.abort_requested():
            try:
                dom.abortJob()
            except libvirt.libvirtError:
                pass
            raise RequestError("stopped: asked to abort")
        try:
            stats = dom.jobStats(0)
        except libvirt.libvirtError:
            stats = {}
        if stats.get("disk_total"):
            ticker = ticker or Ticker("taking", stats["disk_total"])
            ticker(stats.get("disk_processed", 0))
        time.sleep(POLL)
    stats = dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED)
    if stats.get("type") != libvirt.VIR_DOMAIN_JOB_COMPLETED or stats.get("success") is False:
        raise RequestError(f"backup job of {dom.name()} failed: "
                           f"{stats.get('errmsg') or 'libvirt says it did not complete'}")


def _offline_point(host, dom, disks, backup_id, pool) -> dict:
    """A shut-off VM: its disks copied whole (flattened) into scratch
    volumes; qcow2 version 2 disks are amended to version 3 first."""
    for disk in disks:
        vol = _vol(host.conn, disk["path"])
        if disk["format"] == "qcow2" and qcow2.version(vol) != "1.1":
            qcow2.amend_to_v3(disk["path"])
            log.info("disk_amended", vm=dom.name(), disk=disk["dev"], compat="1.1")
        pool.createXMLFrom(volume_xml(scratch_name(backup_id, disk["dev"]),
                                             disk["capacity"], "qcow2"), vol, 0)
    return {"kind": "full", "parent": None, "reason": "the VM is shut off: copied whole",
            "consistency": "shut-off", "checkpoint": None}


def _send(host, disks, backup_id, pool, store) -> list[dict]:
    """The scratch volumes, copied into the target's pool through libvirt."""
    scratch = {d["dev"]: images.lookup(pool, scratch_name(backup_id, d["dev"])) for d in disks}
    ticker = Ticker("copying", sum(physical_size(v) for v in scratch.values()))
    same = host.is_me(store["libvirt_uri"])
    try:
        target = host.conn if same else libvirt.open(store["libvirt_uri"])
    except libvirt.libvirtError as exc:
        raise RequestError(f"cannot reach the hypervisor of {store['host']}: "
                           f"{exc.get_error_message()}") from None
    try:
        dst_pool = target.storagePoolLookupByName(store["pool"])
        copied = []
        for disk in disks:
            vol = scratch[disk["dev"]]
            size = physical_size(vol)
            sent, checksum = copy_volume(host.conn, vol, target, dst_pool,
                                         volume_name(backup_id, disk["dev"]), ticker,
                                         steps.abort_requested)
            ticker.next(size)
            copied.append({"dev": disk["dev"], "volume": volume_name(backup_id, disk["dev"]),
                           "capacity": disk["capacity"], "bytes": sent, "stored": size,
                           "checksum": checksum})
        ticker(0, force=True)
        return copied
    except libvirt.libvirtError as exc:
        raise RequestError(f"backup to {store['host']}: {exc.get_error_message()}") from None
    finally:
        if not same:
            try:
                target.close()
            except libvirt.libvirtError:
                pass
