"""A VM's checkpoints across a migration: its backups' and replicas'
chains go on from the point they had, so that the first backup after a
move is incremental.

What crosses, and how (libvirt 9.0, QEMU 7.2, measured on this machine):

- a checkpoint's *data*, the persistent dirty bitmap of each disk, is
  carried by QEMU itself: with non-shared storage libvirt offers the
  bitmaps of the disks it mirrors in its migration cookie and turns on
  QEMU's ``dirty-bitmaps`` migration capability, provided the destination's
  disk has no bitmap of that name (QEMU refuses to migrate into an
  existing bitmap, and the whole migration then fails: ``move_prepare``
  makes blank disks).  The bitmap arrives as it was when the source's CPUs
  stopped, every write since the checkpoint counted, and goes on recording
  the destination's writes;
- a checkpoint's *metadata* does not cross: the destination's libvirt has
  no checkpoint.  So the copy (:mod:`engine.hypervisor.moves.migration`,
  on the source) puts the checkpoints' definitions into the destination's
  domain XML (:func:`carried_in`, metadata of namespace :data:`NAMESPACE`):
  they arrive with the domain, in the same step, whoever dies meanwhile.
  ``move_adopt`` on the destination then defines them again
  (:func:`settle`, ``VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE``) and removes
  that metadata.

Only a disk whose writes all land in one image can carry a bitmap whole:
QEMU carries the bitmaps of the image the guest writes to (the top of the
disk's chain), while a checkpoint made before an external snapshot (a
replica hand-off's, :mod:`engine.hypervisor.moves.handoff`; a snapshot's)
counts its writes in the layers below too.  So when a moving disk sits on
anything but a base image of the image cache (``image-<sha256>``, written
by no guest), no definition is carried (:func:`described`), and the next
backup is full.

Promise: a checkpoint is defined on the destination only when its bitmap
is there, whole, on every disk it names: libvirt checks it
(``VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE_VALIDATE`` answers "missing or
broken bitmap" otherwise, as after a destination QEMU killed before it
stored its bitmaps).  A checkpoint that cannot be checked (the VM does not
run there: a cold move) or fails the check is left out and said so; the
next backup is then full, and says the checkpoint is gone.  A checkpoint
never claims more than its bitmap knows.  :func:`settle` is idempotent:
run again (a replayed ``move_adopt``), it finds its work done, or redoes
it alike (redefining a checkpoint defined alike changes nothing).
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.hypervisor.domain.metadata_memo import forget_everywhere
from engine.hypervisor.storage import images

__all__ = ["described", "carried_in", "settle", "redefined", "NAMESPACE"]

log = structlog.get_logger("peerctl.moves")

NAMESPACE = "https://peerctl.dev/xmlns/checkpoints/1"
_PREFIX = "peerctl-checkpoints"
ET.register_namespace(_PREFIX, NAMESPACE)
REDEFINE = (libvirt.VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE
            | libvirt.VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE_VALIDATE)


def described(dom, devs: list[str]) -> list[str]:
    """The definitions of ``dom``'s checkpoints, each parent before its
    children, without the domain's XML each would otherwise embed, for a
    move of disks ``devs``; [] when it has none, its driver keeps none (the
    test driver), or a disk of ``devs`` has a layer a bitmap may be in that
    the move does not carry (:func:`_split`)."""
    try:
        if _split(ET.fromstring(dom.XMLDesc(0)), devs):
            return []
        found = dom.listAllCheckpoints(libvirt.VIR_DOMAIN_CHECKPOINT_LIST_TOPOLOGICAL)
        return [c.getXMLDesc(libvirt.VIR_DOMAIN_CHECKPOINT_XML_NO_DOMAIN) for c in found]
    except libvirt.libvirtError:
        return []


def _split(root: ET.Element, devs: list[str]) -> list[str]:
    """The disks of ``devs`` whose chain has, below its top, an image
    other than an image cache's base (in the live XML's
    ``<backingStore>``)."""
    base = images.image_volume_name("")
    split = []
    for disk in root.findall("./devices/disk"):
        if (disk.find("target") is None or disk.find("target").get("dev") not in devs):
            continue
        layer = disk.find("backingStore")
        while layer is not None and layer.find("source") is not None:
            path = layer.find("source").get("file") or layer.find("source").get("dev") or ""
            if not os.path.basename(path).startswith(base):
                split.append(disk.find("target").get("dev"))
                break
            layer = layer.find("backingStore")
    return split


def carried_in(domain_xml: str, definitions: list[str]) -> str:
    """``domain_xml`` with ``definitions`` in its metadata (replacing any
    carried before); unchanged when there are none."""
    root = ET.fromstring(domain_xml)
    metadata = root.find("metadata")
    if metadata is not None:
        for old in metadata.findall(f"{{{NAMESPACE}}}checkpoints"):
            metadata.remove(old)
    if not definitions:
        return ET.tostring(root, encoding="unicode")
    if metadata is None:
        metadata = ET.SubElement(root, "metadata")
    metadata.append(_element(definitions))
    return ET.tostring(root, encoding="unicode")


def _element(definitions: list[str]) -> ET.Element:
    carrier = ET.Element(f"{{{NAMESPACE}}}checkpoints")
    for definition in definitions:
        ET.SubElement(carrier, f"{{{NAMESPACE}}}checkpoint").text = definition
    return carrier


def _carried(dom) -> list[str] | None:
    """The definitions the domain carries, or None when it carries none."""
    try:
        raw = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE, 0)
    except libvirt.libvirtError:
        return None         # VIR_ERR_NO_DOMAIN_METADATA: none carried
    return [c.text or "" for c in ET.fromstring(raw) if c.tag.endswith("checkpoint")]


def settle(dom) -> dict | None:
    """On the destination, once the VM is in its final state there: the
    checkpoints the move carried defined again (:func:`redefined`), then
    their metadata removed.  None when the domain carries none.  Never
    raises: a checkpoint that could not be defined is only a full backup
    next time."""
    definitions = _carried(dom)
    if definitions is None:
        return None
    outcome = redefined(dom, definitions)
    try:
        flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG if dom.isPersistent() else 0
        if dom.isActive():
            flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None, NAMESPACE, flags)
    except libvirt.libvirtError as exc:     # defined again alike next time
        log.warning("checkpoints_metadata_kept", vm=dom.UUIDString(),
                    error=exc.get_error_message())
    forget_everywhere(dom.UUIDString())
    return outcome


def redefined(dom, definitions: list[str]) -> dict:
    """``definitions`` (:func:`described`'s, the source's) defined again on
    ``dom``, each only if its bitmaps arrived whole.  A checkpoint whose
    parent was left out is defined without one: each checkpoint's bitmap
    records every write since its own point in time, whatever came before.
    Returns ``{carried: [names], dropped: {name: why}}``."""
    carried: list[str] = []
    dropped: dict[str, str] = {}
    try:
        running = dom.isActive()
    except libvirt.libvirtError:
        running = False
    for definition in definitions:
        try:
            root = ET.fromstring(definition)
        except ET.ParseError as exc:
            dropped[f"#{len(carried) + len(dropped)}"] = f"not a checkpoint: {exc}"
            continue
        name = root.findtext("name") or "?"
        if not running:
            dropped[name] = "the VM does not run here, so its bitmaps cannot be checked"
            continue
        parent = root.find("parent")
        if parent is not None and parent.findtext("name") not in carried:
            root.remove(parent)
        try:
            dom.checkpointCreateXML(ET.tostring(root, encoding="unicode"), REDEFINE)
            carried.append(name)
        except libvirt.libvirtError as exc:
            dropped[name] = " ".join((exc.get_error_message() or str(exc)).split())
    log.info("checkpoints_redefined", vm=dom.UUIDString(), carried=carried, dropped=dropped)
    return {"carried": carried, "dropped": dropped}
