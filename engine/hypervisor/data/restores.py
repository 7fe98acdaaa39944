"""Rebuilding a VM's disks from a backup chain, on the host the restored VM
will run on (the ``restore_disks`` request; ``automations/backups.py``
claims the host first and builds the VM on these disks after).

With ``export`` (restore version 3): the chain's host serves it as one
read-only image over NBD (:mod:`engine.hypervisor.data.restore_exports`,
which checked every link against its record first), and each disk is
copied from that export straight into the VM's disk volume
(``<uuid>.qcow2``) by ``qemu-img convert``, sparse
(:mod:`engine.hypervisor.storage.nbd_copy`): each block is read once, from
the newest link that holds it, and crosses between the hosts once.

Without it (a restore begun by an older release, or a chain kept on more
than one host), the chain's full backup is copied from its target's pool
into this host's pool as the VM's disk, then each incremental, oldest
first, into a temporary volume whose clusters are written into the disk
(:func:`engine.hypervisor.storage.qcow2.apply_increment`) before it is
deleted.  Every copy is checksummed as it arrives (a pulled backup, whose
record has the checksum of its content rather than of its file,
``checksum_of: content``: its copy's content, read through ``qemu-nbd``)
and checked against the backup's record before anything is built on it.

Either way a damaged or missing backup leaves no volume behind and says
which one.

It is idempotent by VM uuid: run again, it deletes what an earlier run
made for a VM that is not defined here and starts over.
"""
from __future__ import annotations

import libvirt
import structlog

from engine.core import steps
from engine.errors import RequestError
from engine.hypervisor.storage import images, qcow2
from engine.hypervisor.data.backups import Ticker, is_test
from engine.hypervisor.domain.domain_xml import volume_xml
from engine.hypervisor.domain.lookup import find_domain, uuid_arg, vm_label, vm_lock
from engine.hypervisor.storage.nbd_copy import copy_export, qemu_tls_dir
from engine.hypervisor.storage.volcopy import copy_volume, physical_size
from engine.hypervisor.storage.nbdpull import content_checksum
from engine.hypervisor.data.backup_pull import CONTENT

__all__ = ["restore_disks", "disk_volume_name"]

log = structlog.get_logger("peerctl.restores")


def disk_volume_name(uuid: str, dev: str) -> str:
    """The volume a VM's disk ``dev`` lives in (``vda``: what build uses)."""
    return f"{uuid}.qcow2" if dev == "vda" else f"{uuid}-{dev}.qcow2"


def _check_chain(chain) -> list[dict]:
    if not isinstance(chain, list) or not chain or not all(
            isinstance(link, dict) and isinstance(link.get("disks"), list)
            and all(isinstance(link.get(k), str) for k in ("id", "host", "libvirt_uri", "pool"))
            for link in chain):
        raise RequestError("restore_disks needs the backup chain, full backup first")
    return chain


def restore_disks(host, args: dict) -> dict:
    """``{uuid, name, chain: [{id, host, libvirt_uri, pool, disks: [{dev,
    volume, capacity, checksum}]}], export?: {host, exports: {dev:
    {address, port, name, tls}}}}`` -> ``{uuid, host, disks: [{dev, volume}],
    bytes}``."""
    uuid = uuid_arg(args)
    chain = _check_chain(args.get("chain"))
    with vm_lock(host, uuid):
        if find_domain(host, uuid) is not None:
            raise RequestError(f"{vm_label(args, uuid)} is already defined on {host.host}")
        pool = images.ensure_pool(host)
        images.delete_volumes(pool, uuid)       # an earlier, unfinished try
        if is_test(host.conn):
            return _blank(host, pool, uuid, chain[0])
        try:
            if isinstance(args.get("export"), dict):
                return _from_export(host, pool, uuid, chain, args["export"])
            return _rebuild(host, pool, uuid, chain)
        except BaseException:
            images.delete_volumes(pool, uuid)
            raise


