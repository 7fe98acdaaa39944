"""The host's half of ``adopt`` and ``unmanage`` (``automations/adoption.py``):
a foreign domain taken under management in place, and a VM let go.

Each function is a request handler ``fn(host, args) -> dict``, idempotent
by uuid, run on the domain's host under the VM's request lock.

- :func:`survey` ``{uuid, name}``: what adopting the domain would record
  (:func:`engine.hypervisor.host.foreign.survey`): size, disks, networks, MACs,
  and ``problems``.  Reads only.
- :func:`take` ``{uuid, name, ha, expect: {vcpus, memory_mb, disk_gb}}``:
  the domain becomes this host's peerctl VM, with no restart and no copy:
  its peerctl metadata written (host, disk size, networks and its own MACs,
  HA policy), then, in one transaction, its definition (``vmdef/``), its
  record (``vms/<host>/<uuid>``, wanting the state it is in), the volumes it
  owns under names peerctl did not give them (``ownvols/``: ``destroy``
  deletes them with it) and the end of its foreign record.  Refused, with
  nothing written, when the domain has problems or changed size since the
  claim was made for it (``expect``).  Taken already: the records are
  written again, nothing else.
- :func:`let_go` ``{uuid, name}``: the reverse: the domain keeps running
  and stays defined, its peerctl metadata removed; in one transaction its
  record, definition, own volumes and snapshot records go and its foreign
  record comes back (under the host's lease).  Gone already: only the
  records are settled.
"""
from __future__ import annotations

import time

import libvirt
import structlog

from engine.core import keys
from engine.core.store import Delete, Put
from engine.errors import RequestError
from engine.hypervisor.host import foreign
from engine.hypervisor.domain.definition import definition_record
from engine.hypervisor.domain.domain_xml import NAMESPACE, REBOOT_NAMESPACE, read_metadata, \
    write_metadata
from engine.hypervisor.domain.records import merged, vm_record, vm_state
from engine.hypervisor.domain.lookup import libvirt_call, uuid_arg, vm_label, vm_lock
from engine.hypervisor.domain.metadata_memo import forget_everywhere
from engine.hypervisor.host.vm import ha_arg

__all__ = ["survey", "take", "let_go"]

log = structlog.get_logger("peerctl.adoption")

SIZE = ("vcpus", "memory_mb", "disk_gb")


def _domain(host, uuid: str):
    try:
        return host.conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def survey(host, args: dict) -> dict:
    uuid = uuid_arg(args)
    dom = _domain(host, uuid)
    if dom is None:
        raise RequestError(f"{vm_label(args, uuid)}: host {host.host} has no such domain")
    seen = foreign.survey(host.conn, dom, host.offer)
    return {**seen, "host": host.host}


def take(host, args: dict) -> dict:
    uuid = uuid_arg(args)
    policy = ha_arg(args)
    expect = args.get("expect")
    if not isinstance(expect, dict) or any(not isinstance(expect.get(k), int) for k in SIZE):
        raise RequestError(f"take needs the size its claim was made for, got {expect!r}")
    with vm_lock(host, uuid):
        dom = _domain(host, uuid)
        if dom is None:
            raise RequestError(f"{vm_label(args, uuid)}: host {host.host} has no such domain "
                               "(undefined since it was surveyed)")
        owner = read_metadata(dom).get("host")
        seen = foreign.survey(host.conn, dom, host.offer)
        if owner is None:
            if seen["problems"]:
                raise RequestError("; ".join(seen["problems"]))
            size = {k: seen[k] for k in SIZE}
            if size != {k: expect[k] for k in SIZE}:
                raise RequestError(f"{vm_label(args, uuid)} changed since it was surveyed "
                                   f"({size} now): adopt it again")
            marks = {"host": host.host, "disk_gb": seen["disk_gb"], "image": "",
                     "adopted_at": repr(time.time()),
                     **({"networks": ",".join(seen["networks"]),
                         "macs": ",".join(seen["macs"])} if seen["networks"] else {}),
                     **({"ha": policy} if policy else {})}
            libvirt_call(f"cannot write the metadata of {vm_label(args, uuid)}",
                          write_metadata, dom, marks)
            log.info("vm_adopted", vm=dom.name(), uuid=uuid, host=host.host)
        elif owner != host.host:
            raise RequestError(f"{vm_label(args, uuid)} is peerctl's VM of host {owner}")
        _record_taken(host, dom, seen["disks"])
        return {"uuid": uuid, "name": dom.name(), "host": host.host, "state": vm_state(dom)}


def _record_taken(host, dom, disks: list[dict]) -> None:
    uuid = dom.UUIDString()
    previous = host.store.get(keys.vm(host.host, uuid))
    state = vm_state(dom)
    want = state if state in ("running", "paused", "shutoff") else None
    own = [d["path"] for d in disks if not d["path"].rsplit("/", 1)[-1].startswith(uuid)]
    ops = [Put(keys.vm_definition(uuid), definition_record(dom)),
           Put(keys.vm(host.host, uuid),
               merged(vm_record(host.host, dom),
                      previous.value if previous is not None and isinstance(previous.value, dict)
                      else None, want)),
           Delete(keys.foreign(host.host, uuid))]
    if own:
        ops.append(Put(keys.own_volumes(host.host, uuid),
                       {"uuid": uuid, "host": host.host, "paths": own}))
    host.store.txn([], ops)


def let_go(host, args: dict) -> dict:
    uuid = uuid_arg(args)
    with vm_lock(host, uuid):
        dom = _domain(host, uuid)
        owner = read_metadata(dom).get("host") if dom is not None else None
        if owner not in (None, host.host):
            raise RequestError(f"{vm_label(args, uuid)} is peerctl's VM of host {owner}")
        if owner == host.host:
            _drop_metadata(dom, vm_label(args, uuid))
            log.info("vm_let_go", vm=dom.name(), uuid=uuid, host=host.host)
        ops = [Delete(keys.vm(host.host, uuid)), Delete(keys.vm_definition(uuid)),
               Delete(keys.own_volumes(host.host, uuid))]
        if dom is not None:
            live = host.store.get(keys.host(host.host))
            ops.append(Put(keys.foreign(host.host, uuid),
                           foreign.foreign_record(host.host, dom, host.offer),
                           live.lease if live is not None else 0))
        host.store.txn([], ops)
        host.store.delete(keys.snapshot(uuid, ""), prefix=True)
        return {"uuid": uuid, "name": dom.name() if dom is not None else args.get("name"),
                "host": host.host, "state": vm_state(dom) if dom is not None else "absent"}


def _drop_metadata(dom, label: str) -> None:
    """No peerctl metadata left on ``dom``: its definition's, and while it
    runs, the live domain's (with the last reboot's token)."""
    flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
    if dom.isActive():
        flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
    try:
        libvirt_call(f"cannot remove the metadata of {label}", dom.setMetadata,
                     libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None, NAMESPACE, flags)
    finally:
        forget_everywhere(dom.UUIDString())
    if dom.isActive():
        try:
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None, REBOOT_NAMESPACE,
                            libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except libvirt.libvirtError:
            pass            # there was none
