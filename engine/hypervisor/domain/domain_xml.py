"""Domain XML for peerctl's VMs, built with ElementTree and read back.

User input (names, kernel command lines, paths) only ever becomes element
text or attribute values through ElementTree, which escapes it; nothing here
formats user input into an XML string.

A domain carries what peerctl knows about it beyond libvirt's own fields in
``<metadata>``, under :data:`NAMESPACE`: the peerctl host it belongs to,
``disk_gb`` and the image it was built from, so that the VM publisher reads
everything back from libvirt alone, and peers sharing one libvirtd (a test
cluster on qemu:///system) each see only their own VMs.

No request handler here: this module registers nothing.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from engine.hypervisor.domain.metadata_memo import forget_everywhere
from engine.hypervisor.domain.networks import interface_elements

__all__ = ["NAMESPACE", "DomainSpec", "domain_xml", "pool_xml", "volume_xml",
           "read_metadata", "write_metadata", "read_reboot_token", "record_reboot_token", "disk_paths",
           "domain_type", "ACCELERATORS", "seed_source", "SEED_DEV"]

NAMESPACE = "https://peerctl.dev/xmlns/vm/1"
SEED_DEV = "hdc"                # the seed CD-ROM's target
# The last reboot done, on the running domain only (live metadata).
REBOOT_NAMESPACE = "https://peerctl.dev/xmlns/reboot/1"
_PREFIX = "peerctl"
ET.register_namespace(_PREFIX, NAMESPACE)


@dataclass(frozen=True)
class DomainSpec:
    uuid: str
    name: str
    vcpus: int
    memory_mb: int
    disk_gb: int
    domain_type: str                    # "kvm", "qemu" or "test"
    disk_path: str | None = None        # a pool volume's path, qcow2
    image: str | None = None
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str | None = None
    console_log: str | None = None
    owner: str = ""                     # the peerctl host the VM belongs to
    extra_metadata: dict = field(default_factory=dict)
    networks: tuple = ()                # network names, one interface each
    offer: dict = field(default_factory=dict)   # this host's meaning of them
    seed_path: str | None = None        # a cloud-init NoCloud seed (raw ISO)


ACCELERATORS = ("kvm", "tcg")


def domain_type(conn_type: str, accel: str | None = None) -> str:
    """libvirt's ``<domain type>`` for a connection of ``conn.getType()``.

    QEMU guests use KVM when /dev/kvm exists, else TCG (``type='qemu'``).
    ``accel`` (a build argument) or the peer's ``PEERCTL_QEMU_ACCEL``
    environment variable force one: nested hosts where KVM runs firmware but
    not a Linux kernel at useful speed want ``tcg``.
    """
    if conn_type.upper() == "TEST":
        return "test"
    accel = accel or os.environ.get("PEERCTL_QEMU_ACCEL") or (
        "kvm" if os.path.exists("/dev/kvm") else "tcg")
    if accel not in ACCELERATORS:
        raise ValueError(f"unknown accelerator {accel!r} (want kvm or tcg)")
    return "kvm" if accel == "kvm" else "qemu"


def _sub(parent: ET.Element, tag: str, text=None, **attrs) -> ET.Element:
    element = ET.SubElement(parent, tag, {k: str(v) for k, v in attrs.items()})
    if text is not None:
        element.text = str(text)
    return element


def _metadata(spec: DomainSpec) -> ET.Element:
    vm = ET.Element(f"{{{NAMESPACE}}}vm")
    values = {"host": spec.owner, "disk_gb": spec.disk_gb, "image": spec.image or "",
              **({"networks": ",".join(spec.networks)} if spec.networks else {}),
              **spec.extra_metadata}
    for key, value in values.items():
        _sub(vm, f"{{{NAMESPACE}}}{key}", value)
    return vm


def domain_xml(spec: DomainSpec) -> str:
    domain = ET.Element("domain", type=spec.domain_type)
    _sub(domain, "name", spec.name)
    _sub(domain, "uuid", spec.uuid)
    _sub(domain, "memory", spec.memory_mb, unit="MiB")
    _sub(domain, "vcpu", spec.vcpus)
    _sub(domain, "metadata").append(_metadata(spec))

    os_element = _sub(domain, "os")
    _sub(os_element, "type", "hvm", arch="x86_64")
    if spec.kernel:
        _sub(os_element, "kernel", spec.kernel)
        if spec.initrd:
            _sub(os_element, "initrd", spec.initrd)
        if spec.cmdline:
            _sub(os_element, "cmdline", spec.cmdline)
    else:
        _sub(os_element, "boot", dev="hd")

    features = _sub(domain, "features")
    _sub(features, "acpi")          # ACPI shutdown needs it
    _sub(features, "apic")
    _sub(domain, "on_poweroff", "destroy")
    _sub(domain, "on_reboot", "restart")
    _sub(domain, "on_crash", "destroy")

    devices = _sub(domain, "devices")
    if spec.disk_path:
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type="qcow2")
        _sub(disk, "source", file=spec.disk_path)
        _sub(disk, "target", dev="vda", bus="virtio")
    if spec.seed_path:
        _seed_cdrom(devices, spec.seed_path, spec.domain_type)
    for interface in interface_elements(spec.uuid, list(spec.networks), spec.offer,
                                        virtio=spec.domain_type != "test",
                                        macs=spec.extra_metadata.get("macs")):
        devices.append(interface)
    # A pty serial console, logged by virtlogd: QEMU never opens the log file
    # itself, so the state directory need not be reachable by its user.
    serial = _sub(devices, "serial", type="pty")
    if spec.console_log:
        _sub(serial, "log", file=spec.console_log, append="off")
    _sub(serial, "target", port=0)
    console = _sub(devices, "console", type="pty")
    _sub(console, "target", type="serial", port=0)
    if spec.domain_type != "test":
        # The guest agent's channel: addresses from the agent when it runs.
        channel = _sub(devices, "channel", type="unix")
        _sub(channel, "target", type="virtio", name="org.qemu.guest_agent.0")
        _sub(devices, "memballoon", model="none")
    # No <graphics>: these are headless servers (and type='none' is invalid).
    return ET.tostring(domain, encoding="unicode")


def _seed_cdrom(devices: ET.Element, path: str, dtype: str) -> None:
    """The NoCloud seed as a read-only CD-ROM (IDE: every x86 machine type
    QEMU defaults to has it, and guests find it by its ``cidata`` label)."""
    cdrom = _sub(devices, "disk", type="file", device="cdrom")
    if dtype != "test":
        _sub(cdrom, "driver", name="qemu", type="raw")
    _sub(cdrom, "source", file=path)
    _sub(cdrom, "target", dev=SEED_DEV, bus="ide")
    _sub(cdrom, "readonly")


def seed_source(root: ET.Element) -> ET.Element | None:
    """The ``<source>`` of the seed CD-ROM in a parsed domain, or None."""
    for disk in root.findall("./devices/disk"):
        target = disk.find("target")
        if disk.get("device") == "cdrom" and target is not None \
                and target.get("dev") == SEED_DEV:
            return disk.find("source")
    return None


def read_metadata(dom, strict: bool = False) -> dict:
    """The peerctl metadata of a libvirt domain, or {} when it has none
    (or, unless ``strict``, when libvirt failed to say: strict raises then)."""
    import libvirt
    try:
        raw = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NAMESPACE, 0)
    except libvirt.libvirtError as exc:
        if strict and exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN_METADATA:
            raise
        return {}
    values = {}
    for child in ET.fromstring(raw):
        values[child.tag.rsplit("}", 1)[-1]] = child.text or ""
    if "disk_gb" in values:
        try:
            values["disk_gb"] = int(values["disk_gb"])
        except ValueError:
            values["disk_gb"] = 0
    return values


def write_metadata(dom, changes: dict) -> dict:
    """Change the peerctl metadata of ``dom`` (a value of None drops the
    field), in its persistent definition and, while it runs, live; returns
    the metadata as now written."""
    import libvirt
    values = {key: value for key, value in {**read_metadata(dom), **changes}.items()
              if value is not None}
    vm = ET.Element("vm")          # libvirt puts it in NAMESPACE itself
    for key, value in values.items():
        _sub(vm, key, value)
    flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
    if dom.isActive():
        flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
    try:
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, ET.tostring(vm, encoding="unicode"),
                        _PREFIX, NAMESPACE, flags)
    finally:
        forget_everywhere(dom.UUIDString())
    return values


def disk_paths(xml: str) -> list[str]:
    """Source files of a domain's disks."""
    root = ET.fromstring(xml)
    return [source.get("file") for source in root.findall("./devices/disk/source")
            if source.get("file")]


