"""Disks kept aside: what is left of a VM's stale copy after an HA restart.

When a host comes back after its HA VMs were restarted elsewhere (from
their images), its copies are stale but their disks may hold data someone
needs.  :func:`keep_aside` stops and undefines the copy and renames its
volumes ``aside-<uuid>-<stamp>...`` (no longer the VM's: nothing that acts
on the VM by uuid touches them, and the VM can come back to this host
later), and records them as ``aside/<host>/<uuid>-<stamp>``.  They stay
until someone deletes them on purpose (``peerctl aside delete``, the
``aside_delete`` request: :func:`delete_aside`).

Promises:
- nothing here deletes a VM's disk: volumes are renamed, never copied and
  dropped unless renaming in place is impossible (a remote hypervisor),
  and then the original goes only once its copy is complete;
- running :func:`keep_aside` again after a crash finishes the same work
  under the same names (the stamp comes from the disowned mark).
"""
from __future__ import annotations

import os
import time

import libvirt
import structlog

from engine.core import keys
from engine.core.values import readable
from engine.errors import RequestError
from engine.hypervisor.storage import images  # noqa: F401  (declares aside/)
from engine.hypervisor.domain import shapes
from engine.hypervisor.host.vm_home import leave
from engine.hypervisor.domain.lookup import find_domain, vm_lock

__all__ = ["keep_aside", "delete_aside", "aside_prefix"]

log = structlog.get_logger("peerctl.aside")


def aside_prefix(uuid: str, stamp: int) -> str:
    return f"aside-{uuid}-{stamp}"


def _rename(pool, vol, new_name: str) -> None:
    """``vol`` under ``new_name`` in the same pool."""
    path = vol.path()
    target = os.path.join(os.path.dirname(path), new_name)
    if os.path.isfile(path) and not os.path.exists(target):
        os.rename(path, target)     # the pool's directory is ours: one atomic step
        pool.refresh(0)
        return
    # A pool we cannot reach through the file system: copy, then drop.
    xml = (f"<volume><name>{new_name}</name><capacity>{vol.info()[1]}</capacity>"
           "<target><format type='qcow2'/></target></volume>")
    pool.createXMLFrom(xml, vol, 0)
    vol.delete(0)


def keep_aside(host, uuid: str, mark: dict) -> dict | None:
    """Stop and undefine ``host``'s copy of ``uuid``, keep its volumes aside
    and drop this host's ``vms/`` record of it; the ``aside/`` record
    written, or None when there was no volume."""
    from engine.hypervisor.host.vm import power_off_and_undefine
    stamp = int(mark.get("time") or time.time())
    prefix = aside_prefix(uuid, stamp)
    with vm_lock(host, uuid):
        dom = find_domain(host, uuid)
        name = dom.name() if dom is not None else None
        if dom is not None:
            power_off_and_undefine(dom, f"the stale copy of VM {name!r}")
            log.warning("stale_copy_stopped", host=host.host, uuid=uuid, vm=name)
        pool = images.ensure_pool(host)
        for vol in images.volumes_of(pool, uuid):
            _rename(pool, vol, prefix + vol.name()[len(uuid):])
        kept = [vol for vol in pool.listAllVolumes(0) if vol.name().startswith(prefix)]
        # The VM lives elsewhere: this host's record of it (if any) goes,
        # unless a move or an HA restart carries the VM (its unlock settles it).
        leave(host.store, host.host, uuid)
        if not kept:
            return None
        if name is None:
            name = (readable(host.store.get(keys.vm_definition(uuid))) or {}).get("name", uuid)
        record = {"uuid": uuid, "host": host.host, "name": name, "id": f"{uuid}-{stamp}",
                  "volumes": [{"name": vol.name(), "path": vol.path(), "bytes": vol.info()[2]}
                              for vol in kept],
                  "time": mark.get("time") or time.time(), "reason": mark.get("reason"),
                  "automation": mark.get("automation")}
        host.store.put(keys.aside(host.host, record["id"]), record)
        log.warning("disks_kept_aside", host=host.host, uuid=uuid, vm=name,
                    volumes=[v["name"] for v in record["volumes"]])
        return record


def delete_aside(host, args: dict) -> dict:
    """``{id}``: delete the volumes kept aside as ``aside/<host>/<id>`` and
    the record.  Deleting what is already gone is fine."""
    aside_id = args.get("id")
    if not isinstance(aside_id, str) or "/" in aside_id or not aside_id:
        raise RequestError(f"bad id of disks kept aside: {aside_id!r}")
    key = keys.aside(host.host, aside_id)
    record = readable(host.store.get(key))
    pool = images.ensure_pool(host)
    names = {vol["name"] for vol in (record or {}).get("volumes", [])
             if isinstance(vol, dict) and isinstance(vol.get("name"), str)}
    prefix = "aside-" + aside_id
    names |= {vol.name() for vol in pool.listAllVolumes(0) if vol.name().startswith(prefix)}
    deleted = []
    for name in sorted(names):
        if not name.startswith(prefix):
            continue            # only what this id kept aside, whatever the record says
        try:
            pool.storageVolLookupByName(name).delete(0)
            deleted.append(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
                raise RequestError(f"cannot delete {name}: {exc.get_error_message()}") \
                    from None
    host.store.delete(key)
    log.warning("aside_deleted", host=host.host, id=aside_id, volumes=deleted)
    return {"id": aside_id, "host": host.host, "deleted": deleted}
