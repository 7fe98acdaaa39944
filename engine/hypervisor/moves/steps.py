"""What one host does for a VM that moves, besides the copy itself.

A move is a replayed automation (``automations/moves.py``) sending these
requests; the copy of disks and memory is :mod:`engine.hypervisor.moves.migration`
(QEMU/KVM).  Each function is a request handler ``fn(host, args) -> dict``
and is idempotent by VM uuid.

- :func:`describe` (source): the VM as it is now: state, driver, inactive
  XML, disks with their virtual sizes, image, required traits, and the
  host's libvirt URI.
- :func:`prepare` (destination): volumes for the VM at exactly the source's
  virtual sizes, as overlays on this host's own copy of the VM's base image
  when it has one (``incremental``: only the top layer is copied), and the
  destination XML: the same domain with this host's disk paths, console log,
  owner and interfaces (the same networks and MACs, as this host offers
  them), and the cloud-init seed rebuilt here from the domain's metadata.  A shut-off copy left by an earlier, failed move is swept first;
  a running one is refused.
- :func:`adopt` (destination): the VM in its final state here: defined (from
  ``xml`` when the driver has no migration, the test driver's
  *re-definition*), running, paused or shut off as asked, the checkpoints
  the migration carried defined again where their bitmaps came whole
  (:mod:`engine.hypervisor.moves.checkpoints`), and its ``vms/`` record
  written before the reply.
- :func:`locate`: run by any peer, asks each named libvirt URI directly what
  state the VM is in, waiting while a migration job is still running, so
  that an unknown outcome is decided from the hypervisors, not guessed.
"""
from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.core import keys
from engine.errors import RequestError
from engine.hypervisor.storage import images
from engine.hypervisor.domain.definition import seed_from_metadata
from engine.hypervisor.domain.domain_xml import NAMESPACE, read_metadata, seed_source, volume_xml
from engine.hypervisor.domain.networks import retarget as retarget_interfaces
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.domain.disks import ACTIVE, disks_of
from engine.hypervisor.domain.lookup import (
    find_domain, libvirt_call, require_domain, uuid_arg, vm_label, vm_lock)
from engine.hypervisor.host.vm import \
    console_log_path, destroy, make_seed, offered_here
from engine.hypervisor.host.vmpublish import publish_domain
from engine.hypervisor.moves import checkpoints

__all__ = ["describe", "prepare", "adopt", "locate", "retargeted"]

log = structlog.get_logger("peerctl.moves")

def describe(host, args: dict) -> dict:
    uuid, dom = require_domain(host, args)
    xml = libvirt_call(f"cannot read {vm_label(args, uuid)}", dom.XMLDesc,
                        libvirt.VIR_DOMAIN_XML_INACTIVE)
    meta = read_metadata(dom)
    _state, max_kib, _mem, vcpus, _cpu = dom.info()
    return {"uuid": uuid, "name": dom.name(), "host": host.host, "state": vm_state(dom),
            "driver": host.conn.getType(), "libvirt_uri": host.remote_uri, "xml": xml,
            "image": meta.get("image") or None, "required": meta.get("required") or None,
            "vcpus": vcpus, "memory_mb": max_kib // 1024, "disk_gb": meta.get("disk_gb", 0),
            "disks": disks_of(host.conn, ET.fromstring(xml))}


def _base_here(host, pool, source_backing: str | None):
    """This host's complete copy of the base image a source disk sits on,
    named as on the source (``image-<sha256>``), and its format; or None."""
    if not source_backing:
        return None
    name = os.path.basename(source_backing)
    if not name.startswith(images.image_volume_name("")):
        return None
    return images.cached_base(host, pool, name[len(images.image_volume_name("")):])


