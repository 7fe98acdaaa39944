"""What a peerctl domain is, as the cluster sees it: its state name, its
``vms/<host>/<uuid>`` record, and whether it belongs to a given host.

Shared by the lifecycle (:mod:`engine.hypervisor.vm`) and the publisher
(:mod:`engine.hypervisor.vmpublish`); it imports neither.
"""
from __future__ import annotations

import libvirt

from engine.hypervisor.domain_xml import read_metadata
from engine.hypervisor.networks import guest_addresses, mac_for
from engine.hypervisor.shapes import first_ip

__all__ = ["vm_state", "vm_record", "owned_by"]

_STATES = {
    libvirt.VIR_DOMAIN_NOSTATE: "building",
    libvirt.VIR_DOMAIN_RUNNING: "running",
    libvirt.VIR_DOMAIN_BLOCKED: "running",
    libvirt.VIR_DOMAIN_PAUSED: "paused",
    libvirt.VIR_DOMAIN_SHUTDOWN: "running",     # shutting down, still up
    libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
    libvirt.VIR_DOMAIN_CRASHED: "error",
    libvirt.VIR_DOMAIN_PMSUSPENDED: "paused",
}



def vm_state(dom) -> str:
    return _STATES.get(dom.state()[0], "error")


def vm_record(host_name: str, dom) -> dict:
    """What ``vms/<host>/<uuid>`` holds for a domain: with its HA policy
    (``ha``: restart or none) and, for a VM an HA restart rebuilt from its
    image, ``recovered: {from, time}``.  A VM with interfaces
    also has ``networks``, and, while it runs, the ``addresses`` its guest
    got and ``ip`` (the first IPv4, else IPv6, else None)."""
    _state, max_kib, _mem, vcpus, _cpu = dom.info()
    meta = read_metadata(dom)
    state = vm_state(dom)
    record = {"host": host_name, "name": dom.name(), "uuid": dom.UUIDString(),
              "state": state, "vcpus": vcpus, "memory_mb": max_kib // 1024,
              "disk_gb": meta.get("disk_gb", 0), "ha": meta.get("ha") or "none"}
    if meta.get("recovered_from"):
        try:
            when = float(meta.get("recovered_at") or 0)
        except ValueError:
            when = 0.0
        record["recovered"] = {"from": meta["recovered_from"], "time": when}
    names = [n for n in (meta.get("networks") or "").split(",") if n]
    if names:
        addresses = []
        if state in ("running", "paused"):
            addresses = guest_addresses(dom, [mac_for(record["uuid"], index)
                                              for index in range(len(names))])
        record.update(networks=names, addresses=addresses, ip=first_ip(addresses))
    return record


def owned_by(dom, host_name: str) -> bool:
    """A peerctl VM of ``host_name`` (not another peer's on a shared libvirtd,
    not a domain peerctl did not make)."""
    return read_metadata(dom).get("host") == host_name
