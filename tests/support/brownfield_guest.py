"""A domain made by hand on a real libvirtd, as an administrator would have
made it before peerctl came: the QEMU tier's brownfield guest.

:func:`make_brownfield` talks to libvirt only (no peerctl code): a dir
storage pool ``brownfield`` of its own, a qcow2 volume in it (version 3,
``compat 1.1``, so that backups can checkpoint it) made with libvirt's
``storageVolCreateXML``, and a persistent domain (``defineXML``) booting the
tier's busybox guest (:mod:`tests.support.qemu_guest`: its kernel and
initramfs, directly) with that volume as its virtio disk, optionally a virtio
interface on a libvirt network, and a pty serial console logged to a file
of the guest's directory.  Once the guest's shell is up, a line typed on
its console starts a background loop printing ``PEERCTL-UPTIME <seconds>``
(the guest's ``/proc/uptime``) every second, for ever: a guest that
rebooted prints nothing more (the loop was typed, not booted), one that
ran on prints ever larger values, wherever its console is logged now.

:func:`remove_brownfield` undoes all of it on every daemon given, whatever
state a failed test left it in; :func:`uptimes` and :func:`fresh_uptime`
read the counter back from a console log.
"""
from __future__ import annotations

import os
import re
import shutil
import uuid as uuidlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import libvirt

from tests.support import qemu_guest, wait_until

__all__ = ["Brownfield", "make_brownfield", "remove_brownfield", "uptimes", "fresh_uptime",
           "POOL", "UPTIME_MARKER"]

POOL = "brownfield"
UPTIME_MARKER = "PEERCTL-UPTIME"
MiB = 1 << 20
# Typed on the guest's console, run by its shell in the background.
_COUNTER = (f"(while true; do echo {UPTIME_MARKER} $(cut -d' ' -f1 /proc/uptime); "
            f"sleep 1; done) &\n")
# The end of busybox's banner, then the shell's prompt (``/ # ``).
_PROMPT = re.compile(r"built-in commands\.\s+\S* # ")
# Complete lines only: the end of a log may hold half a line.
_READING = re.compile(UPTIME_MARKER + r" (\d+\.\d+)\r?\n")


@dataclass
class Brownfield:
    """The hand-made guest: ``name``, ``uuid``, ``disk`` (its volume's
    path), ``console_log`` (where its console is logged on its first host)
    and ``dir`` (the pool's and the guest's files)."""
    name: str
    uuid: str
    disk: str
    console_log: str
    dir: str


def _sub(parent, tag, text=None, **attrs):
    element = ET.SubElement(parent, tag, attrs)
    if text is not None:
        element.text = str(text)
    return element


def _pool_xml(path: str) -> str:
    pool = ET.Element("pool", type="dir")
    _sub(pool, "name", POOL)
    _sub(_sub(pool, "target"), "path", path)
    return ET.tostring(pool, encoding="unicode")


def _volume_xml(name: str, capacity: int) -> str:
    volume = ET.Element("volume")
    _sub(volume, "name", name)
    _sub(volume, "capacity", capacity, unit="bytes")
    target = _sub(volume, "target")
    _sub(target, "format", type="qcow2")
    _sub(target, "compat", "1.1")
    return ET.tostring(volume, encoding="unicode")


