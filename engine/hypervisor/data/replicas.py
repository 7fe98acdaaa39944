"""A VM's replica on another host: a bootable copy of its disks, brought up
to date by incremental copies, always whole.

An update is a backup (:mod:`engine.hypervisor.data.backups`) whose copy lands
in the image pool of the replica's host, as ``bk-<id>-<dev>.qcow2`` with
``<id>`` the update's id (:func:`engine.backups.replicas.replica_id`), and whose
checkpoint ``peerctl-<id>`` is where the next update starts from.

On the replica's host (:func:`apply`): the arrived volumes are read back
and checksummed first.  A full update's volumes *are* the new replica; an
incremental's are written into the replica's disks; a delta's (only the
blocks that differ from a copy this host keeps,
:mod:`engine.hypervisor.data.replica_delta`) are applied to a copy of that
base, checked, and the copy is the new replica.  Whole at every
instant, because the record in etcd (``replicas/<uuid>``, written here) is
moved on only once the arrived data is complete, and names it:

1. the record's ``replica`` becomes ``{seq, time, disks, pending}``, with
   ``pending`` the increments (or, for a full update, the new disks, and
   the old ones not yet deleted).  From this write on, the replica is its
   disks *plus* its pending increments, and both are on this host's disk;
2. each increment is committed into its disk (``qemu-img commit``).  A
   crash midway leaves the disk partly written, but the increment overlays
   exactly those clusters, so disk + increment still reads as this update:
   committing again (the next :func:`apply`, or :func:`promote`) finishes
   it, and nothing else reads the disk alone meanwhile;
3. the increments are deleted and ``pending`` cleared.

:func:`promote` (an HA restart on this host) finishes what is pending and
renames the replica's volumes to the VM's own (``<uuid>.qcow2``): the VM is
built on them.  :func:`drop` deletes a VM's replica volumes that the record
does not name (or all of them); :func:`discard` undoes an update that will
not complete, on either host.

The test driver keeps no volume content: its updates record the disks with
nothing copied, and a promoted replica is a blank disk of the same size.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.core import failpoints, keys
from engine.core.store import absent, exists
from engine.errors import RequestError
from engine.backups import replicas as records
from engine.hypervisor.data import backups, replica_delta
from engine.hypervisor.storage import images, qcow2
from engine.hypervisor.storage.checksum import ContentHash
from engine.hypervisor.domain.domain_xml import volume_xml
from engine.hypervisor.domain.disks import ACTIVE, disks_of
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.data.restores import disk_volume_name
from engine.hypervisor.domain.lookup import find_domain, uuid_arg, vm_label, vm_lock
from engine.hypervisor.storage.volcopy import checksum_volume, physical_size

__all__ = ["prepare", "take", "apply", "prune", "discard", "drop", "promote"]

log = structlog.get_logger("peerctl.replicas")


def _prefix(uuid: str) -> str:
    """What every volume of this VM's replica starts with."""
    return f"bk-{records.replica_id(uuid, 0)[:-1]}"


def _update_id(args: dict, uuid: str) -> str:
    seq = args.get("seq")
    if not isinstance(seq, int) or seq < 1:
        raise RequestError(f"bad replica update number {seq!r}")
    return records.replica_id(uuid, seq)


def prepare(host, args: dict) -> dict:
    """``{uuid, seq, needed}`` -> ``{host, libvirt_uri, pool, free}``: this
    host's image pool, with room for the update; an earlier try's volumes of
    this update are removed first."""
    uuid = uuid_arg(args)
    update = _update_id(args, uuid)
    pool = images.ensure_pool(host)
    pool.refresh(0)
    backups._delete_volumes(pool, f"bk-{update}-")
    free = pool.info()[3]
    needed = int(args.get("needed") or 0)
    if free < needed:
        raise RequestError(f"host {host.host} has no room for a replica: {free >> 20} MiB "
                           f"free in pool {pool.name()}, the disks need up to "
                           f"{needed >> 20} MiB")
    return {"host": host.host, "libvirt_uri": host.remote_uri, "pool": pool.name(),
            "free": free}


