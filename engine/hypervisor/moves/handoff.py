"""A live migration to the host that keeps the VM's replica copies only
what changed since the replica, not the whole disk.

QEMU's storage migration with a shared base (libvirt's
``VIR_MIGRATE_NON_SHARED_INC``) mirrors only the source's *top* image and
trusts the destination's backing file to hold the rest.  The hand-off makes
that true with the replica:

1. :func:`take`, on the VM's host, with the guest paused for a moment: a
   last incremental update since the replica's checkpoint (a backup job
   into local scratch volumes, its point in time the paused guest's), then
   an external disk-only snapshot: the disk's file is frozen as it is, and
   a new, empty top image ``<uuid>-top<seq>.qcow2`` takes the guest's
   writes from then on.  The guest runs again; the update travels to the
   replica's host (as any replica update, :mod:`engine.hypervisor.data.replicas`)
   and is applied there: the replica now equals the frozen file.
2. :func:`prepare`, on the replica's host: the replica becomes the VM's
   disk (``replica_promote``: the record says it was consumed), and an
   empty overlay of it, named as the source's top, is the destination's
   disk.
3. the usual migration (``move_migrate``) with ``incremental``: only the
   top image, the writes since step 1, crosses.

The frozen file keeps a second name on the source (``kept`` in the
replication record): the first replica update back to that host sends only
the blocks that differ from it.

Anything that fails before the migration leaves the VM running on its
host (its disk is then two files, a valid chain; a later migration copies
it whole); the migration automation falls back to a whole copy.
"""
from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.errors import RequestError
from engine.backups import replicas as records
from engine.hypervisor.data import backups
from engine.hypervisor.storage import images, qcow2
from engine.hypervisor.domain.domain_xml import volume_xml
from engine.hypervisor.domain.disks import disks_of
from engine.hypervisor.moves.steps import retargeted
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.data.replicas import promote
from engine.hypervisor.domain.lookup import find_domain, uuid_arg, vm_label, vm_lock

__all__ = ["take", "prepare", "top_name"]

log = structlog.get_logger("peerctl.handoff")

SNAPSHOT_FLAGS = (libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_DISK_ONLY
                  | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA
                  | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_ATOMIC)


def top_name(uuid: str, dev: str, seq: int) -> str:
    """The top image a hand-off gives disk ``dev``: the VM's volumes all
    start with its uuid (a destroy or an aside finds them)."""
    return f"{uuid}-top{seq}.qcow2" if dev == "vda" else f"{uuid}-{dev}-top{seq}.qcow2"


def _snapshot_xml(disks: list[dict], directory: str, uuid: str, seq: int) -> str:
    snapshot = ET.Element("domainsnapshot")
    listed = ET.SubElement(snapshot, "disks")
    for disk in disks:
        element = ET.SubElement(listed, "disk", name=disk["dev"], snapshot="external")
        ET.SubElement(element, "driver", type="qcow2")
        ET.SubElement(element, "source",
                      file=os.path.join(directory, top_name(uuid, disk["dev"], seq)))
    return ET.tostring(snapshot, encoding="unicode")


