"""One guest network shared by libvirt daemons that run in one network
namespace, or each in a namespace of its own on the switch of a rack in a
box (:func:`ensure_rack_network`): the local KVM cluster of ``up --libvirt
qemu`` and the tests' pair of daemons.

The first daemon owns the network: a libvirt network with a bridge and
DHCP (libvirt's dnsmasq) and no ``<forward>``, so nothing is routed or
NATed and the machine's own interfaces are never touched; it only exists
inside the namespace the daemons were started in.  Every other daemon
defines a network of the same name in bridge mode on that same bridge.
Guests on any daemon share one layer-2 segment and one DHCP server, so a
guest keeps its address when it migrates, and every daemon sees the
guests' addresses in the namespace's ARP table (the owner also has the
DHCP leases).

:func:`ensure_local_network` is idempotent: run again, it leaves what is
right and starts what is stopped.  :func:`stop_local_network` stops it on
every daemon, which ends the owner's dnsmasq: a process that outlives its
libvirtd, and would keep the namespace from being deleted.
"""
from __future__ import annotations

import ipaddress
import xml.etree.ElementTree as ET

import libvirt

__all__ = ["ensure_local_network", "ensure_rack_network", "stop_local_network",
           "DEFAULT_SUBNET", "DEFAULT_BRIDGE"]

DEFAULT_SUBNET = "10.213.0.0/24"
DEFAULT_BRIDGE = "pcbr0"


def _owner_xml(name: str, bridge: str, subnet: str) -> str:
    net = ipaddress.ip_network(subnet)
    hosts = list(net.hosts())
    network = ET.Element("network")
    ET.SubElement(network, "name").text = name
    ET.SubElement(network, "bridge", name=bridge, stp="off", delay="0")
    ip = ET.SubElement(network, "ip", address=str(hosts[0]), prefix=str(net.prefixlen))
    dhcp = ET.SubElement(ip, "dhcp")
    ET.SubElement(dhcp, "range", start=str(hosts[9]), end=str(hosts[-1]))
    return ET.tostring(network, encoding="unicode")


def _bridged_xml(name: str, bridge: str) -> str:
    network = ET.Element("network")
    ET.SubElement(network, "name").text = name
    ET.SubElement(network, "forward", mode="bridge")
    ET.SubElement(network, "bridge", name=bridge)
    return ET.tostring(network, encoding="unicode")


def _ensure(conn, name: str, xml: str) -> None:
    try:
        net = conn.networkLookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_NETWORK:
            raise
        net = conn.networkDefineXML(xml)
    if not net.isActive():
        net.create()
    if not net.autostart():
        net.setAutostart(1)


def ensure_local_network(uris: list[str], name: str = "default",
                         bridge: str = DEFAULT_BRIDGE, subnet: str = DEFAULT_SUBNET) -> None:
    """Network ``name`` on every daemon of ``uris`` (all in one namespace),
    the first owning bridge ``bridge`` with DHCP on ``subnet``."""
    for index, uri in enumerate(uris):
        conn = libvirt.open(uri)
        try:
            _ensure(conn, name, _owner_xml(name, bridge, subnet) if index == 0
                    else _bridged_xml(name, bridge))
        finally:
            conn.close()


def ensure_rack_network(rack, uris: dict[str, str], name: str = "default",
                        bridge: str = DEFAULT_BRIDGE, subnet: str = DEFAULT_SUBNET) -> None:
    """Network ``name`` on the daemons of ``uris`` ({host: uri}, the owner
    first), each in its host's namespace of ``rack``
    (:class:`~engine.hypervisor.local.rack.Rack`): every host's bridge
    ``bridge`` joined to the rack's guest switch, so one DHCP serves all."""
    hosts = list(uris)
    for host in hosts[1:]:
        rack.join_guests(host, bridge, make=True)
    ensure_local_network([uris[host] for host in hosts], name, bridge, subnet)
    rack.join_guests(hosts[0], bridge, make=False)


def stop_local_network(uris: list[str], name: str = "default") -> None:
    """Stop network ``name`` on each daemon of ``uris`` that answers (its
    definition stays, for the next start)."""
    for uri in uris:
        try:
            conn = libvirt.open(uri)
        except libvirt.libvirtError:
            continue
        try:
            net = conn.networkLookupByName(name)
            if net.isActive():
                net.destroy()
        except libvirt.libvirtError:
            pass
        finally:
            conn.close()
