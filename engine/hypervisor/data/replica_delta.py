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
checksums of the content, 64 KiB block by block
(:mod:`engine.hypervisor.storage.blockmap`): reading both disks locally, sending only
what differs.

1. :func:`base_map`, on the replica's host: the base's block map (the disks
   kept aside, or the replica's), read, never written, kept as a volume of
   this host's image pool (:func:`map_name`, a binary map file,
   :func:`engine.hypervisor.storage.blockmap.write_map`).  Only its name and
   length travel in the answer: a map is 16 bytes per 64 KiB block, too
   much for etcd's requests once a disk holds a few GiB.  Run again, it
   finds the map a run before it finished (the base is never written);
2. :func:`take`, on the VM's host: the base's map files, read through
   libvirt's storage streams from the replica's host (sparse: only its
   data travels, counted in the update's bytes, into scratch volumes
   deleted at once); a full backup job into local scratch volumes (a new
   checkpoint, from which the next update is incremental again), its block
   map, and a delta holding the blocks that differ from the base's map
   (those the guest wrote since the promotion, and those the old host wrote
   after the last update); only the delta travels, with our map beside it
   as a volume (:func:`source_map_name`): no list of blocks goes through
   etcd either;
3. :func:`build`, on the replica's host, from ``replica_apply``: a copy of
   the base with the delta applied where the two maps differ, checked
   against the source's map, is the new replica's disk.  The base is never written: until the record
   names the new disk, the old copy is whole and the new one unnamed (an
   interrupted update's volumes are swept as any other's).

