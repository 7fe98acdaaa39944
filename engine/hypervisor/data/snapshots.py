"""Snapshots of a VM, kept in its own qcow2 disks on its host (internal
snapshots), made, reverted and deleted through libvirt; their records in
etcd (:mod:`engine.backups.snapshots`) follow libvirt, never lead it.

What libvirt 9.0 / QEMU 7.2 can do here (docs/snapshots.md has the
measurements), and so what each request does:

- **with memory** (``--memory``, a running or paused VM): libvirt's internal
  snapshot with the guest's RAM (QEMU's ``savevm``; the guest pauses while
  its memory is written).  A revert resumes the guest as it was then.
- **without memory, running or paused**: libvirt refuses an internal
  snapshot of a running VM without its memory, and cannot revert external
  ones.  So the disks' internal snapshots are taken by QEMU itself, all in
  one QMP ``transaction`` (one point in time, the guest's filesystems
  frozen around it when its agent answers), and libvirt is given the
  snapshot's metadata (``REDEFINE``) as a shut-off snapshot: a revert stops
  the VM, applies the disks' snapshot (``qemu-img snapshot -a``) and boots
  it again.
- **shut off**: libvirt's internal snapshot of the disks.

Checkpoints (backups' and replicas' dirty bitmaps, ``peerctl-*``): a
snapshot can be taken while a running VM has them, but no revert can be: a
memory revert with a bitmap on the disk kills the guest (QEMU: "Device has
active dirty bitmaps"), a disk revert fails.  So :func:`revert` first
deletes every checkpoint of the VM (the next backup or replica update is
full, and says why); a shut-off VM's checkpoints cannot be deleted through
libvirt, nor can a shut-off VM with checkpoints be snapshotted, so there
their metadata is dropped and their bitmaps removed with ``qemu-img``.

Each request is idempotent by (uuid, snapshot name): the libvirt snapshot's
description names the automation that made it, so a create run again finds
its first run's snapshot and records it; a delete run again finds nothing
left to delete.  The test driver keeps snapshots as metadata only."""
from __future__ import annotations

import json
import threading
import time
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.backups import snapshots as records
from engine.core import keys, steps
from engine.core.store import Put
from engine.core.values import readable
from engine.errors import RequestError
from engine.hypervisor.storage import qcow2
from engine.hypervisor.domain.guest_agent import freeze, thaw
from engine.hypervisor.domain.disks import ACTIVE, disks_of
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.domain.lookup import (
    find_domain, require_domain, uuid_arg, vm_label, vm_lock)

__all__ = ["create", "revert", "delete", "drop_checkpoints"]

log = structlog.get_logger("peerctl.snapshots")

DESCRIPTION = "peerctl automation "
POLL = 0.25


def _snapshot_name(args: dict) -> str:
    name = args.get("snapshot")
    if not records.valid_name(name):
        raise RequestError(f"bad snapshot name {name!r}")
    return name


def _is_test(conn) -> bool:
    return conn.getType().upper() == "TEST"


def _lookup(dom, name: str):
    try:
        return dom.snapshotLookupByName(name, 0)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN_SNAPSHOT:
            return None
        raise


def _described(snapshot) -> dict:
    """``{owner, memory, time, state}`` from a libvirt snapshot's XML."""
    root = ET.fromstring(snapshot.getXMLDesc(0))
    state = root.findtext("state") or "shutoff"
    memory = root.find("memory")
    description = root.findtext("description") or ""
    return {"owner": description[len(DESCRIPTION):] if description.startswith(DESCRIPTION)
            else None,
            "memory": state in ACTIVE and (memory is None or memory.get("snapshot") != "no"),
            "time": float(root.findtext("creationTime") or time.time()), "state": state}


def _failing(what: str, call, *args):
    try:
        return call(*args)
    except libvirt.libvirtError as exc:
        raise RequestError(f"{what}: {exc.get_error_message()}") from None


# -- checkpoints ------------------------------------------------------------------

def drop_checkpoints(host, dom) -> list[str]:
    """Delete every checkpoint of ``dom`` (its bitmaps too): a running VM's
    through libvirt; a shut-off VM's metadata through libvirt and its
    bitmaps with ``qemu-img`` (libvirt cannot, for an inactive domain)."""
    if _is_test(host.conn):
        return []
    checkpoints = dom.listAllCheckpoints(0)
    names = [c.getName() for c in checkpoints]
    if not names:
        return []
    if dom.isActive():
        # children first: deleting a parent merges its bitmap into the child
        for checkpoint in reversed(checkpoints):
            _failing(f"checkpoint {checkpoint.getName()} not deleted", checkpoint.delete, 0)
    else:
        for checkpoint in checkpoints:
            _failing(f"checkpoint {checkpoint.getName()} not deleted", checkpoint.delete,
                     libvirt.VIR_DOMAIN_CHECKPOINT_DELETE_METADATA_ONLY)
        for disk in disks_of(host.conn, ET.fromstring(dom.XMLDesc(0))):
            if disk["format"] == "qcow2":
                for name in names:
                    _remove_bitmap(disk["path"], name)
    log.info("checkpoints_dropped", vm=dom.name(), checkpoints=names)
    return names