def take(host, args: dict) -> dict:
    """On the VM's host: ``{uuid, name, seq, store, parent: {id, checkpoint,
    time, what} | None, why_full, base}`` -> what :func:`backups.take`
    answers, or ``{unchanged: true}`` for a shut-off VM whose disks were not
    written since the replica's time (a shut-off VM's update is a whole
    copy), or, with ``base`` (the replica's host keeps a copy) when the
    update cannot be incremental, ``{wants_base: why}`` with nothing taken:
    a delta update (:mod:`engine.hypervisor.data.replica_delta`) sends less."""
    uuid = uuid_arg(args)
    update = _update_id(args, uuid)
    parent = args.get("parent")
    dom = find_domain(host, uuid)
    if dom is None:
        raise RequestError(f"{vm_label(args, uuid)} is not on host {host.host}")
    if isinstance(parent, dict) and vm_state(dom) not in ACTIVE \
            and not backups.is_test(host.conn):
        disks = disks_of(host.conn, ET.fromstring(dom.XMLDesc(0)))
        written = max((os.stat(d["path"]).st_mtime for d in disks), default=0)
        if written < float(parent.get("time") or 0):
            return {"unchanged": True}
    if args.get("base") and vm_state(dom) in ACTIVE and not backups.is_test(host.conn):
        disks = disks_of(host.conn, ET.fromstring(dom.XMLDesc(0)))
        why = backups._why_full(dom, backups._old_disks(host, disks), args)
        if why:
            return {"wants_base": why}
    return backups.take(host, {**args, "id": update})


def prune(host, args: dict) -> dict:
    """``{uuid, keep}``: the VM's replica checkpoints but ``keep`` go."""
    return backups.prune(host, {**args, "only": backups.CHECKPOINT + records.checkpoint_prefix()})


def _check_disks(disks) -> list[dict]:
    if not isinstance(disks, list) or not disks or not all(
            isinstance(d, dict) and isinstance(d.get("dev"), str)
            and isinstance(d.get("volume"), str) for d in disks):
        raise RequestError("apply needs the update's disks")
    return disks


def _verify(host, pool, update: str, disks: list[dict]) -> None:
    """The arrived volumes match what was sent, or they are deleted."""
    test = backups.is_test(host.conn)
    ticker = backups.Ticker("verifying", sum(d.get("stored", 0) for d in disks))
    for disk in disks:
        vol = images.lookup(pool, disk["volume"])
        if test:
            vol = vol or pool.createXML(volume_xml(disk["volume"], 0, "raw"), 0)
            found = ContentHash().hexdigest()
        elif vol is None:
            raise RequestError(f"replica update {update}: volume {disk['volume']} is not in "
                               f"pool {pool.name()} on {host.host}")
        else:
            found, _length = checksum_volume(host.conn, vol, ticker)
            ticker.next(physical_size(vol))
        if found != disk.get("checksum"):
            backups._delete_volumes(pool, f"bk-{update}-")
            raise RequestError(f"replica update {update}: disk {disk['dev']} arrived damaged "
                               f"on {host.host}: discarded")


