"""The networks a host offers its VMs, the interfaces a VM has on them, and
the addresses its guest got.

A *network* is a name the cluster agrees on (``default``, ``lan``).  Each
host says what the name means there, in its configuration
(:func:`parse_offer`): ``NAME`` is the libvirt network of that name, and
``NAME=BRIDGE`` a Linux bridge.  A peer offers the networks that exist
(:func:`offered`: a libvirt network must be defined and active; a bridge is
taken on trust), publishes them in its host record, and gives its placement
provider one trait per network (:func:`network_trait`), so that a VM is only
placed where its networks are.

Promises:
- interface ``i`` of VM ``uuid`` always has the MAC :func:`mac_for` (uuid,
  i), or, for a VM adopted with MACs of its own, the ``i``-th of those
  (its metadata's ``macs``; :func:`macs_of`): a VM keeps its MACs, and
  with DHCP its addresses, across reboot, migration and rebuild;
- the domain XML's ``<interface>`` elements are made by
  :func:`interface_elements` from the names and this host's meaning of them,
  and :func:`retarget` remakes them for another host's meaning;
- :func:`guest_addresses` asks libvirt, in this order, the DHCP leases of
  a libvirt network, the guest agent, then the host's ARP table (read from
  the namespace of the guest's QEMU process when libvirt cannot), and
  returns the first answer that has addresses, as
  ``[{interface, mac, addr, prefix}]`` (IPv4 first); loopback and
  link-local addresses are left out; ``interface`` is libvirt's name for
  the VM's interface (``vnet0``) or None, ``prefix`` the real prefix length
  or None (what an ARP table tells: engine/hypervisor/domain/arp.py).
"""
from __future__ import annotations

import hashlib
import ipaddress
import re
import xml.etree.ElementTree as ET

from engine.errors import UsageError
from engine.hypervisor.domain.arp import arp_interfaces, arp_prefixes, qemu_table, tap_devices
from engine.placement.traits import NETWORK_TRAIT_PREFIX   # said in words in refusals

__all__ = ["parse_offer", "parse_names", "offered", "network_trait", "mac_for", "macs_of",
           "interface_elements", "retarget", "guest_addresses", "NONE",
           "NETWORK_TRAIT_PREFIX"]

NONE = "none"                   # `boot --network none`: no interface at all
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_BRIDGE = re.compile(r"[A-Za-z0-9_.-]{1,15}\Z")        # IFNAMSIZ - 1


def _check_name(name: str, where: str) -> str:
    if not _NAME.match(name) or name == NONE:
        raise UsageError(f"bad network name {name!r} {where} (letters, digits, '_', '.', "
                         "'-'; at most 64; not 'none')")
    return name


def parse_names(values, where: str = "") -> list[str]:
    """``--network`` values (repeatable, each may be comma-separated) as a
    list of names; ``none`` alone means no interface.  Duplicates are kept:
    two interfaces on one network is a valid wish."""
    names = [part.strip() for value in values or [] for part in value.split(",")
             if part.strip()]
    if names == [NONE]:
        return []
    return [_check_name(name, where) for name in names]


def parse_offer(text: str, where: str = "") -> dict[str, dict]:
    """A host's ``networks`` setting, ``default, lan=br0``, as
    ``{name: {"kind": "network"|"bridge", "source": ...}}``; empty or
    ``none`` offers nothing."""
    offer = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item or item == NONE:
            continue
        name, _, bridge = item.partition("=")
        name = _check_name(name.strip(), where)
        if bridge:
            bridge = bridge.strip()
            if not _BRIDGE.match(bridge):
                raise UsageError(f"bad bridge {bridge!r} for network {name!r} {where}")
            offer[name] = {"kind": "bridge", "source": bridge}
        else:
            offer[name] = {"kind": "network", "source": name}
    return offer


def offered(conn, offer: dict[str, dict]) -> tuple[dict[str, dict], list[str]]:
    """The part of ``offer`` that this hypervisor has now, and why each
    other network is left out (one line each)."""
    import libvirt
    have, missing = {}, []
    for name, where in sorted(offer.items()):
        if where["kind"] == "bridge":
            have[name] = where
            continue
        try:
            net = conn.networkLookupByName(where["source"])
            if net.isActive():
                have[name] = where
            else:
                missing.append(f"libvirt network {where['source']!r} is not active")
        except libvirt.libvirtError as exc:
            missing.append(f"libvirt network {where['source']!r}: {exc.get_error_message()}")
    return have, missing


def network_trait(name: str) -> str:
    """The placement trait of hosts offering network ``name``."""
    return NETWORK_TRAIT_PREFIX + re.sub(r"[^A-Z0-9]", "_", name.upper())