def _domain_xml(guest: Brownfield, boot: dict, accel: str, network: str | None) -> str:
    domain = ET.Element("domain", type=accel)
    _sub(domain, "name", guest.name)
    _sub(domain, "uuid", guest.uuid)
    _sub(domain, "memory", 128, unit="MiB")     # the Debian cloud kernel wants 128
    _sub(domain, "vcpu", 1)
    os_element = _sub(domain, "os")
    _sub(os_element, "type", "hvm", arch="x86_64")
    _sub(os_element, "kernel", boot["kernel"])
    _sub(os_element, "initrd", boot["initrd"])
    _sub(os_element, "cmdline", boot["cmdline"])
    features = _sub(domain, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    devices = _sub(domain, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2")
    _sub(disk, "source", file=guest.disk)
    _sub(disk, "target", dev="vda", bus="virtio")
    if network:
        interface = _sub(devices, "interface", type="network")
        _sub(interface, "source", network=network)
        _sub(interface, "model", type="virtio")
    serial = _sub(devices, "serial", type="pty")
    _sub(serial, "log", file=guest.console_log, append="off")
    _sub(serial, "target", port="0")
    _sub(_sub(devices, "console", type="pty"), "target", type="serial", port="0")
    return ET.tostring(domain, encoding="unicode")


def make_brownfield(uri: str, parent: str, name: str, network: str | None,
                    disk_mb: int = 64, boot_timeout: float = 120.0) -> Brownfield:
    """The guest, defined and running on the libvirtd at ``uri``, its files
    under ``parent`` (a directory QEMU's user can reach), its uptime counter
    printing.  What it made is removed again when it fails."""
    directory = os.path.join(parent, f"brownfield-{name}")
    os.makedirs(directory, mode=0o755, exist_ok=True)
    os.chmod(directory, 0o755)
    guest = Brownfield(name, str(uuidlib.uuid4()), "", os.path.join(directory, "console.log"),
                       directory)
    boot = qemu_guest.guest_args(qemu_guest.GUEST_DIR, directory)
    conn = libvirt.open(uri)
    try:
        pool = conn.storagePoolDefineXML(_pool_xml(os.path.join(directory, "pool")), 0)
        pool.build(0)
        pool.create(0)
        guest.disk = pool.createXML(_volume_xml(f"{name}-disk0.qcow2", disk_mb * MiB), 0).path()
        accel = "kvm" if qemu_guest.LINUX_ACCEL == "kvm" else "qemu"
        dom = conn.defineXML(_domain_xml(guest, boot, accel, network))
        dom.create()
        # Its shell's prompt, not only the ready marker: what is typed
        # before the shell reads its terminal is lost.
        wait_until(lambda: _tail(guest.console_log, None), _PROMPT.search,
                   timeout=boot_timeout, interval=0.2,
                   what="the brownfield guest's shell on its console")
        _start_counter(conn, guest)
    except BaseException:
        conn.close()
        remove_brownfield([uri], guest)
        raise
    conn.close()
    return guest


def _start_counter(conn, guest: Brownfield) -> None:
    """The uptime loop, typed on the guest's serial console; the console is
    let go once the loop prints (a stream aborted at once may drop what was
    sent)."""
    stream = conn.newStream(0)
    conn.lookupByUUIDString(guest.uuid).openConsole(None, stream,
                                                    libvirt.VIR_DOMAIN_CONSOLE_FORCE)
    try:
        stream.send(_COUNTER.encode())
        fresh_uptime(guest.console_log)
    finally:
        stream.abort()


def _tail(path: str, size: int | None = 800) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-size:] if size else f.read()
    except FileNotFoundError:
        return ""


def uptimes(path: str, start: int = 0) -> list[float]:
    """The counter's readings in the console log at ``path``, from byte
    ``start`` on."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    return [float(value) for value in _READING.findall(text)]


def fresh_uptime(path: str, timeout: float = 30.0) -> float:
    """The first reading the guest prints into the log at ``path`` from now
    on (never one printed before this call)."""
    try:
        start = os.path.getsize(path)
    except FileNotFoundError:
        start = 0
    try:
        found = wait_until(lambda: uptimes(path, start), bool, timeout=timeout, interval=0.2,
                           what=f"a new uptime reading in {path}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it ends {_tail(path)!r}") from None
    return found[0]


def remove_brownfield(uris: list[str], guest: Brownfield) -> None:
    """The guest's domain (destroyed, undefined) and volumes (its own, and
    ``<uuid>*`` in every pool) on each daemon at ``uris``, its pool and its
    directory: gone, whatever was left of them."""
    for uri in uris:
        try:
            conn = libvirt.open(uri)
        except libvirt.libvirtError:
            continue
        try:
            _remove_domain(conn, guest.uuid)
            _remove_volumes(conn, guest.uuid)
            _remove_pool(conn)
        finally:
            conn.close()
    shutil.rmtree(guest.dir, ignore_errors=True)


def _remove_domain(conn, uuid: str) -> None:
    try:
        dom = conn.lookupByUUIDString(uuid)
        if dom.isActive():
            dom.destroy()
        if dom.isPersistent():
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA
                              | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
    except libvirt.libvirtError:
        pass                    # not there


def _remove_volumes(conn, uuid: str) -> None:
    for pool in conn.listAllStoragePools(0):
        try:
            if not pool.isActive():
                continue
            pool.refresh(0)
            for vol in pool.listAllVolumes(0):
                if vol.name().startswith(uuid) or pool.name() == POOL:
                    vol.delete(0)
        except libvirt.libvirtError:
            pass


def _remove_pool(conn) -> None:
    try:
        pool = conn.storagePoolLookupByName(POOL)
    except libvirt.libvirtError:
        return
    try:
        if pool.isActive():
            pool.destroy()
        pool.undefine()
    except libvirt.libvirtError:
        pass
