"""Pull-mode backups: the target reads the VM's disks straight from an NBD
export on the VM's host and writes them once into its backup pool,
checksumming on the way (docs/backups.md, "How the data gets there").

The requests of :mod:`engine.hypervisor.data.backups` keep their names and
their order; what each does for a running VM on QEMU, when the target said
it can pull (``backup_store``'s ``pull``):

- ``backup_take`` on the VM's host (:func:`take`): a libvirt **pull-mode**
  backup job (``<domainbackup mode='pull'>``), begun with its checkpoint in
  the same call as a push job was, and left running: QEMU serves each disk
  as an NBD export (name ``<dev>``; for an incremental, the dirty bitmap
  ``backup-<dev>`` since the parent's checkpoint beside it) on the host's
  address (its ``migration_address``, else loopback), on a port of
  :data:`PORTS`; blocks the guest overwrites meanwhile are kept in a
  scratch file ``backup-<id>-<dev>.qcow2`` of the host's pool, so that the
  export stays the point in time.  Each disk of the reply carries its
  ``export``: ``{address, port, name, bitmap}``.
- ``backup_verify`` on the target (:func:`verify`): each disk is pulled
  (:func:`engine.hypervisor.storage.nbdpull.pull`) into a new qcow2 volume
  ``bk-<id>-<dev>.qcow2``, checksummed as it passes; then the record is
  written, with the checksums of what was received (``checksum_of:
  content``): the volume is not read back.  Run again (a target peer that
  died mid-read), it deletes what the first run wrote and pulls again from
  the export, which lives in the VM host's libvirtd until ``backup_finish``.
- ``backup_finish`` on the VM's host (:func:`finish`): the job is ended
  (``virDomainAbortJob``: how a pull-mode job completes) and its scratch
  files removed; the checkpoint stays.  Idempotent.

Every other case (the test driver, a shut-off VM, a target that cannot
pull) goes on as :mod:`~engine.hypervisor.data.backups` did: push job, copy
through libvirt, read back.  A failed attempt is undone by ``backup_discard``
as before (it aborts this backup's job, pull or push alike), and the sweep
(:mod:`~engine.hypervisor.data.backup_sweep`) ends a pull job nobody
finished once no running automation names its backup.
"""
from __future__ import annotations

import errno
import os
import socket
import time
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.core import failpoints, keys, steps
from engine.core.store import Put, absent
from engine.core.values import readable
from engine.errors import RequestError
from engine.hypervisor.data import backups
from engine.hypervisor.data.backups import Ticker, checkpoint_name, volume_name
from engine.hypervisor.domain.disks import ACTIVE, disks_of
from engine.hypervisor.domain.domain_xml import volume_xml
from engine.hypervisor.domain.guest_agent import freeze, thaw
from engine.hypervisor.domain.lookup import find_domain, uuid_arg, vm_label
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.storage import images, nbdpull

__all__ = ["prepare_store", "take", "verify", "finish", "PORTS", "CONTENT"]

log = structlog.get_logger("peerctl.backups")

PORTS = (10809, 10872)      # the exports' TCP ports (10809: NBD's own), tried in turn
CONTENT = "content"         # a disk's checksum is of its content, not of its file
LOOPBACK = "127.0.0.1"


def prepare_store(host, args: dict) -> dict:
    """``backup_store``, saying that this target pulls."""
    return {**backups.prepare_store(host, args), "pull": True}


# -- the VM's host -----------------------------------------------------------------