def _remove_bitmap(path: str, name: str) -> None:
    try:
        qcow2._qemu_img("bitmap", "--remove", "-f", "qcow2", path, name)
    except RequestError as exc:
        if "not found" not in str(exc).lower():     # a disk without that bitmap
            raise


# -- create -----------------------------------------------------------------------

def create(host, args: dict) -> dict:
    """``{uuid, name, snapshot, memory, owner}`` -> the snapshot's record
    plus ``dropped`` (checkpoints a shut-off VM lost to it)."""
    with vm_lock(host, uuid_arg(args)):     # one request at a time per VM here
        return _create(host, args)


def _create(host, args: dict) -> dict:
    uuid, dom = require_domain(host, args)
    name, owner = _snapshot_name(args), str(args.get("owner") or "")
    key = keys.snapshot(uuid, name)
    made = _lookup(dom, name)
    dropped = []
    if made is not None:
        found = _described(made)
        if found["owner"] != owner:
            raise RequestError(f"{vm_label(args, uuid)} already has a snapshot {name!r}")
        memory, taken = found["memory"], found["time"]
        state = found["state"] if memory else vm_state(dom)    # a disk snapshot says shutoff
    else:
        state = vm_state(dom)
        memory = bool(args.get("memory"))
        if memory and state not in ACTIVE:
            raise RequestError(f"{vm_label(args, uuid)} is {state}: it has no memory to "
                               "snapshot (take it without --memory)")
        taken = time.time()
        dropped = _take(host, dom, name, owner, memory, state)
    value = records.record(dom.name(), uuid, host.host, name, taken, memory, state)
    value["automation"] = owner or None
    known = readable(host.store.get(key))
    if known is None or any(known.get(k) != v for k, v in value.items()):
        host.store.txn([], [Put(key, value)])
    log.info("snapshot_created", vm=dom.name(), snapshot=name, memory=memory, state=state)
    return {**value, "dropped": dropped}


def _take(host, dom, name: str, owner: str, memory: bool, state: str) -> list[str]:
    description = f"<description>{DESCRIPTION}{owner}</description>"
    if _is_test(host.conn):
        _failing("snapshot refused", dom.snapshotCreateXML,
                 f"<domainsnapshot><name>{name}</name>{description}</domainsnapshot>", 0)
        return []
    if memory:
        xml = (f"<domainsnapshot><name>{name}</name>{description}"
               "<memory snapshot='internal'/></domainsnapshot>")
        _while_saving(dom, lambda: dom.snapshotCreateXML(xml, 0))
        return []
    if state in ACTIVE:
        _disks_now(host, dom, name, description)
        return []
    dropped = drop_checkpoints(host, dom)     # else libvirt refuses: "checkpoint exists"
    _failing("snapshot refused", dom.snapshotCreateXML,
             f"<domainsnapshot><name>{name}</name>{description}</domainsnapshot>", 0)
    return dropped


def _while_saving(dom, call) -> None:
    """``call()`` (the memory snapshot) in a thread, its progress published
    from this one (a step's progress belongs to its thread)."""
    outcome: list = []

    def run():
        try:
            outcome.append(call())
        except libvirt.libvirtError as exc:
            outcome.append(exc)
    worker = threading.Thread(target=run, name="snapshot-save", daemon=True)
    started = time.monotonic()
    worker.start()
    while worker.is_alive():
        worker.join(POLL * 2)
        seconds = time.monotonic() - started
        try:
            stats = dom.jobStats(0)
        except libvirt.libvirtError:
            stats = {}
        done, total = stats.get("memory_processed"), stats.get("memory_total")
        steps.progress({"phase": f"saving memory ({seconds:.0f}s)"
                        + (f": {done >> 20} MiB of {total >> 20} MiB" if total else ""),
                        **({"percent": int(100 * done / total), "bytes": done,
                            "total": total} if total and done is not None else {})})
    if outcome and isinstance(outcome[0], libvirt.libvirtError):
        raise RequestError(f"snapshot refused: {outcome[0].get_error_message()}")


def _qmp(dom, command: str, arguments: dict | None = None) -> dict:
    import libvirt_qemu
    text = json.dumps({"execute": command, **({"arguments": arguments} if arguments else {})})
    try:
        reply = json.loads(libvirt_qemu.qemuMonitorCommand(dom, text, 0))
    except libvirt.libvirtError as exc:
        raise RequestError(f"QEMU {command}: {exc.get_error_message()}") from None
    if "error" in reply:
        raise RequestError(f"QEMU {command}: {reply['error'].get('desc')}")
    return reply.get("return")


def _writable_nodes(dom, disks: list[dict]) -> dict[str, dict]:
    """``{path: {node, snapshots}}``: the running VM's disks' qcow2 nodes; a
    writable disk of another format cannot hold an internal snapshot."""
    paths = {d["path"] for d in disks}
    nodes = {}
    for block in _qmp(dom, "query-block"):
        inserted = block.get("inserted") or {}
        if inserted.get("file") not in paths or inserted.get("ro"):
            continue
        if inserted.get("drv") != "qcow2":
            raise RequestError(f"disk {inserted['file']} is {inserted.get('drv')}: only qcow2 "
                               "disks hold snapshots")
        nodes[inserted["file"]] = {"node": inserted["node-name"], "snapshots": {
            s.get("name") for s in (inserted.get("image") or {}).get("snapshots") or []}}
    return nodes


