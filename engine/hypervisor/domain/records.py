"""What a peerctl domain is, as the cluster sees it: its state name, its
``vms/<host>/<uuid>`` record, and whether it belongs to a given host.

A record holds two kinds of fields.  What libvirt shows (state, size,
addresses...) is observed, and rewritten by whoever publishes it.  What
the cluster decided is kept across those rewrites (:data:`KEPT`): ``want``,
the state the VM's last automation left it in (running, paused, shutoff),
and ``restarts``, ``{automation: time}`` of its HA restarts.  From both
comes ``crashed: true``: the VM is down though nobody stopped it through
peerctl.  A VM whose domain is gone from its live host is ``missing``
(:func:`missing`), never dropped: only the automations that end or move a
VM delete its record.

Shared by the lifecycle (:mod:`engine.hypervisor.host.vm`) and the publisher
(:mod:`engine.hypervisor.host.vmpublish`); it imports neither.
"""
from __future__ import annotations

import libvirt

from engine.hypervisor.domain.domain_xml import read_metadata
from engine.hypervisor.domain.guest_log import qemu_log_path
from engine.hypervisor.domain.harules import DOWN, wants_restart
from engine.hypervisor.domain.networks import guest_addresses, macs_of
from engine.hypervisor.domain.shapes import first_ip

__all__ = ["vm_state", "state_reason", "vm_record", "owned_by", "merged", "missing",
           "wants_restart", "KEPT", "DOWN"]

KEPT = ("want", "restarts")     # the cluster's decisions: a publish keeps them

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

# libvirt's reasons for a paused or crashed domain (``dom.state()[1]``), in
# words: VIR_DOMAIN_PAUSED_IOERROR is "io-error".  Looked up by name, so that
# bindings older than a constant still load.
_PAUSED_WHY = ("UNKNOWN", "USER", "MIGRATION", "SAVE", "DUMP", "IOERROR", "WATCHDOG",
               "FROM_SNAPSHOT", "SHUTTING_DOWN", "SNAPSHOT", "CRASHED", "STARTING_UP",
               "POSTCOPY", "POSTCOPY_FAILED", "API_ERROR")
_REASONS = {
    libvirt.VIR_DOMAIN_PAUSED: {
        getattr(libvirt, f"VIR_DOMAIN_PAUSED_{why}"):
            {"IOERROR": "io-error"}.get(why, why.lower().replace("_", "-"))
        for why in _PAUSED_WHY if hasattr(libvirt, f"VIR_DOMAIN_PAUSED_{why}")},
    libvirt.VIR_DOMAIN_CRASHED: {0: "unknown", 1: "panicked"},
    libvirt.VIR_DOMAIN_PMSUSPENDED: {0: "pm-suspended"},     # the guest suspended itself
}


def vm_state(dom) -> str:
    return _STATES.get(dom.state()[0], "error")


def state_reason(dom) -> tuple[str, str | None]:
    """The domain's state name and, when it is paused or crashed, libvirt's
    reason in words (``user``, ``io-error``), else None: ``("paused",
    "io-error")``."""
    state, reason = dom.state()[:2]
    why = _REASONS.get(state)
    return _STATES.get(state, "error"), (why.get(reason, "unknown") if why is not None else None)


def vm_record(host_name: str, dom, metadata: dict | None = None) -> dict:
    """What ``vms/<host>/<uuid>`` holds for a domain: with its HA policy
    (``ha``: restart or none) and, for a VM an HA restart rebuilt from its
    image or replica, ``recovered: {from, time, data_as_of?}``; for a VM rebuilt from a backup,
    ``restored: {backup, time}``.  A VM with interfaces
    also has ``networks``, and, while it runs, the ``addresses`` its guest
    got and ``ip`` (the first IPv4, else IPv6, else None).  A paused or
    crashed VM has ``state_reason``, libvirt's reason in words (``user``,
    ``io-error``, ``crashed``, ``unknown``...), and on QEMU ``qemu_log``,
    the path on this host of the guest's QEMU log that says more.
    ``metadata``: the domain's peerctl metadata as the caller read it a
    moment ago (a reconcile's scan), else read now."""
    _state, max_kib, _mem, vcpus, _cpu = dom.info()
    meta = read_metadata(dom) if metadata is None else metadata
    state, reason = state_reason(dom)
    record = {"host": host_name, "name": dom.name(), "uuid": dom.UUIDString(),
              "state": state, "vcpus": vcpus, "memory_mb": max_kib // 1024,
              "disk_gb": meta.get("disk_gb", 0), "ha": meta.get("ha") or "none"}
    if reason is not None:
        record["state_reason"] = reason
        log = qemu_log_path(dom.connect().getURI(), record["name"])
        if log:
            record["qemu_log"] = log
    for mark, name in (("recovered", "from"), ("restored", "backup")):
        if meta.get(f"{mark}_from"):
            record[mark] = {name: meta[f"{mark}_from"], "time": _seconds(meta.get(f"{mark}_at"))}
    if meta.get("recovered_data_as_of"):
        record["recovered"]["data_as_of"] = _seconds(meta["recovered_data_as_of"])
    names = [n for n in (meta.get("networks") or "").split(",") if n]
    if names:
        addresses = []
        if state in ("running", "paused"):
            addresses = guest_addresses(dom, macs_of(record["uuid"], len(names),
                                                     meta.get("macs")))
        record.update(networks=names, addresses=addresses, ip=first_ip(addresses))
    return record


def _seconds(text) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


def owned_by(dom, host_name: str) -> bool:
    """A peerctl VM of ``host_name`` (not another peer's on a shared libvirtd,
    not a domain peerctl did not make)."""
    return read_metadata(dom).get("host") == host_name


def merged(observed: dict, previous: dict | None, want: str | None = None) -> dict:
    """The record to write for a domain libvirt shows as ``observed``: with
    the fields the cluster decided kept from ``previous`` (``want``
    overriding), and ``crashed: true`` when it is down though it should run.
    A running VM none of whose addresses can be seen now keeps those of
    ``previous`` (the last seen, on this host or, moved live, on the last)."""
    record = dict(observed)
    for field in KEPT:
        if previous and field in previous:
            record[field] = previous[field]
    if (record.get("networks") and record["state"] in ("running", "paused")
            and not record.get("addresses") and previous and previous.get("addresses")
            and previous.get("state") in ("running", "paused")):
        # Nothing here sees the guest's address now (its ARP entry aged out,
        # or it just moved live to a host with no address on its network,
        # where no ARP entry forms): a running guest keeps the last one seen.
        record.update(addresses=previous["addresses"], ip=previous.get("ip"))
    if want:
        record["want"] = want
    if record.get("want") in ("running", "paused") and record["state"] in DOWN:
        record["crashed"] = True
    return record


def missing(previous: dict, now: float) -> dict:
    """``previous`` for a VM whose domain its live host no longer has: state
    ``missing`` since ``missing_since``, no addresses; the rest (size,
    policy, ``want``, ``restarts``) as it was."""
    if previous.get("state") == "missing":
        return previous
    record = {k: v for k, v in previous.items()
              if k not in ("crashed", "state_reason", "qemu_log")}
    record.update(state="missing", missing_since=now)
    if "addresses" in record:
        record.update(addresses=[], ip=None)
    return record
