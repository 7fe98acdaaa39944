"""A replica update that sends only the blocks that differ from a copy the
replica's host already keeps: reverse replication after an HA restart from
the replica, a move, or a lost checkpoint.

Without a checkpoint to start from (the VM now runs from what was its
replica, or it moved and lost its bitmaps), an update used to be a whole
copy, although the other side kept a nearly identical disk: the disks its
stale copy left aside (:mod:`engine.hypervisor.host.aside`), the source's
disk frozen by a move onto the replica (``kept``,
:mod:`engine.hypervisor.moves.handoff`), or the previous replica.  No dirty bitmap can be trusted to name what differs between the
two (the old host wrote blocks after the last update that never reached the
replica, and its copy may have died mid-write), so both sides compare
checksums of the content, 1 MiB block by block
(:mod:`engine.hypervisor.storage.blockmap`): reading both disks locally, sending only
what differs.

1. :func:`base_map`, on the replica's host: the base's block map (the disks
   kept aside, or the replica's), read, never written;
2. :func:`take`, on the VM's host: a full backup job into local scratch
   volumes (a new checkpoint, from which the next update is incremental
   again), its block map, and a delta holding the blocks that differ from
   the base's map (those the guest wrote since the promotion, and those the
   old host wrote after the last update); only the delta travels;
3. :func:`build`, on the replica's host, from ``replica_apply``: a copy of
   the base with the delta applied, checked against the source's map, is
   the new replica's disk.  The base is never written: until the record
   names the new disk, the old copy is whole and the new one unnamed (an
   interrupted update's volumes are swept as any other's).
"""
from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ET

import structlog

from engine.core import failpoints, keys
from engine.core.values import readable
from engine.errors import RequestError
from engine.backups import replicas as records
from engine.hypervisor.data import backups
from engine.hypervisor.data.restores import disk_volume_name
from engine.hypervisor.domain.disks import ACTIVE, disks_of
from engine.hypervisor.domain.lookup import find_domain, uuid_arg, vm_label
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.storage import blockmap, images

__all__ = ["base_map", "take", "build", "whole_name", "map_bytes"]

log = structlog.get_logger("peerctl.replicas")


def whole_name(update: str, dev: str) -> str:
    """The new replica disk a delta update builds (its delta arrives as
    :func:`engine.hypervisor.data.backups.volume_name`)."""
    return f"bk-{update}-{dev}.whole.qcow2"


def map_bytes(maps: dict) -> int:
    """What a set of block maps weighs on the wire (counted as sent)."""
    return len(json.dumps(maps, separators=(",", ":")))


def _directory(pool) -> str:
    return ET.fromstring(pool.XMLDesc(0)).findtext("./target/path")


def _base_volumes(host, pool, uuid: str, base: dict) -> dict[str, object]:
    """``{dev: volume}`` of the base on this host."""
    kind = base.get("kind")
    if kind == "replica":
        replica = (records.read(host.store, uuid) or {}).get("replica")
        if not replica or replica.get("host") != host.host or replica.get("pending"):
            raise RequestError(f"no finished replica of {uuid} on {host.host} to start from")
        named = {d["dev"]: d["volume"] for d in replica["disks"]}
    elif kind == "kept":
        kept = (records.read(host.store, uuid) or {}).get("kept")
        if not kept or kept.get("host") != host.host:
            raise RequestError(f"no frozen disk of {uuid} kept on {host.host}")
        named = {d["dev"]: d["volume"] for d in kept["disks"]}
    elif kind == "aside":
        record = readable(host.store.get(keys.aside(host.host, str(base.get("id")))))
        if not record or record.get("uuid") != uuid:
            raise RequestError(f"no disks of {uuid} kept aside on {host.host} as "
                               f"{base.get('id')!r}")
        prefix = f"aside-{record['id']}"
        names = {v["name"] for v in record.get("volumes") or []}
        named = {}
        for name in names:          # as the VM named them, <uuid> made <prefix>
            dev = "vda" if name == f"{prefix}.qcow2" else name[len(prefix) + 1:].split(".")[0]
            if name == prefix + disk_volume_name(uuid, dev)[len(uuid):]:
                named[dev] = name
    else:
        raise RequestError(f"unknown replica base {kind!r}")
    found = {}
    for dev, name in named.items():
        vol = images.lookup(pool, name)
        if vol is None:
            raise RequestError(f"the base's volume {name} is gone from {host.host}")
        found[dev] = vol
    if not found:
        raise RequestError(f"the base on {host.host} has no disk")
    return found


def base_map(host, args: dict) -> dict:
    """``{uuid, seq, base: {kind: aside|kept|replica, id}}`` on the replica's
    host -> ``{maps: {dev: {length, blocks: {index: sha256}}}, volumes: {dev:
    volume}, bytes}``."""
    uuid = uuid_arg(args)
    update = records.replica_id(uuid, args.get("seq") or 0)
    base = args.get("base")
    if not isinstance(base, dict):
        raise RequestError("replica_base_map needs the base")
    pool = images.ensure_pool(host)
    pool.refresh(0)
    if backups.is_test(host.conn):
        return {"maps": {}, "volumes": {}, "bytes": 0}
    volumes = _base_volumes(host, pool, uuid, base)
    maps = {}
    for dev, vol in volumes.items():
        scratch = os.path.join(_directory(pool), f"bk-{update}-{dev}.base.raw")
        blocks, length = blockmap.content_map(vol.path(), scratch)
        maps[dev] = {"length": length, "blocks": {str(i): h for i, h in blocks.items()}}
    return {"maps": maps, "volumes": {dev: vol.name() for dev, vol in volumes.items()},
            "bytes": map_bytes(maps)}