def _disks_now(host, dom, name: str, description: str) -> None:
    """A running VM's disks, snapshotted by QEMU at one point in time, then
    told to libvirt as a shut-off snapshot (what it can revert)."""
    root = ET.fromstring(dom.XMLDesc(0))
    disks = disks_of(host.conn, root)
    nodes = _writable_nodes(dom, disks)
    if not nodes:
        raise RequestError(f"VM {dom.name()!r} has no disk to snapshot")
    missing = [n["node"] for n in nodes.values() if name not in n["snapshots"]]
    if len(missing) < len(nodes):       # an earlier run's, on some disks only: start over
        for n in nodes.values():
            if name in n["snapshots"]:
                _qmp(dom, "blockdev-snapshot-delete-internal-sync",
                     {"device": n["node"], "name": name})
    frozen = freeze(dom)
    try:
        _qmp(dom, "transaction", {"actions": [
            {"type": "blockdev-snapshot-internal-sync",
             "data": {"device": n["node"], "name": name}} for n in nodes.values()]})
    finally:
        if frozen:
            thaw(dom)
    inactive = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
    marks = "".join(f"<disk name='{dev}' snapshot='{'internal' if path in nodes else 'no'}'/>"
                    for dev, path in _targets(root))
    xml = (f"<domainsnapshot><name>{name}</name>{description}<state>shutoff</state>"
           f"<creationTime>{int(time.time())}</creationTime><memory snapshot='no'/>"
           f"<disks>{marks}</disks>{inactive}</domainsnapshot>")
    try:
        dom.snapshotCreateXML(xml, libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE)
    except libvirt.libvirtError as exc:
        for n in nodes.values():
            try:
                _qmp(dom, "blockdev-snapshot-delete-internal-sync",
                     {"device": n["node"], "name": name})
            except RequestError:
                pass
        raise RequestError(f"snapshot refused: {exc.get_error_message()}") from None


def _targets(root: ET.Element) -> list[tuple[str, str | None]]:
    """``[(dev, file)]``: every disk of a domain's XML (a CD-ROM too)."""
    found = []
    for disk in root.findall("./devices/disk"):
        target, source = disk.find("target"), disk.find("source")
        if target is not None:
            found.append((target.get("dev"), source.get("file") if source is not None
                          else None))
    return found


# -- revert, delete ---------------------------------------------------------------

def revert(host, args: dict) -> dict:
    """``{uuid, name, snapshot}`` -> ``{uuid, snapshot, memory, state,
    dropped}``: the VM's disks (and, for a memory snapshot, its running
    state) as they were; its checkpoints deleted first.  A disk snapshot
    of a VM that runs boots it again from those disks."""
    with vm_lock(host, uuid_arg(args)):     # one request at a time per VM here
        return _revert(host, args)


def _revert(host, args: dict) -> dict:
    uuid, dom = require_domain(host, args)
    name = _snapshot_name(args)
    snapshot = _lookup(dom, name)
    if snapshot is None:
        raise RequestError(f"{vm_label(args, uuid)} has no snapshot {name!r} on {host.host}")
    found = _described(snapshot)
    before = vm_state(dom)
    dropped = drop_checkpoints(host, dom)
    flags = 0
    if not found["memory"] and before in ACTIVE and not _is_test(host.conn):
        flags = libvirt.VIR_DOMAIN_SNAPSHOT_REVERT_RUNNING
    steps.progress({"phase": "reverting" + (" (loading memory)" if found["memory"] else "")})
    _failing(f"revert to snapshot {name!r} failed", dom.revertToSnapshot, snapshot, flags)
    state = vm_state(dom)
    log.info("snapshot_reverted", vm=dom.name(), snapshot=name, memory=found["memory"],
             state=state, checkpoints_dropped=dropped)
    return {"uuid": uuid, "snapshot": name, "memory": found["memory"], "state": state,
            "dropped": dropped}


def delete(host, args: dict) -> dict:
    """``{uuid, name, snapshot}``: libvirt's snapshot (if still there), then
    its record.  A VM gone from this host leaves only the record to drop."""
    with vm_lock(host, uuid_arg(args)):     # one request at a time per VM here
        return _delete(host, args)


def _delete(host, args: dict) -> dict:
    uuid = uuid_arg(args)
    name = _snapshot_name(args)
    dom = find_domain(host, uuid)
    snapshot = _lookup(dom, name) if dom is not None else None
    if snapshot is not None:
        _failing(f"snapshot {name!r} not deleted", snapshot.delete, 0)
    host.store.delete(keys.snapshot(uuid, name))
    log.info("snapshot_deleted", vm=args.get("name"), uuid=uuid, snapshot=name,
             found=snapshot is not None)
    return {"uuid": uuid, "snapshot": name, "deleted": snapshot is not None,
            "state": vm_state(dom) if dom is not None else None}