def prepare(host, args: dict) -> dict:
    uuid = uuid_arg(args)
    source = args.get("describe")
    if not isinstance(source, dict) or not isinstance(source.get("xml"), str):
        raise RequestError("prepare needs the source's description (move_describe)")
    with vm_lock(host, uuid):
        stale = find_domain(host, uuid)
        if stale is not None:
            if vm_state(stale) in ACTIVE:
                raise RequestError(f"{vm_label(args, uuid)} already runs on {host.host}")
            _sweep(host, stale, uuid)
        pool = images.ensure_pool(host)
        for vol in images.volumes_of(pool, uuid):
            vol.delete(0)               # a copy target from an earlier try: start clean
        root = ET.fromstring(source["xml"])
        disks, incremental = [], bool(source.get("disks"))
        for disk in source.get("disks") or []:
            name = _volume_name(uuid, disk)
            base = _base_here(host, pool, disk.get("backing"))
            if base is not None:
                vol = pool.createXML(volume_xml(
                    name, disk["capacity"], "qcow2", backing_path=base[0].path(),
                    backing_format=base[1]), 0)
            else:
                incremental = False
                vol = pool.createXML(volume_xml(name, disk["capacity"],
                                                disk.get("format") or "qcow2"), 0)
            disks.append({"dev": disk["dev"], "path": vol.path(), "capacity": disk["capacity"]})
        xml = retargeted(host, uuid, root, pool, {d["dev"]: d["path"] for d in disks})
        log.info("move_prepared", uuid=uuid, disks=len(disks), incremental=incremental)
        return {"uuid": uuid, "host": host.host, "libvirt_uri": host.remote_uri,
                "xml": xml, "disks": disks, "incremental": incremental and bool(disks)}


def _volume_name(uuid: str, disk: dict) -> str:
    """The destination volume of a source disk: the source's name when it
    is peerctl's (``<uuid>.qcow2``), else ``<uuid>-<dev>`` (an adopted VM's
    disk takes peerctl's naming on its first move, so that ``destroy``
    finds it by the VM's uuid there)."""
    name = os.path.basename(disk["path"])
    if name.startswith(uuid):
        return name
    return f"{uuid}-{disk['dev']}.{'qcow2' if disk.get('format') == 'qcow2' else 'img'}"


def retargeted(host, uuid: str, source, pool, paths: dict) -> str:
    """The source's domain XML (a string or a parsed element) made this
    host's: its disks at ``paths`` (dev -> path), its console log, owner,
    interfaces and seed; and this host's disowned mark of the VM dropped
    (an earlier lost move's mark would destroy the arriving copy)."""
    root = ET.fromstring(source) if isinstance(source, str) else source
    _retarget(root, paths, host, uuid)
    _retarget_networks_and_seed(root, host, pool, uuid)
    # Read first: a mark is rare, and a read costs etcd no log entry nor
    # disk write, which a delete does even when there is nothing to delete.
    if host.store is not None and host.store.get(keys.disowned(host.host, uuid)) is not None:
        host.store.delete(keys.disowned(host.host, uuid))
    return ET.tostring(root, encoding="unicode")


def _sweep(host, dom, uuid: str) -> None:
    """A shut-off copy left here by an earlier move that did not finish."""
    log.warning("move_stale_copy_swept", uuid=uuid, host=host.host)
    destroy(host, {"uuid": uuid})


def _retarget(root: ET.Element, paths: dict, host, uuid: str) -> None:
    """The source's domain XML, made this host's: disks, console log, owner."""
    for disk in root.findall("./devices/disk"):
        target, source = disk.find("target"), disk.find("source")
        if target is not None and source is not None and target.get("dev") in paths:
            source.set("file", paths[target.get("dev")])
    for log_element in root.findall("./devices/serial/log"):
        path = console_log_path(host, uuid)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        log_element.set("file", path)
    owner = root.find(f"./metadata/{{{NAMESPACE}}}vm/{{{NAMESPACE}}}host")
    if owner is not None:
        owner.text = host.host


def _metadata_of(root: ET.Element, name: str) -> str | None:
    return root.findtext(f"./metadata/{{{NAMESPACE}}}vm/{{{NAMESPACE}}}{name}")