def take(host, args: dict) -> dict:
    """``{uuid, name, seq, store, maps, map_bytes, why}`` on the VM's host ->
    ``replica_take``'s answer with ``kind: delta`` and each disk's
    ``blocks`` (sent), ``length`` and ``content`` (the whole disk's map
    digest, which the built replica must match)."""
    uuid = uuid_arg(args)
    update = records.replica_id(uuid, args.get("seq") or 0)
    maps, store = args.get("maps"), args.get("store")
    if not isinstance(maps, dict) or not isinstance(store, dict):
        raise RequestError("a delta update needs the base's maps and the store")
    dom = find_domain(host, uuid)
    if dom is None:
        raise RequestError(f"{vm_label(args, uuid)} is not on host {host.host}")
    backups._undo_here(host, dom, update)
    disks = disks_of(host.conn, ET.fromstring(dom.XMLDesc(0)))
    for disk in disks:
        theirs = maps.get(disk["dev"])
        if not isinstance(theirs, dict) or theirs.get("length") != disk["capacity"]:
            raise RequestError(f"the base has no disk {disk['dev']} of "
                               f"{disk['capacity']} bytes")
    pool = images.ensure_pool(host)
    started = time.time()
    why = args.get("why") or "no checkpoint to start from"
    if vm_state(dom) in ACTIVE:
        point = backups._live_point(host, dom, disks, update, pool, {"why_full": why})
    else:
        point = backups._offline_point(host, dom, disks, update, pool)
    pool.refresh(0)
    directory, sent_blocks = _directory(pool), {}
    for disk in disks:
        dev = disk["dev"]
        scratch = images.lookup(pool, backups.scratch_name(update, dev))
        raw = os.path.join(directory, f"{backups.SCRATCH}{update}-{dev}.raw")
        try:
            ours, length = blockmap.content_map(scratch.path(), raw, keep=True)
            theirs = {int(i): h for i, h in maps[dev]["blocks"].items()}
            blocks = blockmap.differing(ours, theirs)
            delta = os.path.join(directory, f"{backups.SCRATCH}{update}-{dev}.delta")
            blockmap.write_delta(raw, blocks, length, delta, raw + ".sparse")
        finally:
            if os.path.exists(raw):
                os.unlink(raw)
        os.replace(delta, scratch.path())   # what travels is the delta alone
        sent_blocks[dev] = {"blocks": blocks, "length": length,
                            "content": blockmap.digest(ours, length)}
    pool.refresh(0)
    failpoints.crash("delta built")         # tests: the source dies before sending
    copied = backups._send(host, disks, update, pool, store)
    backups._delete_volumes(pool, f"{backups.SCRATCH}{update}-")
    data = sum(d["bytes"] for d in copied)
    total = data + int(args.get("map_bytes") or 0)
    log.info("replica_delta_taken", vm=dom.name(), update=update, bytes=total,
             blocks=sum(len(s["blocks"]) for s in sent_blocks.values()))
    return {"id": update, **point, "kind": "delta", "parent": None,
            "reason": f"{why}: only the blocks that differ from {args.get('what') or 'the base'}",
            "time": started, "bytes": total,
            "disks": [{**d, **sent_blocks[d["dev"]]} for d in copied]}


def build(host, pool, update: str, disks: list[dict], volumes: dict) -> list[dict]:
    """On the replica's host: each disk's base (``volumes``: ``{dev:
    volume}``), copied, with its arrived delta applied and its content
    checked -> the new replica's disks.  The deltas are deleted; a
    mismatch deletes everything this update made."""
    directory, built = _directory(pool), []
    try:
        for disk in disks:
            dev = disk["dev"]
            base = images.lookup(pool, str((volumes or {}).get(dev)))
            delta = images.lookup(pool, disk["volume"])
            if base is None or delta is None:
                raise RequestError(f"replica update {update}: the base or the delta of {dev} "
                                   f"is missing on {host.host}")
            whole = os.path.join(directory, whole_name(update, dev))
            blockmap.copy_image(base.path(), whole)
            failpoints.crash("delta base copied")   # tests: not yet written, not named
            blockmap.apply_delta(delta.path(), whole, disk["blocks"], disk["length"])
            blocks, length = blockmap.content_map(
                whole, os.path.join(directory, f"bk-{update}-{dev}.check.raw"))
            if blockmap.digest(blocks, length) != disk.get("content"):
                raise RequestError(f"replica update {update}: disk {dev} built on "
                                   f"{host.host} differs from the source's")
            built.append({"dev": dev, "volume": whole_name(update, dev),
                          "capacity": disk.get("capacity")})
    except BaseException:
        backups._delete_volumes(pool, f"bk-{update}-")
        raise
    for disk in disks:
        images.lookup(pool, disk["volume"]).delete(0)
    pool.refresh(0)
    return built