def _blank(host, pool, uuid: str, full: dict) -> dict:
    """The test driver: disks of the recorded sizes, with no content."""
    disks = []
    for disk in full["disks"]:
        gib = max(1, -(-int(disk.get("capacity") or 0) // images.GiB))
        name = disk_volume_name(uuid, disk["dev"])
        images.ensure_blank(pool, name, gib)
        disks.append({"dev": disk["dev"], "volume": name})
    return {"uuid": uuid, "host": host.host, "disks": disks, "bytes": 0}


def _from_export(host, pool, uuid: str, chain: list[dict], export: dict) -> dict:
    """Each disk copied from the chain's NBD export into its volume."""
    served = export.get("exports") or {}
    newest = {d["dev"]: d for d in chain[-1]["disks"]}
    disks, ticker = [], Ticker("restoring", sum(int(d.get("capacity") or 0)
                                              for d in newest.values()))
    for dev in [d["dev"] for d in chain[0]["disks"]]:
        where = served.get(dev)
        if not isinstance(where, dict) or dev not in newest:
            raise RequestError(f"backup {chain[-1]['id']}: no export of disk {dev} on "
                               f"{export.get('host')}")
        capacity = int(newest[dev].get("capacity") or 0)
        name = disk_volume_name(uuid, dev)
        vol = pool.createXML(volume_xml(name, capacity, "qcow2"), 0)
        copy_export(where, vol.path(), capacity, ticker, steps.abort_requested,
                    qemu_tls_dir(host.remote_uri))
        ticker.next(capacity)
        disks.append({"dev": dev, "volume": name})
    pool.refresh(0)
    sent = sum(physical_size(images.lookup(pool, d["volume"])) for d in disks)
    log.info("disks_restored", uuid=uuid, chain=[link["id"] for link in chain], bytes=sent,
             export=export.get("host"))
    return {"uuid": uuid, "host": host.host, "disks": disks, "bytes": sent}


def _source(host, link: dict):
    if host.is_me(link["libvirt_uri"]):
        return host.conn, False
    try:
        return libvirt.open(link["libvirt_uri"]), True
    except libvirt.libvirtError as exc:
        raise RequestError(f"backup {link['id']}: cannot reach the hypervisor of "
                           f"{link['host']}: {exc.get_error_message()}") from None


def _rebuild(host, pool, uuid: str, chain: list[dict]) -> dict:
    opened = {}
    try:
        sources = {}
        for link in chain:
            if link["libvirt_uri"] not in opened:
                opened[link["libvirt_uri"]] = _source(host, link)
            conn = opened[link["libvirt_uri"]][0]
            try:
                sources[link["id"]] = (conn, conn.storagePoolLookupByName(link["pool"]))
            except libvirt.libvirtError as exc:
                raise RequestError(f"backup {link['id']}: pool {link['pool']} on "
                                   f"{link['host']}: {exc.get_error_message()}") from None
        plan = [(link, disk, sources[link["id"]]) for link in chain for disk in link["disks"]]
        volumes = {}
        for link, disk, (conn, src_pool) in plan:
            src_pool.refresh(0)
            vol = images.lookup(src_pool, disk["volume"])
            if vol is None:
                raise RequestError(f"backup {link['id']}: volume {disk['volume']} is missing "
                                   f"from pool {link['pool']} on {link['host']}")
            volumes[(link["id"], disk["dev"])] = vol
        ticker = Ticker("restoring", sum(physical_size(v) for v in volumes.values()))
        sent, disks = 0, []
        for dev in [d["dev"] for d in chain[0]["disks"]]:
            final = disk_volume_name(uuid, dev)
            for index, link in enumerate(chain):
                disk = next((d for d in link["disks"] if d["dev"] == dev), None)
                if disk is None:
                    raise RequestError(f"backup {link['id']} has no disk {dev}")
                vol = volumes[(link["id"], dev)]
                name = final if index == 0 else f"{uuid}-restore-{dev}-{index}.qcow2"
                count, checksum = copy_volume(opened[link["libvirt_uri"]][0], vol, host.conn,
                                              pool, name, ticker, steps.abort_requested)
                ticker.next(physical_size(vol))
                sent += count
                if disk.get("checksum_of") == CONTENT:      # a pulled backup: its content's
                    checksum = content_checksum(images.lookup(pool, name).path(),
                                                stop=steps.abort_requested)[0]
                if checksum != disk["checksum"]:
                    raise RequestError(f"backup {link['id']}: disk {dev} on {link['host']} "
                                       f"does not match its checksum: it is damaged; nothing "
                                       "restored")
                if index:
                    increment = images.lookup(pool, name)
                    qcow2.apply_increment(increment.path(), images.lookup(pool, final).path())
                    increment.delete(0)
            disks.append({"dev": dev, "volume": final})
        pool.refresh(0)
        log.info("disks_restored", uuid=uuid, chain=[link["id"] for link in chain], bytes=sent)
        return {"uuid": uuid, "host": host.host, "disks": disks, "bytes": sent}
    finally:
        for conn, close in opened.values():
            if close:
                try:
                    conn.close()
                except libvirt.libvirtError:
                    pass