def _retarget_networks_and_seed(root: ET.Element, host, pool, uuid: str) -> None:
    """The VM's interfaces as this host offers its networks (same MACs),
    and its cloud-init seed rebuilt here from the metadata (a read-only
    CD-ROM is not copied by the migration)."""
    names = offered_here(host, [n for n in (_metadata_of(root, "networks") or "").split(",")
                                if n])
    devices = root.find("./devices")
    if names:
        retarget_interfaces(devices, uuid, names, host.offer,
                            virtio=root.get("type") != "test", macs=_metadata_of(root, "macs"))
    seed_args = seed_from_metadata(_metadata_of(root, "seed"))
    if seed_args is None:
        return
    path = make_seed(host, pool, uuid, seed_args, names)
    source = seed_source(root)
    if source is not None:
        source.set("file", path)


def adopt(host, args: dict) -> dict:
    uuid = uuid_arg(args)
    want = args.get("state", "running")
    if want not in ("running", "paused", "shutoff"):
        raise RequestError(f"adopt: state must be running, paused or shutoff, got {want!r}")
    with vm_lock(host, uuid):
        dom = find_domain(host, uuid)
        if dom is None:
            xml = args.get("xml")
            if not isinstance(xml, str):
                raise RequestError(f"{vm_label(args, uuid)} is not on host {host.host} "
                                   "and no definition came with it")
            dom = libvirt_call(f"cannot define {vm_label(args, uuid)}", host.conn.defineXML,
                                xml)
            log.info("move_defined", uuid=uuid, host=host.host)
        elif not dom.isPersistent():
            libvirt_call(f"cannot persist {vm_label(args, uuid)}", host.conn.defineXML,
                          dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        state = vm_state(dom)
        if want == "shutoff" and state != "shutoff":
            libvirt_call(f"cannot stop {vm_label(args, uuid)}", dom.destroy)
        elif want != "shutoff" and state in ("shutoff", "building", "error"):
            flags = libvirt.VIR_DOMAIN_START_PAUSED if want == "paused" else 0
            libvirt_call(f"cannot start {vm_label(args, uuid)}", dom.createWithFlags, flags)
        elif want == "running" and state == "paused":
            libvirt_call(f"cannot resume {vm_label(args, uuid)}", dom.resume)
        elif want == "paused" and state == "running":
            libvirt_call(f"cannot pause {vm_label(args, uuid)}", dom.suspend)
        answer = {"uuid": uuid, "host": host.host, "state": vm_state(dom)}
        settled = checkpoints.settle(dom)
        if settled is not None:
            answer["checkpoints"] = settled
        if host.store is not None:
            publish_domain(host.store, host.host, dom, want=want)
        return answer


def _where(uri: str, uuid: str, wait: float) -> dict:
    """The VM's state at ``uri``, once no migration job runs there."""
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        return {"state": "unreachable", "error": exc.get_error_message()}
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                dom = conn.lookupByUUIDString(uuid)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return {"state": "absent"}
                return {"state": "unreachable", "error": exc.get_error_message()}
            try:
                state, reason = dom.state()
                busy = state == libvirt.VIR_DOMAIN_PAUSED and \
                    reason == libvirt.VIR_DOMAIN_PAUSED_MIGRATION
                try:
                    busy = busy or dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE
                except libvirt.libvirtError as exc:
                    if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                        raise
                if not busy or time.monotonic() >= deadline:
                    return {"state": vm_state(dom), "persistent": bool(dom.isPersistent()),
                            "job": busy}
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                    return {"state": "unreachable", "error": exc.get_error_message()}
                continue        # it just left (a migration ended): look again
            time.sleep(0.5)
    finally:
        conn.close()


def locate(host, args: dict) -> dict:
    """``{hosts: {name: uri}, uuid, wait?}`` -> ``{name: {state, ...}}``,
    state one of running, paused, shutoff, absent, unreachable."""
    uuid = uuid_arg(args)
    hosts = args.get("hosts")
    if not isinstance(hosts, dict) or not hosts:
        raise RequestError("locate needs hosts: {name: libvirt URI}")
    wait = float(args.get("wait") or 60.0)
    return {name: _where(uri, uuid, wait) for name, uri in sorted(hosts.items())}
