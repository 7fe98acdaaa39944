"""What a host's ARP table says of a guest, for the addresses libvirt's own
sources do not give (engine/hypervisor/domain/networks.py asks them first).

An ARP table pairs a neighbour's MAC with an address, and knows neither the
name of the guest's interface nor the prefix of its subnet.  Promises:

- an address is named as libvirt names the VM's interface (its tap device,
  the domain's ``<target dev>``, as libvirt's ARP source does), or None:
  never a name made up from the MAC;
- its prefix is that of the directly connected route (no gateway) of the
  guest's host that holds it, when the guest's QEMU runs on this machine,
  else None: never 0 standing for "unknown";
- the tables are read from ``/proc/<pid>/net/`` of the guest's QEMU
  process, so from the network namespace of its libvirtd; a QEMU that is
  not on this machine (a remote hypervisor) gives empty tables, not errors.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
import xml.etree.ElementTree as ET

__all__ = ["arp_interfaces", "connected_prefix", "arp_prefixes", "tap_devices", "qemu_table"]


def arp_interfaces(arp: str, taps: dict[str, str]) -> list[tuple[str | None, dict]]:
    """The complete entries of an ARP table (``/proc/net/arp``'s text), in
    ``interfaceAddresses``' form, one ``(name, {hwaddr, addrs})`` per MAC:
    ``name`` from ``taps`` (MAC -> the domain's tap device), else None.
    An ARP table knows no prefix: each ``prefix`` is None."""
    found: dict[str, dict] = {}
    for line in arp.splitlines()[1:]:
        fields = line.split()
        # IP address, HW type, Flags, HW address, Mask, Device; 0x2: complete
        if len(fields) >= 6 and int(fields[2], 16) & 0x2:
            mac = fields[3].lower()
            entry = found.setdefault(mac, {"hwaddr": mac, "addrs": []})
            entry["addrs"].append({"addr": fields[0], "prefix": None})
    return [(taps.get(mac), entry) for mac, entry in found.items()]


def connected_prefix(route: str, addr: str) -> int | None:
    """The prefix length of the longest directly connected route (no
    gateway) of a routing table (``/proc/net/route``'s text) that holds
    ``addr``, else None: the subnet a neighbour found by ARP is on."""
    ip = ipaddress.ip_address(addr)
    best = None
    for line in route.splitlines()[1:]:
        fields = line.split()
        # Iface Destination Gateway Flags RefCnt Use Metric Mask ...; in host order
        if len(fields) < 8 or int(fields[3], 16) & _RTF_GATEWAY:
            continue
        try:
            network = ipaddress.ip_network(
                f"{_route_address(fields[1])}/{_route_address(fields[7])}", strict=False)
        except ValueError:
            continue
        if network.prefixlen and ip in network and (best is None or network.prefixlen > best):
            best = network.prefixlen
    return best


_RTF_GATEWAY = 0x2


def _route_address(field: str) -> str:
    """An address of ``/proc/net/route`` (hex, in the host's byte order)."""
    return socket.inet_ntoa(struct.pack("=I", int(field, 16)))


def arp_prefixes(found: list[dict], uuid: str) -> None:
    """Give the addresses found by ARP their subnet's prefix when the host
    of domain ``uuid`` is this machine and routes to it directly, else None
    (libvirt says 0: not known)."""
    unknown = [entry for entry in found if not entry["prefix"]]
    route = qemu_table(uuid, "route") if unknown else ""
    for entry in unknown:
        entry["prefix"] = connected_prefix(route, entry["addr"]) if route else None


def tap_devices(dom) -> dict[str, str]:
    """MAC -> the name libvirt gave the interface (``<target dev>``)."""
    try:
        devices = ET.fromstring(dom.XMLDesc(0)).find("devices")
    except Exception:       # libvirt's error, or XML it should not have sent
        return {}
    taps = {}
    for interface in devices.findall("interface") if devices is not None else ():
        mac, target = interface.find("mac"), interface.find("target")
        if mac is not None and target is not None and target.get("dev"):
            taps[mac.get("address", "").lower()] = target.get("dev")
    return taps


def qemu_table(uuid: str, name: str) -> str:
    """``/proc/<pid>/net/<name>`` of the QEMU process of domain ``uuid``
    (the network namespace of its libvirtd); "" when that process is not
    on this machine (a remote hypervisor)."""
    import psutil
    pid = _qemu_pids.get(uuid)
    if pid is None or not _is_qemu_of(pid, uuid):
        pid = next((p.pid for p in psutil.process_iter(["name"])
                    if "qemu" in (p.info["name"] or "") and _is_qemu_of(p.pid, uuid)), None)
        if pid is None:
            return ""
        _qemu_pids[uuid] = pid
    try:
        with open(f"/proc/{pid}/net/{name}") as f:
            return f.read()
    except OSError:
        return ""


_qemu_pids: dict[str, int] = {}


def _is_qemu_of(pid: int, uuid: str) -> bool:
    import psutil
    try:
        cmdline = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return False
    return "-uuid" in cmdline and uuid in cmdline