def mac_for(uuid: str, index: int) -> str:
    """Interface ``index``'s MAC: locally administered, unicast, 40 bits
    from the VM's uuid and the index (QEMU's 52: first octet)."""
    digest = hashlib.sha256(f"{uuid}/{index}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x52, *digest[:5]))


def macs_of(uuid: str, count: int, recorded: str | None = None) -> list[str]:
    """The MACs of a VM's ``count`` interfaces: those ``recorded`` in its
    metadata (comma-separated: an adopted VM keeps its own), else derived
    from its uuid."""
    own = [mac for mac in (recorded or "").split(",") if mac]
    return [own[index] if index < len(own) else mac_for(uuid, index)
            for index in range(count)]


def interface_elements(uuid: str, names: list[str], offer: dict[str, dict],
                       virtio: bool = True, macs: str | None = None) -> list[ET.Element]:
    """``<interface>`` elements for networks ``names`` as this host offers
    them (a name it does not offer raises KeyError); ``macs``: the VM's
    recorded MACs (:func:`macs_of`)."""
    elements = []
    addresses = macs_of(uuid, len(names), macs)
    for index, name in enumerate(names):
        where = offer[name]
        interface = ET.Element("interface", type=where["kind"])
        ET.SubElement(interface, "mac", address=addresses[index])
        ET.SubElement(interface, "source", {where["kind"]: where["source"]})
        if virtio:
            ET.SubElement(interface, "model", type="virtio")
        elements.append(interface)
    return elements


def retarget(devices: ET.Element, uuid: str, names: list[str], offer: dict[str, dict],
             virtio: bool = True, macs: str | None = None) -> None:
    """Replace the interfaces in ``devices`` by this host's for ``names``
    (same MACs): a move to a host where a network is a bridge, not a
    libvirt network, or the other way round.  What the guest sees of each
    interface (its model, PCI address, driver, boot order, ROM, MTU) is
    kept from the one it replaces: a live move must not change the
    machine's devices (an adopted VM's NIC may be an e1000)."""
    old = devices.findall("interface")
    for element in old:
        devices.remove(element)
    for index, element in enumerate(interface_elements(uuid, names, offer, virtio, macs)):
        if index < len(old):
            for child in old[index]:
                if child.tag in _GUEST_SIDE:
                    for mine in element.findall(child.tag):
                        element.remove(mine)
                    element.append(child)
        devices.append(element)


# An interface's elements the guest sees, kept by :func:`retarget`.
_GUEST_SIDE = ("model", "address", "driver", "rom", "boot", "mtu")


_SOURCES = (("lease", "VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE"),
            ("agent", "VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT"),
            ("arp", "VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP"))


def guest_addresses(dom, macs: list[str] | None = None) -> list[dict]:
    """The guest's addresses from the first source that has any; [] when
    none does (or the domain is not running).  ``macs``: keep only these
    interfaces' addresses (the agent also reports the guest's loopback).

    ``interface`` is the name libvirt gives the VM's interface (its tap
    device, ``vnet0``), or None when nobody can tell; ``prefix`` is the
    address's real prefix length, or None when it is not known: an ARP
    table has none, so it is the prefix of the route that reaches the
    address from the guest's host, when that host is this machine."""
    import libvirt
    wanted = {mac.lower() for mac in macs} if macs else None
    for source, constant in _SOURCES:
        flag = getattr(libvirt, constant, None)
        if flag is None:
            continue
        try:
            answer = dom.interfaceAddresses(flag, 0) or {}
        except libvirt.libvirtError:
            continue            # no network leases, no agent, not running...
        found = _flatten(answer.items(), wanted)
        if found:
            if source == "arp":
                arp_prefixes(found, dom.UUIDString())
            return found
    if wanted:
        # libvirt's own ARP source fails on some kernels ("wrong nlmsg
        # len"): read the ARP table of the guest's QEMU process instead.
        arp = qemu_table(dom.UUIDString(), "arp")
        if not arp:
            return []
        found = _flatten(arp_interfaces(arp, tap_devices(dom)), wanted)
        arp_prefixes(found, dom.UUIDString())
        return found
    return []


def _flatten(interfaces, wanted: set | None) -> list[dict]:
    """``[{interface, mac, addr, prefix}]`` of ``(name, {hwaddr, addrs})``
    pairs, IPv4 first; ``prefix`` None when the source gave none."""
    found = []
    for interface, values in interfaces:
        mac = (values.get("hwaddr") or "").lower()
        if wanted is not None and mac not in wanted:
            continue
        for entry in values.get("addrs") or []:
            addr = entry.get("addr")
            try:
                ip = ipaddress.ip_address(addr)
            except (TypeError, ValueError):
                continue
            if ip.is_loopback or ip.is_link_local or ip.is_unspecified:
                continue
            prefix = entry.get("prefix")
            found.append({"interface": interface, "mac": mac, "addr": str(ip),
                          "prefix": prefix if type(prefix) is int else None})
    found.sort(key=lambda a: (ipaddress.ip_address(a["addr"]).version, a["interface"] or "",
                              a["mac"]))
    return found
