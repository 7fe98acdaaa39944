"""Domains peerctl did not make: which they are, what they hold, and
whether peerctl can take one over in place.

A domain is **foreign** when it carries no peerctl metadata (no
``<peerctl:vm>`` under ``<metadata>``): defined by hand, by virt-manager,
by another tool, or let go by ``unmanage``.  A domain with peerctl metadata
naming another host (peers sharing one libvirtd) is that peer's, not
foreign.

Promises:
- :func:`scan` reads every domain's peerctl metadata once: a caller that
  needs the foreign domains, what they hold and the host's own domains in
  one go (the peer's stats tick: host record and accounting) passes the
  scan along instead of reading them again (``scanned=``); without one,
  each function reads libvirt now;
- :func:`is_foreign` and :func:`foreign_record` only read: nothing here
  changes a foreign domain;
- :func:`usage` is what the host's foreign domains hold, for placement's
  ``reserved``: the vCPUs and current memory of each running one, and the
  virtual size of every foreign disk file that lies on the file system of
  the peer's state directory (the one DISK_GB measures);
- :func:`foreign_record`'s ``memory_mb`` is the domain's current memory,
  the figure :func:`usage` counts (not its maximum, which adopting it
  claims: :func:`survey`);
- :func:`survey` says, for one domain, everything adopting it in place
  would record (size, disks, networks, MACs) and every reason it cannot be
  adopted, one line each: another manager's metadata, disks peerctl cannot
  move or back up, interfaces on no network this host offers, devices
  that pin it to this machine, a transient domain.
"""
from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET

import libvirt

from engine.hypervisor.domain.domain_xml import read_metadata
from engine.hypervisor.domain.records import vm_state

__all__ = ["scan", "is_foreign", "foreign_domains", "foreign_record", "usage", "survey",
           "other_manager", "MANAGERS"]

# Metadata namespaces of other managers, by the start of their URI: a domain
# carrying one belongs to that manager, and peerctl never adopts it.
MANAGERS = {
    "http://openstack.org/xmlns/libvirt/nova/": ("Nova", "nova:instance"),
    "http://ovirt.org/vm/": ("oVirt", "ovirt-vm:vm"),
    "http://kubevirt.io": ("KubeVirt", "kubevirt"),
    "http://cloudstack.apache.org": ("CloudStack", "cloudstack"),
}
_GiB = 1 << 30


def is_foreign(dom) -> bool:
    """No peerctl metadata at all."""
    return not read_metadata(dom)


def scan(conn, memo=None) -> list[tuple]:
    """``[(dom, metadata)]`` for every domain of the connection, its peerctl
    metadata read once (``{}``: foreign); those undefined meanwhile are
    skipped.  ``memo``: a :class:`~engine.hypervisor.domain.metadata_memo.MetadataMemo`
    of this host, which answers for the domains no event said changed (the
    dicts it gives are shared: not to be changed)."""
    found, uuids = [], []
    for dom in conn.listAllDomains(0):
        try:
            if memo is None:
                found.append((dom, read_metadata(dom)))
            else:
                uuids.append(dom.UUIDString())
                found.append((dom, _remembered(dom, uuids[-1], memo)))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
    if memo is not None:
        memo.known(uuids)
    return found


def _remembered(dom, uuid: str, memo) -> dict:
    """``dom``'s metadata from ``memo``; what libvirt failed to tell is {}
    as :func:`read_metadata` has it, and not remembered."""
    try:
        return memo.read(uuid, lambda: read_metadata(dom, strict=True))
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            raise
        return {}


def foreign_domains(conn, scanned: list[tuple] | None = None) -> list:
    """The connection's foreign domains (those undefined meanwhile are
    skipped), as ``scanned`` (:func:`scan`) found them, else read now."""
    return [dom for dom, metadata in (scan(conn) if scanned is None else scanned)
            if not metadata]


def _root(dom, inactive: bool = True) -> ET.Element:
    return ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0))


def other_manager(root: ET.Element) -> str | None:
    """``Nova (<nova:instance>)`` when the domain carries a known manager's
    metadata, else None."""
    metadata = root.find("metadata")
    for child in list(metadata) if metadata is not None else []:
        namespace = child.tag[1:].split("}", 1)[0] if child.tag.startswith("{") else ""
        for prefix, (manager, element) in MANAGERS.items():
            if namespace.startswith(prefix):
                return f"{manager} (<{element}>)"
    return None


def _disk_capacity(conn, path: str) -> int | None:
    """Virtual size in bytes of a disk file libvirt knows as a volume; None
    when it is in no storage pool."""
    try:
        return conn.storageVolLookupByPath(path).info()[1]
    except libvirt.libvirtError:
        return None


def _files(root: ET.Element) -> list[str]:
    return [source.get("file") for disk in root.findall("./devices/disk")
            if disk.get("device", "disk") == "disk"
            for source in [disk.find("source")] if source is not None and source.get("file")]


def foreign_record(host_name: str, dom, offer: dict | None = None) -> dict:
    """What ``foreign/<host>/<uuid>`` and ``vmlist --all`` show of a foreign
    domain: the fields of a VM record, with ``managed: false``, the other
    manager when one owns it, and ``problems``: why it cannot be adopted
    here (:func:`survey` against the host's ``offer`` of networks)."""
    _state, _max_kib, memory_kib, vcpus, _cpu = dom.info()
    root = _root(dom)
    conn = dom.connect()
    capacity = sum(_disk_capacity(conn, path) or 0 for path in _files(root))
    return {"host": host_name, "name": dom.name(), "uuid": dom.UUIDString(),
            "state": vm_state(dom), "vcpus": vcpus, "memory_mb": memory_kib // 1024,
            "disk_gb": math.ceil(capacity / _GiB), "ha": "none", "ip": None,
            "managed": False, "manager": other_manager(root),
            "problems": survey(conn, dom, offer or {})["problems"]}