def apply(host, args: dict) -> dict:
    """``{uuid, seq, source, expect: {host, seq} | None, taken, base}`` ->
    the record's new ``replica`` (``base``: for a delta update, ``{dev:
    volume}`` the delta applies to, copied).  Refused (the arrived volumes deleted) when
    the record moved on meanwhile, the replication stopped, or the source
    is no longer a live host that owns the VM."""
    uuid = uuid_arg(args)
    update = _update_id(args, uuid)
    taken, source = args.get("taken") or {}, args.get("source")
    disks = _check_disks(taken.get("disks"))
    if not isinstance(source, str):
        raise RequestError("apply needs the VM's host")
    with vm_lock(host, uuid):
        pool = images.ensure_pool(host)
        pool.refresh(0)
        record = records.read(host.store, uuid)
        current = (record or {}).get("replica")
        if current and current.get("host") == host.host and current.get("seq") == args["seq"]:
            replica_delta.drop_maps(pool, update)
            return _finish(host, pool, uuid, current)       # recorded already: a re-sent step
        _verify(host, pool, update, disks)
        if taken.get("kind") == "delta":
            disks = replica_delta.build(host, pool, update, disks, args.get("base"))
        incremental = taken.get("kind") == "incremental"
        if incremental and not (current and current.get("host") == host.host):
            backups._delete_volumes(pool, f"bk-{update}-")
            raise RequestError(f"replica update {update} is incremental but the replica is not "
                               f"on {host.host}")
        arrived = [{"dev": d["dev"], "volume": d["volume"], "capacity": d.get("capacity")}
                   for d in disks]
        if incremental:
            bases = current["disks"]
            pending = [*(current.get("pending") or []),
                       *({**d, "into": _base_of(bases, d["dev"])} for d in arrived)]
        else:
            bases = arrived
            old = current["disks"] if current and current.get("host") == host.host else []
            pending = [{**d, "drop": True} for d in old]
        kept = (record or {}).get("kept")
        if kept and kept.get("host") == host.host and kept.get("seq") != args["seq"]:
            # a hand-off's frozen files: done with them
            pending += [{**d, "drop": True} for d in kept["disks"]]
        replica = {"host": host.host, "seq": args["seq"], "time": taken.get("time"),
                   "checkpoint": taken.get("checkpoint"), "pool": pool.name(),
                   "kind": taken.get("kind"), "bytes": taken.get("bytes"), "disks": bases,
                   "pending": pending or None, "consistency": taken.get("consistency"),
                   "reason": taken.get("reason")}
        expect = args.get("expect")

        def edit(known):
            if known is None or known.get("stop"):
                return "stopped", None, [], []
            now = known.get("replica")
            seen = {"host": now["host"], "seq": now["seq"]} if now else None
            if seen != expect:
                return "moved on", None, [], []
            frozen = known.get("kept")      # a hand-off's own update keeps its frozen disk
            frozen = frozen if frozen and frozen.get("seq") == args["seq"] else None
            return "recorded", {**known, "replica": replica, "kept": frozen,
                                "seq": max(int(known.get("seq") or 0), args["seq"])}, \
                [exists(keys.host(source)), absent(keys.disowned(source, uuid))], []
        outcome = records.change(host.store, uuid, edit)
        if outcome != "recorded":
            backups._delete_volumes(pool, f"bk-{update}-")
            raise RequestError(f"replica update {update} not recorded: the replication "
                               f"{outcome} meanwhile, or {source} no longer runs the VM")
        replica_delta.drop_maps(pool, update)     # a delta's maps, or a base's unused
        log.info("replica_updated", vm=(record or {}).get("vm"), uuid=uuid, seq=args["seq"],
                 kind=taken.get("kind"), bytes=taken.get("bytes"))
        return _finish(host, pool, uuid, replica)


def _base_of(bases: list[dict], dev: str) -> str:
    for disk in bases:
        if disk["dev"] == dev:
            return disk["volume"]
    raise RequestError(f"the replica has no disk {dev}")


def _finish(host, pool, uuid: str, replica: dict) -> dict:
    """Step 2 and 3 of the module docstring: what is pending is written
    into the disks (or deleted: a full update's old disks), then cleared."""
    pending = replica.get("pending") or []
    if not pending:
        return replica
    test = backups.is_test(host.conn)
    for entry in pending:
        vol = images.lookup(pool, entry["volume"])
        if vol is None:
            continue                    # done and deleted by an earlier run
        if not entry.get("drop") and not test:
            base = images.lookup(pool, entry["into"])
            if base is None:
                raise RequestError(f"replica of {uuid}: its disk {entry['into']} is missing "
                                   f"on {host.host}")
            qcow2.apply_increment(vol.path(), base.path())
            failpoints.crash("replica committed")   # tests: written in, not yet deleted
        vol.delete(0)
    finished = {**replica, "pending": None}

    def edit(known):
        now = (known or {}).get("replica")
        if not now or now.get("host") != host.host or now.get("seq") != replica["seq"]:
            return finished, None, [], []
        return finished, {**known, "replica": finished}, [], []
    records.change(host.store, uuid, edit)
    return finished


def discard(host, args: dict) -> dict:
    """``{uuid, seq}``: undo this update's leftovers on this host, source
    (job, scratch volumes, checkpoint) or replica host (arrived volumes the
    record does not name)."""
    uuid = uuid_arg(args)
    update = _update_id(args, uuid)
    removed = backups.discard_source(host, uuid, update)
    named = _named_here(host, uuid)
    pool = images.ensure_pool(host)
    pool.refresh(0)
    for vol in pool.listAllVolumes(0):
        if vol.name().startswith(f"bk-{update}-") and vol.name() not in named:
            removed += backups._delete_volumes(pool, vol.name())
    return {"uuid": uuid, "removed": removed}