The map volumes go when the update ends: ``replica_apply`` deletes them
(:func:`drop_maps`) once the update is recorded, whatever its kind (a run
of it again, after a crash, builds from them), ``replica_discard`` with
the update's other volumes; the sweep deletes those of an update no
running automation names (``bk-<id>-*``, as any replica volume).
"""
from __future__ import annotations

import contextlib
import os
import time
import xml.etree.ElementTree as ET

import libvirt
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
from engine.hypervisor.storage.volcopy import copy_volume

__all__ = ["base_map", "take", "build", "whole_name", "map_name", "source_map_name",
           "drop_maps"]

log = structlog.get_logger("peerctl.replicas")


def whole_name(update: str, dev: str) -> str:
    """The new replica disk a delta update builds (its delta arrives as
    :func:`engine.hypervisor.data.backups.volume_name`)."""
    return f"bk-{update}-{dev}.whole.qcow2"


def map_name(update: str, dev: str) -> str:
    """The volume holding the block map of a disk's base, on the replica's
    host, for update ``update``."""
    return f"bk-{update}-{dev}.map"


def source_map_name(update: str, dev: str) -> str:
    """The block map of the disk the source sent, arrived on the replica's
    host beside the delta."""
    return f"bk-{update}-{dev}.srcmap"


def _fetched_name(update: str, dev: str, whose: str = "base") -> str:
    """A map on the VM's host (a scratch volume): the base's on its way in
    (``base``), or ours on its way out (``src``)."""
    return f"{backups.SCRATCH}{update}-{dev}.{whose}map"


def drop_maps(pool, update: str) -> list[str]:
    """The map volumes of update ``update`` in ``pool`` (the base's, a
    half-written one, the source's) are deleted."""
    return [name for vol in pool.listAllVolumes(0)
            if vol.name().startswith(f"bk-{update}-")
            and vol.name().endswith((".map", ".map.part", ".srcmap"))
            for name in backups._delete_volumes(pool, vol.name())]


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
    host -> ``{maps: {dev: {volume, length}}, volumes: {dev: volume}}``:
    ``maps`` names each base disk's map volume (:func:`map_name`) in this
    host's image pool, ``volumes`` the base's disks."""
    uuid = uuid_arg(args)
    update = records.replica_id(uuid, args.get("seq") or 0)
    base = args.get("base")
    if not isinstance(base, dict):
        raise RequestError("replica_base_map needs the base")
    pool = images.ensure_pool(host)
    pool.refresh(0)
    if backups.is_test(host.conn):
        return {"maps": {}, "volumes": {}}
    volumes = _base_volumes(host, pool, uuid, base)
    directory, maps = _directory(pool), {}
    for dev, vol in volumes.items():
        path = os.path.join(directory, map_name(update, dev))
        try:
            length = blockmap.map_length(path)      # made by a run before this one
        except RequestError:
            scratch = os.path.join(directory, f"bk-{update}-{dev}.base.raw")
            blocks, length = blockmap.content_map(vol.path(), scratch)
            blockmap.write_map(blocks, length, path)
        maps[dev] = {"volume": map_name(update, dev), "length": length}
    pool.refresh(0)
    return {"maps": maps, "volumes": {dev: vol.name() for dev, vol in volumes.items()}}


@contextlib.contextmanager
def _replica_host(host, store: dict):
    """``(conn, pool)``: the replica host's libvirt and image pool."""
    same = host.is_me(store["libvirt_uri"])
    try:
        there = host.conn if same else libvirt.open(store["libvirt_uri"])
    except libvirt.libvirtError as exc:
        raise RequestError(f"cannot reach the hypervisor of {store.get('host')}: "
                           f"{exc.get_error_message()}") from None
    try:
        their_pool = there.storagePoolLookupByName(store["pool"])
        their_pool.refresh(0)
        yield there, their_pool
    except libvirt.libvirtError as exc:
        raise RequestError(f"block maps on {store.get('host')}: "
                           f"{exc.get_error_message()}") from None
    finally:
        if not same:
            try:
                there.close()
            except libvirt.libvirtError:
                pass


def _fetch_maps(host, pool, update: str, maps: dict, store: dict) -> tuple[dict, int]:
    """``({dev: map}, bytes sent)``: the base's map volumes on the replica's
    host, copied here through libvirt and read (the copies deleted)."""
    found, sent = {}, 0
    with _replica_host(host, store) as (there, their_pool):
        for dev, entry in maps.items():
            name = _fetched_name(update, dev)
            bytes_sent, _checksum = copy_volume(there, their_pool.storageVolLookupByName(
                entry["volume"]), host.conn, pool, name)
            sent += bytes_sent
            vol = images.lookup(pool, name)
            try:
                blocks, length = blockmap.read_map(vol.path())
            finally:
                vol.delete(0)
            if length != entry.get("length"):
                raise RequestError(f"the base's map of {dev} describes {length} bytes, "
                                   f"not {entry.get('length')}")
            found[dev] = blocks
    return found, sent


def _send_maps(host, pool, update: str, maps: dict, store: dict) -> int:
    """Our maps (``{dev: (map, length)}``) as volumes :func:`source_map_name`
    on the replica's host -> bytes sent."""
    directory, sent = _directory(pool), 0
    for dev, (blocks, length) in maps.items():
        blockmap.write_map(blocks, length,
                           os.path.join(directory, _fetched_name(update, dev, "src")))
    pool.refresh(0)
    with _replica_host(host, store) as (there, their_pool):
        for dev in maps:
            bytes_sent, _checksum = copy_volume(
                host.conn, images.lookup(pool, _fetched_name(update, dev, "src")), there,
                their_pool,
                source_map_name(update, dev))
            sent += bytes_sent
    return sent


def take(host, args: dict) -> dict:
    """``{uuid, name, seq, store, maps: {dev: {volume, length}}, why}`` on
    the VM's host (``maps``: :func:`base_map`'s, read from ``store``'s host) ->
    ``replica_take``'s answer with ``kind: delta``, ``map_bytes`` (the maps'
    share of ``bytes``) and each disk's ``changed`` (blocks sent) and
    ``length``.  Our map travels beside the delta as a volume
    (:func:`source_map_name`): it names the blocks the delta holds, and
    the content the built replica must match."""
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
        if not isinstance(theirs, dict) or theirs.get("length") != disk["capacity"] \
                or not isinstance(theirs.get("volume"), str):
            raise RequestError(f"the base has no disk {disk['dev']} of "
                               f"{disk['capacity']} bytes")
    pool = images.ensure_pool(host)
    base_maps, map_sent = _fetch_maps(host, pool, update,
                                      {d["dev"]: maps[d["dev"]] for d in disks}, store)
    started = time.time()
    why = args.get("why") or "no checkpoint to start from"
    if vm_state(dom) in ACTIVE:
        point = backups._live_point(host, dom, disks, update, pool, {"why_full": why})
    else:
        point = backups._offline_point(host, dom, disks, update, pool)
    pool.refresh(0)
    directory, sent_blocks, our_maps = _directory(pool), {}, {}
    for disk in disks:
        dev = disk["dev"]
        scratch = images.lookup(pool, backups.scratch_name(update, dev))
        raw = os.path.join(directory, f"{backups.SCRATCH}{update}-{dev}.raw")
        try:
            ours, length = blockmap.content_map(scratch.path(), raw, keep=True)
            blocks = blockmap.differing(ours, base_maps[dev])
            delta = os.path.join(directory, f"{backups.SCRATCH}{update}-{dev}.delta")
            blockmap.write_delta(raw, blocks, length, delta, raw + ".sparse")
        finally:
            if os.path.exists(raw):
                os.unlink(raw)
        os.replace(delta, scratch.path())   # what travels is the delta, and our map
        sent_blocks[dev] = {"changed": len(blocks), "length": length}
        our_maps[dev] = (ours, length)
    pool.refresh(0)
    failpoints.crash("delta built")         # tests: the source dies before sending
    map_sent += _send_maps(host, pool, update, our_maps, store)
    copied = backups._send(host, disks, update, pool, store)
    backups._delete_volumes(pool, f"{backups.SCRATCH}{update}-")
    data = sum(d["bytes"] for d in copied)
    total = data + map_sent
    log.info("replica_delta_taken", vm=dom.name(), update=update, bytes=total,
             map_bytes=map_sent, blocks=sum(s["changed"] for s in sent_blocks.values()))
    return {"id": update, **point, "kind": "delta", "parent": None,
            "reason": f"{why}: only the blocks that differ from {args.get('what') or 'the base'}",
            "time": started, "bytes": total, "map_bytes": map_sent,
            "disks": [{**d, **sent_blocks[d["dev"]]} for d in copied]}


def build(host, pool, update: str, disks: list[dict], volumes: dict) -> list[dict]:
    """On the replica's host: each disk's base (``volumes``: ``{dev:
    volume}``), copied, with its arrived delta applied at the blocks where
    the base's map (:func:`map_name`) and the source's (arrived beside
    the delta, :func:`source_map_name`) differ, and its content checked
    against the source's map -> the new replica's disks.  The deltas are
    deleted (the maps once the update is recorded: a run again needs
    them); a mismatch deletes everything this update made."""
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
            theirs, _ = blockmap.read_map(os.path.join(directory, map_name(update, dev)))
            source, length = blockmap.read_map(
                os.path.join(directory, source_map_name(update, dev)))
            blockmap.apply_delta(delta.path(), whole, blockmap.differing(source, theirs),
                                 length)
            blocks, length = blockmap.content_map(
                whole, os.path.join(directory, f"bk-{update}-{dev}.check.raw"))
            if blockmap.digest(blocks, length) != blockmap.digest(source, length):
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