def take(host, args: dict) -> dict:
    """``{uuid, name, seq, store, parent: {checkpoint}}`` -> a replica
    update's answer (:func:`engine.hypervisor.data.backups.take`'s shape) with
    ``paused_ms`` and ``tops: {dev: volume}``.  Refused (nothing changed)
    when a disk is not qcow2 version 3, the replica's checkpoint is gone,
    or the VM does not run."""
    uuid = uuid_arg(args)
    seq = args.get("seq")
    update = records.replica_id(uuid, seq)
    parent = args.get("parent") or {}
    store = args.get("store")
    with vm_lock(host, uuid):
        dom = find_domain(host, uuid)
        if dom is None or vm_state(dom) not in ("running", "paused"):
            raise RequestError(f"{vm_label(args, uuid)} does not run on {host.host}")
        root = ET.fromstring(dom.XMLDesc(0))
        disks = disks_of(host.conn, root)
        if any(d["path"].endswith(f"-top{seq}.qcow2") for d in disks):
            raise RequestError("an earlier try split the disk already: it is copied whole")
        if backups._old_disks(host, disks):
            raise RequestError("a disk cannot carry a checkpoint (not qcow2 version 3)")
        names = {c.getName() for c in dom.listAllCheckpoints(0)}
        if parent.get("checkpoint") not in names:
            raise RequestError("the replica's checkpoint is gone from the VM")
        pool = images.ensure_pool(host)
        directory = ET.fromstring(pool.XMLDesc(0)).findtext("./target/path")
        backups.discard_source(host, uuid, update)
        was_paused = vm_state(dom) == "paused"
        started = time.time()
        paused_at = time.monotonic()
        if not was_paused:
            dom.suspend()
        try:
            backups._begin(dom, root, disks, update, directory, parent["checkpoint"], False)
            backups._wait_for_job(dom)
            dom.snapshotCreateXML(_snapshot_xml(disks, directory, uuid, seq), SNAPSHOT_FLAGS)
        except libvirt.libvirtError as exc:
            backups.discard_source(host, uuid, update)
            raise RequestError(f"hand-off of {dom.name()}: {exc.get_error_message()}") \
                from None
        finally:
            if not was_paused:
                dom.resume()
        paused_ms = round((time.monotonic() - paused_at) * 1000, 1)
        pool.refresh(0)
        for disk in disks:
            qcow2.detach_backing(images.lookup(pool, backups.scratch_name(update,
                                                                          disk["dev"])).path())
        _keep_frozen(host, pool, uuid, seq, disks, directory)
    try:
        copied = backups._send(host, disks, update, pool, store)
    finally:
        backups._delete_volumes(pool, f"{backups.SCRATCH}{update}-")
    log.info("handoff_taken", vm=dom.name(), seq=seq, paused_ms=paused_ms,
             bytes=sum(d["bytes"] for d in copied))
    return {"id": update, "kind": "incremental", "parent": parent.get("id"),
            "reason": None, "consistency": "crash-consistent", "checkpoint": None,
            "time": started, "bytes": sum(d["bytes"] for d in copied), "disks": copied,
            "paused_ms": paused_ms,
            "tops": {d["dev"]: top_name(uuid, d["dev"], seq) for d in disks}}


def kept_name(uuid: str, seq: int, dev: str) -> str:
    """The second name a hand-off gives a frozen disk file on the source: a
    replica volume's (swept with the VM's replica volumes)."""
    return f"bk-{records.replica_id(uuid, seq)}-{dev}.kept.qcow2"


def _keep_frozen(host, pool, uuid: str, seq: int, disks: list[dict], directory: str) -> None:
    """The frozen files (the replica's content once this update is applied)
    outlive the move under a second name (a hard link: nothing copied), and
    the record says so (``kept``): the first update back to this host sends
    only the blocks that differ from them (:mod:`engine.hypervisor.data.replica_delta`)."""
    kept = []
    for disk in disks:
        name = kept_name(uuid, seq, disk["dev"])
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            try:
                os.link(disk["path"], path)
            except OSError as exc:
                log.warning("handoff_not_kept", uuid=uuid, why=str(exc))
                return
        kept.append({"dev": disk["dev"], "volume": name})
    pool.refresh(0)

    def edit(known):
        if known is None:
            return None, None, [], []
        return None, {**known, "kept": {"host": host.host, "seq": seq, "disks": kept}}, [], []
    records.change(host.store, uuid, edit)


def prepare(host, args: dict) -> dict:
    """``{uuid, owner, describe, tops}`` on the replica's host ->
    ``move_prepare``'s answer, ``incremental``: the replica promoted to the
    VM's disk, and an empty overlay of it as the destination's top."""
    uuid = uuid_arg(args)
    source, tops = args.get("describe"), args.get("tops")
    if not isinstance(source, dict) or not isinstance(tops, dict):
        raise RequestError("handoff_prepare needs the source's description and tops")
    consumed = promote(host, {"uuid": uuid, "name": args.get("name"),
                              "owner": args.get("owner")})
    pool = images.ensure_pool(host)
    pool.refresh(0)
    bases = {d["dev"]: images.lookup(pool, d["volume"]) for d in consumed["disks"]}
    disks = []
    for disk in source.get("disks") or []:
        base = bases.get(disk["dev"])
        if base is None or disk["dev"] not in tops:
            raise RequestError(f"the replica has no disk {disk['dev']}")
        old = images.lookup(pool, tops[disk["dev"]])
        if old is not None:
            old.delete(0)               # an earlier try's, still empty
        vol = pool.createXML(volume_xml(tops[disk["dev"]], disk["capacity"], "qcow2",
                                        backing_path=base.path(), backing_format="qcow2"), 0)
        disks.append({"dev": disk["dev"], "path": vol.path(), "capacity": disk["capacity"]})
    xml = retargeted(host, uuid, source["xml"], pool, {d["dev"]: d["path"] for d in disks})
    log.info("handoff_prepared", uuid=uuid, seq=consumed["seq"], disks=len(disks))
    return {"uuid": uuid, "host": host.host, "libvirt_uri": host.remote_uri, "xml": xml,
            "disks": disks, "incremental": True,
            "replica": {"seq": consumed["seq"], "time": consumed["time"]}}
