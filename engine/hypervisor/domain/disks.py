"""A domain's disks as every copy of them (a move, a backup, a replica
update, a snapshot) sees them: file-backed disks only (not CD-ROMs, not
the seed), each with its format, capacity and backing file as its pool's
libvirt reports them; and which states mean a QEMU process holds them."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import libvirt

from engine.errors import RequestError

__all__ = ["disks_of", "ACTIVE"]

ACTIVE = ("running", "paused")      # a QEMU process holds the VM


def disks_of(conn, root: ET.Element) -> list[dict]:
    """``[{dev, path, format, capacity, backing}]`` of the domain XML ``root``."""
    disks = []
    for disk in root.findall("./devices/disk"):
        source, target = disk.find("source"), disk.find("target")
        if disk.get("device", "disk") != "disk" or source is None or target is None \
                or not source.get("file"):
            continue
        driver = disk.find("driver")
        path = source.get("file")
        try:
            vol = conn.storageVolLookupByPath(path)
            capacity = vol.info()[1]
            backing = ET.fromstring(vol.XMLDesc(0)).findtext("./backingStore/path")
        except libvirt.libvirtError as exc:
            raise RequestError(f"disk {path}: {exc.get_error_message()}") from None
        disks.append({"dev": target.get("dev"), "path": path,
                      "format": driver.get("type") if driver is not None else "raw",
                      "capacity": capacity, "backing": backing})
    return disks