def take(host, args: dict) -> dict:
    """``backup_take``: a pull-mode job left running for the target, when
    it can pull and the VM runs on QEMU; else as before."""
    store = args.get("store")
    if not isinstance(store, dict) or not store.get("pull") or backups.is_test(host.conn):
        return backups.take(host, args)
    uuid, backup_id = uuid_arg(args), backups._backup_id(args)
    dom = find_domain(host, uuid)
    if dom is None or vm_state(dom) not in ACTIVE:
        return backups.take(host, args)
    backups._undo_here(host, dom, backup_id)
    disks = disks_of(host.conn, ET.fromstring(dom.XMLDesc(0)))
    if not disks:
        raise RequestError(f"{vm_label(args, uuid)} has no disk to back up")
    started = time.time()
    point, port = _export(host, dom, disks, backup_id, args)
    address = _address(host)
    exported = [{"dev": d["dev"], "volume": volume_name(backup_id, d["dev"]),
                 "capacity": d["capacity"],
                 "export": {"address": address, "port": port, "name": d["dev"],
                            "bitmap": f"backup-{d['dev']}" if point["parent"] else None}}
                for d in disks]
    log.info("backup_exported", vm=dom.name(), backup=backup_id, kind=point["kind"],
             address=address, port=port, reason=point["reason"])
    return {"id": backup_id, **point, "time": started, "build": backups._definition(dom),
            "bytes": 0, "disks": exported}


def _address(host) -> str:
    """Where other hosts reach this host's QEMU: its migration address."""
    return (host.migration or {}).get("migration_address") or LOOPBACK


def _export(host, dom, disks, backup_id, args) -> tuple[dict, int]:
    """The job begun (with its checkpoint), on a free port: ``(point, port)``."""
    old = backups._old_disks(host, disks)
    reason = backups._why_full(dom, old, args)
    parent = None if reason else args["parent"]
    can_checkpoint = not old
    root = ET.fromstring(dom.XMLDesc(0))
    pool = images.ensure_pool(host)
    directory = ET.fromstring(pool.XMLDesc(0)).findtext("./target/path")
    address = _address(host)
    frozen = freeze(dom)
    try:
        try:
            port = _begin(dom, root, disks, backup_id, directory, address,
                          parent["checkpoint"] if parent else None, can_checkpoint)
        except libvirt.libvirtError as exc:
            if parent is None:
                raise RequestError(f"backup of {dom.name()} refused: "
                                   f"{exc.get_error_message()}") from None
            reason = f"QEMU refused an incremental backup ({exc.get_error_message()})"
            parent = None
            backups._undo_here(host, dom, backup_id)
            port = _begin(dom, root, disks, backup_id, directory, address, None, True)
    finally:
        if frozen:
            thaw(dom)
    return ({"kind": "incremental" if parent else "full",
             "parent": parent["id"] if parent else None, "reason": reason,
             "consistency": "filesystem-frozen" if frozen else "crash-consistent",
             "checkpoint": checkpoint_name(backup_id) if can_checkpoint else None}, port)


def _free(address: str, port: int) -> bool:
    """Nothing listens on ``port`` here (a check, not a reservation: QEMU
    may still lose the race, and the next port is tried then)."""
    probe = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    try:
        probe.bind((address, port))
        return True
    except OSError as exc:
        return exc.errno not in (errno.EADDRINUSE, errno.EACCES)
    finally:
        probe.close()


def _begin(dom, root, disks, backup_id, directory, address, incremental,
           with_checkpoint) -> int:
    last = None
    for port in range(PORTS[0], PORTS[1] + 1):
        if not _free(address, port):
            continue
        backup, checkpoint = _backup_xml(root, disks, backup_id, directory, address, port,
                                         incremental)
        try:
            dom.backupBegin(backup, checkpoint if with_checkpoint else None, 0)
        except libvirt.libvirtError as exc:
            if "in use" not in (exc.get_error_message() or "") and \
                    "bind" not in (exc.get_error_message() or ""):
                raise
            last = exc
            continue
        failpoints.crash("backup begun")        # tests: a peer dead while its job runs
        return port
    if last is not None:
        raise last
    raise RequestError(f"no free port for the backup export in {PORTS[0]}-{PORTS[1]} "
                       f"on {address}")