def pool_xml(name: str, path: str) -> str:
    pool = ET.Element("pool", type="dir")
    _sub(pool, "name", name)
    _sub(_sub(pool, "target"), "path", path)
    return ET.tostring(pool, encoding="unicode")


def volume_xml(name: str, capacity: int, fmt: str, *, backing_path: str | None = None,
               backing_format: str | None = None) -> str:
    """A volume of ``capacity`` bytes, allocated on demand; with a backing
    store it is a copy-on-write overlay of that file.  A qcow2 volume is
    version 3 (compat 1.1), which dirty bitmaps need (backups' checkpoints)."""
    volume = ET.Element("volume")
    _sub(volume, "name", name)
    _sub(volume, "capacity", capacity, unit="bytes")
    _sub(volume, "allocation", 0, unit="bytes")
    target = _sub(volume, "target")
    _sub(target, "format", type=fmt)
    if fmt == "qcow2":
        _sub(target, "compat", "1.1")       # version 3: it can carry checkpoints
    if backing_path:
        backing = _sub(volume, "backingStore")
        _sub(backing, "path", backing_path)
        _sub(backing, "format", type=backing_format or "raw")
    return ET.tostring(volume, encoding="unicode")


def record_reboot_token(dom, token: str) -> None:
    """Leave ``<reboot token="..."/>`` on the running domain (live metadata:
    it ends with this run of the domain)."""
    import libvirt
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                    ET.tostring(ET.Element("reboot", token=token), encoding="unicode"),
                    _PREFIX, REBOOT_NAMESPACE, libvirt.VIR_DOMAIN_AFFECT_LIVE)


def read_reboot_token(dom) -> str | None:
    """The token of the last reboot of this run of the domain, if any."""
    import libvirt
    try:
        raw = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, REBOOT_NAMESPACE,
                           libvirt.VIR_DOMAIN_AFFECT_LIVE)
    except libvirt.libvirtError:
        return None
    return ET.fromstring(raw).get("token")