def usage(conn, state_dir: str, excluded: set[str] = frozenset(),
          scanned: list[tuple] | None = None) -> dict:
    """``{VCPU, MEMORY_MB, DISK_GB}`` the foreign domains hold (see the
    module's promises), as ``scanned`` found them, else read now; domains
    whose uuid is in ``excluded`` (accounted by an allocation of their own:
    being adopted or let go) are left out."""
    held = {"VCPU": 0, "MEMORY_MB": 0, "DISK_GB": 0}
    try:
        device = os.stat(state_dir).st_dev
    except OSError:
        device = None
    disk_bytes = 0
    for dom in foreign_domains(conn, scanned):
        try:
            if dom.UUIDString() in excluded:
                continue
            if dom.isActive():
                _state, _max, memory_kib, vcpus, _cpu = dom.info()
                held["VCPU"] += vcpus
                held["MEMORY_MB"] += memory_kib // 1024
            for path in _files(_root(dom)):
                try:
                    if device is None or os.stat(path).st_dev != device:
                        continue
                except OSError:
                    continue
                disk_bytes += _disk_capacity(conn, path) or os.stat(path).st_size
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
    held["DISK_GB"] = math.ceil(disk_bytes / _GiB)
    return held


def _offered_as(offer: dict, kind: str, source: str | None) -> str | None:
    """The cluster network name this host offers as ``kind`` ``source``."""
    for name, where in sorted(offer.items()):
        if where["kind"] == kind and where["source"] == source:
            return name
    return None


def survey(conn, dom, offer: dict) -> dict:
    """Everything adopting ``dom`` in place would record, and why it cannot:
    ``{uuid, name, state, vcpus, memory_mb, disk_gb, disks: [{dev, path,
    format, capacity}], networks: [name], macs: [mac], problems: [line]}``."""
    root = _root(dom)
    _state, max_kib, _mem, vcpus, _cpu = dom.info()
    problems = []
    if read_metadata(dom):
        problems.append("it is already peerctl's")
    manager = other_manager(root)
    if manager:
        problems.append(f"it carries {manager} metadata: another manager owns it")
    if not dom.isPersistent():
        problems.append("it is transient (not defined): define it persistently first")
    disks = []
    for disk in root.findall("./devices/disk"):
        device = disk.get("device", "disk")
        target = (disk.find("target") if disk.find("target") is not None
                  else ET.Element("target")).get("dev") or "?"
        source = disk.find("source")
        where = None
        if source is not None:
            where = source.get("file") or source.get("dev") or source.get("name") \
                or source.get("volume")
        if device in ("cdrom", "floppy"):
            if where:
                problems.append(f"{device} {target} holds {where}: a move would not take "
                                f"it along (eject it first)")
            continue
        if device != "disk":
            problems.append(f"disk {target} is a {device}: peerctl cannot move or back it up")
            continue
        if disk.get("type", "file") != "file" or not (source is not None and source.get("file")):
            problems.append(f"disk {target} ({where or 'no source'}) is of type "
                            f"{disk.get('type')}: peerctl moves and backs up file disks only")
            continue
        driver = disk.find("driver")
        fmt = driver.get("type") if driver is not None and driver.get("type") else "raw"
        if fmt not in ("qcow2", "raw"):
            problems.append(f"disk {target} ({where}) is {fmt}: peerctl moves and backs up "
                            f"qcow2 and raw disks only")
            continue
        capacity = _disk_capacity(conn, where)
        if capacity is None:
            problems.append(f"disk {target} ({where}) is in no libvirt storage pool: "
                            f"peerctl cannot move or back it up (add its directory as a pool)")
            continue
        disks.append({"dev": target, "path": where, "format": fmt, "capacity": capacity})
    networks, macs = [], []
    for interface in root.findall("./devices/interface"):
        kind = interface.get("type")
        source = interface.find("source")
        mac = interface.find("mac")
        address = mac.get("address") if mac is not None else None
        label = f"interface {address or len(networks)}"
        if kind not in ("network", "bridge") or source is None:
            problems.append(f"{label} is of type {kind}: peerctl moves interfaces on "
                            f"networks and bridges only")
            continue
        name = _offered_as(offer, kind, source.get(kind))
        if name is None:
            problems.append(f"{label} is on {kind} {source.get(kind)!r}, which this host "
                            f"offers as no cluster network")
            continue
        if not address:
            problems.append(f"{label} has no MAC address")
            continue
        networks.append(name)
        macs.append(address.lower())
    for tag, what in (("hostdev", "a host device"), ("filesystem", "a host directory")):
        if root.find(f"./devices/{tag}") is not None:
            problems.append(f"it uses {what} ({tag}): it cannot leave this machine")
    return {"uuid": dom.UUIDString(), "name": dom.name(), "state": vm_state(dom),
            "vcpus": vcpus, "memory_mb": max_kib // 1024,
            "disk_gb": math.ceil(sum(d["capacity"] for d in disks) / _GiB),
            "disks": disks, "networks": networks, "macs": macs, "problems": problems}