def _backup_xml(root, disks, backup_id, directory, address, port,
                incremental) -> tuple[str, str]:
    """The push job's XML and checkpoint (:func:`backups._backup_xml`),
    turned into a pull job's: an NBD server, each disk's target its
    scratch file, exported under its name."""
    push, checkpoint = backups._backup_xml(root, disks, backup_id, directory, incremental)
    backup = ET.fromstring(push)
    backup.set("mode", "pull")
    backup.insert(1 if incremental else 0,
                  ET.Element("server", transport="tcp", name=address, port=str(port)))
    for disk in backup.iter("disk"):
        target = disk.find("target")
        if target is not None:
            target.tag = "scratch"
            disk.set("exportname", disk.get("name"))
    return ET.tostring(backup, encoding="unicode"), checkpoint


def finish(host, args: dict) -> dict:
    """``backup_finish`` ``{uuid, id}``: this backup's pull job ended and its
    scratch files gone; its checkpoint stays."""
    uuid, backup_id = uuid_arg(args), backups._backup_id(args)
    failpoints.crash("finishing")       # tests: the VM's host dead before the job ends
    dom = find_domain(host, uuid)
    ended = ["job"] if backups.end_job(dom, backup_id) else []
    pool = images.ensure_pool(host)
    pool.refresh(0)
    ended += backups._delete_volumes(pool, f"{backups.SCRATCH}{backup_id}-")
    return {"id": backup_id, "ended": ended}


# -- the target --------------------------------------------------------------------

def verify(host, args: dict) -> dict:
    """``backup_verify``: disks that carry an ``export`` are pulled here,
    checksummed as they arrive, and recorded; others are read back as before."""
    record = args.get("record")
    if not isinstance(record, dict) or not isinstance(record.get("disks"), list) or \
            not any(isinstance(d, dict) and d.get("export") for d in record["disks"]):
        return backups.verify(host, args)
    backup_id = backups._backup_id(args)
    key = keys.backup(backup_id)
    known = readable(host.store.get(key))
    if known is not None:
        return known
    pool = backups.store_pool(host)
    pool.refresh(0)
    backups._delete_volumes(pool, f"bk-{backup_id}-")      # an earlier, unfinished pull
    try:
        disks = [_pull(host, pool, backup_id, disk) for disk in record["disks"]]
    except BaseException:
        backups._delete_volumes(pool, f"bk-{backup_id}-")
        raise
    value = {**record, "id": backup_id, "target": host.host, "pool": pool.name(),
             "bytes": sum(d["bytes"] for d in disks), "disks": disks}
    if not host.store.txn([absent(key)], [Put(key, value)]).succeeded:
        return readable(host.store.get(key)) or value
    log.info("backup_recorded", backup=backup_id, vm=record.get("vm"), kind=record.get("kind"),
             bytes=value["bytes"], pulled=True)
    return value


def _pull(host, pool, backup_id: str, disk: dict) -> dict:
    export = disk.get("export")
    if not isinstance(export, dict) or not isinstance(export.get("address"), str) \
            or not isinstance(export.get("port"), int) or not isinstance(export.get("name"), str):
        raise RequestError(f"backup {backup_id}: disk {disk.get('dev')} has no export to read")
    name = volume_name(backup_id, disk["dev"])
    vol = pool.createXML(volume_xml(name, int(disk["capacity"]), "qcow2"), 0)
    ticker = Ticker("pulling", int(disk["capacity"]))

    def tick(done: int, total: int) -> None:
        ticker.total = max(total, 1)
        ticker(done)
    try:
        sent, checksum = nbdpull.pull((export["address"], export["port"]), export["name"],
                                      export.get("bitmap"), vol.path(), tick,
                                      steps.abort_requested)
    except RequestError as exc:
        raise RequestError(f"backup {backup_id}: disk {disk['dev']} from "
                           f"{export['address']}:{export['port']}: {exc}") from None
    stored = os.path.getsize(vol.path())        # the file's bytes, as physical_size says
    return {"dev": disk["dev"], "volume": name, "capacity": disk["capacity"], "bytes": sent,
            "stored": stored, "checksum": checksum, "checksum_of": CONTENT}