def _named_here(host, uuid: str) -> set[str]:
    record = records.read(host.store, uuid) or {}
    replica, kept = record.get("replica"), record.get("kept")
    named = {d["volume"] for d in kept["disks"]} \
        if kept and kept.get("host") == host.host else set()
    if not replica or replica.get("host") != host.host:
        return named
    return named | {d["volume"] for d in replica["disks"]} \
        | {d["volume"] for d in replica.get("pending") or []}


def drop(host, args: dict) -> dict:
    """``{uuid, all?}``: this host's replica volumes of the VM that its
    record does not name (all of them once the record names another host,
    or none; or with ``all``: the replication stops)."""
    uuid = uuid_arg(args)
    with vm_lock(host, uuid):
        named = set() if args.get("all") else _named_here(host, uuid)
        pool = images.ensure_pool(host)
        pool.refresh(0)
        gone = []
        for vol in pool.listAllVolumes(0):
            if vol.name().startswith(_prefix(uuid)) and vol.name() not in named:
                gone += backups._delete_volumes(pool, vol.name())
        if gone:
            log.info("replica_dropped", uuid=uuid, host=host.host, volumes=gone)
        return {"uuid": uuid, "deleted": gone}


def promote(host, args: dict) -> dict:
    """``{uuid, owner}``: this host's replica becomes the VM's disks
    (``<uuid>.qcow2``), the record's ``replica`` goes to ``consumed`` (so
    no update builds on it again) -> ``{host, seq, time, disks}``.  Run
    again by the same owner, it answers the same."""
    uuid, owner = uuid_arg(args), args.get("owner")
    with vm_lock(host, uuid):
        record = records.read(host.store, uuid) or {}
        replica, consumed = record.get("replica"), record.get("consumed")
        if not replica or replica.get("host") != host.host:
            if consumed and consumed.get("host") == host.host \
                    and consumed.get("owner") == owner:
                return consumed
            raise RequestError(f"{vm_label(args, uuid)} has no replica on {host.host}")
        if find_domain(host, uuid) is not None:
            raise RequestError(f"{vm_label(args, uuid)} is defined on {host.host} already")
        pool = images.ensure_pool(host)
        pool.refresh(0)
        replica = _finish(host, pool, uuid, replica)
        disks = [_rename(host, pool, disk, disk_volume_name(uuid, disk["dev"]))
                 for disk in replica["disks"]]
        pool.refresh(0)
        consumed = {"host": host.host, "seq": replica["seq"], "time": replica["time"],
                    "owner": owner, "disks": disks}

        def edit(known):
            if known is None:
                return consumed, None, [], []
            return consumed, {**known, "replica": None, "consumed": consumed}, [], []
        records.change(host.store, uuid, edit)
        log.warning("replica_promoted", uuid=uuid, host=host.host, seq=replica["seq"],
                    data_as_of=replica["time"])
        return consumed


def _rename(host, pool, disk: dict, final: str) -> dict:
    """The replica's volume ``disk`` under the VM's own name ``final``."""
    vol = images.lookup(pool, disk["volume"])
    if vol is None:
        if images.lookup(pool, final) is None:
            raise RequestError(f"the replica's volume {disk['volume']} is missing on "
                               f"{host.host}")
        return {"dev": disk["dev"], "volume": final}        # renamed by an earlier run
    if backups.is_test(host.conn):
        gib = max(1, -(-int(disk.get("capacity") or 0) // images.GiB))
        images.ensure_blank(pool, final, gib)
        vol.delete(0)
    else:
        try:
            os.rename(vol.path(), os.path.join(os.path.dirname(vol.path()), final))
        except OSError as exc:
            raise RequestError(f"replica volume {disk['volume']}: {exc}") from None
    return {"dev": disk["dev"], "volume": final}


def checkpoints(dom) -> list[str]:
    """The replica checkpoints on a domain (tests and sweeps)."""
    prefix = backups.CHECKPOINT + records.checkpoint_prefix()
    try:
        return [c.getName() for c in dom.listAllCheckpoints(0)
                if c.getName().startswith(prefix)]
    except libvirt.libvirtError:
        return []
