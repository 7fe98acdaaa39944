"""Reading the cluster: the engine's answer to "which hosts, which VMs, which
hosts can take a VM", for the command line and anyone else who lists.

It sits at the top of the engine because it merges what several rooms write:
the host records of ``engine.core`` (``hostcfg/``, kept across restarts, and
``hosts/``, bound to the peer's lease), the VM records of the hypervisor room
(``vms/``) and placement's providers (``placement/``).

Promises:
- each answer comes from one consistent read of etcd;
- a record that cannot be read (see ``engine/core/values.py``) is skipped and
  reported once, never a crash of the listing: the rest is still listed;
- a figure (vCPUs, memory, disk, usage) that is not a number reads None,
  its key reported once: the record is still listed, and added up.
"""
from __future__ import annotations

import ipaddress
import time

from engine.hypervisor.domain.harules import DOWN, restarts_within
from engine.hypervisor.domain.shapes import HA_POLICIES, VM, first_ip   # also declares vms/ shapes
from engine.hypervisor.host.vm_home import CARRIED
from engine.natural import natural_key
from engine.core import keys
from engine.core.hosts import is_live_record
from engine.core.store import Get
from engine.core.values import readable, report

__all__ = ["read_hosts", "read_vms", "ready_hosts"]


def read_hosts(store) -> list[dict]:
    """Every host ever seen (``hostcfg/``), merged with its live record when
    it is alive (``hosts/``, see :mod:`engine.core.hosts`: a record no lease
    holds, or naming another host, makes no host alive; it is reported and
    skipped), with ``alive``, ``enabled``, ``drained``, ``reserved_by`` (the
    active host lease holding it, or None), ``status`` (up, drained,
    reserved, disabled, down) and ``vms``: the VMs vmlist lists on it, counted
    from ``vms/`` in the same read; ``foreign_vms``, ``foreign_vcpus``,
    ``foreign_memory_mb`` and ``foreign_disk_gb``: the domains peerctl did not
    make there and what they hold, as the host's record says (None when it
    says nothing); ``verify``: what the last ``cluster verify`` found about
    it (``ok``, ``N problems``, None: never verified); by host name,
    naturally sorted."""
    cfg, live, drained, reserved, vms, held, verified = store.txn([], [
        Get(keys.host_config(), True), Get(keys.host(), True), Get(keys.drained(), True),
        Get(keys.reserved(), True), Get(keys.vm(), True), Get(keys.lock("vm/"), True),
        Get(keys.verified(), True)]).ranges
    drained = {keys.suffix(kv.key, keys.drained()) for kv in drained
               if readable(kv) is not None}
    reserved = {keys.suffix(kv.key, keys.reserved()): kv.value["lease"] for kv in reserved
                if readable(kv) is not None}
    records: dict[str, dict] = {}
    for kv in cfg:
        value = _host_record(kv)
        if value is not None:
            name = keys.suffix(kv.key, keys.host_config())
            records[name] = dict(value, host=name, alive=False)
    for kv in live:
        if not is_live_record(kv):
            continue
        name = keys.suffix(kv.key, keys.host())
        record = dict(records.get(name, {}))
        enabled = record.get("enabled")
        record.update(_host_record(kv))
        if enabled is not None:     # hostcfg holds the operator's word (drain)
            record["enabled"] = enabled
        record.update(host=name, alive=True)
        records[name] = record
    # Not the host's own figure, published every few seconds: a VM booted a
    # moment ago is counted as soon as vmlist lists it.
    counts = _vm_counts(vms, held)
    verdicts = _verdicts(verified)
    for name, record in records.items():
        record["vms"] = counts.get(name, 0)
        record["verify"] = verdicts.get(name)
        for field in _FOREIGN:
            record.setdefault(field, None)
        record.setdefault("enabled", True)
        record["drained"] = name in drained
        record["reserved_by"] = reserved.get(name)
        record["status"] = ("down" if not record["alive"]
                            else "drained" if record["drained"]
                            else "reserved" if record["reserved_by"]
                            else "up" if record["enabled"] else "disabled")
    return sorted(records.values(), key=lambda r: natural_key(r["host"]))


def _verdicts(verified) -> dict[str, str]:
    """``{host: "ok" | "N problems"}``: what its last ``cluster verify`` found
    (``verified/<host>``)."""
    verdicts = {}
    for kv in verified:
        outcome = readable(kv)
        count = outcome.get("problems") if isinstance(outcome, dict) else None
        if isinstance(count, int) and not isinstance(count, bool):
            verdicts[keys.suffix(kv.key, keys.verified())] = (
                "ok" if count == 0 else f"{count} problem{'s' if count != 1 else ''}")
    return verdicts


def _vm_counts(records, held) -> dict[str, int]:
    """``{host: VMs}`` as :func:`read_vms` lists them: readable records, a VM
    being moved counted once, on the host it leaves."""
    doubles = _doubles(records, _carried(held)[0])
    counts: dict[str, int] = {}
    for kv in records:
        vm = readable(kv, VM)
        if vm is None:
            continue
        host = vm["host"]
        if doubles and (host, vm["uuid"]) in doubles:
            continue
        counts[host] = counts.get(host, 0) + 1
    return counts


def _carried(held) -> tuple[dict[str, tuple[str, bool]], set[str]]:
    """``({uuid: (host, True: its record is there | False: anywhere but
    there)}, {uuids being moved})`` of the VMs a move or an HA restart holds
    (``locks/vm/``, :mod:`engine.hypervisor.host.vm_home`)."""
    homes, moving = {}, set()
    for kv in held:
        lock = readable(kv)
        if lock is not None and lock.get("kind") in CARRIED and not lock.get("held"):
            uuid = keys.suffix(kv.key, keys.lock("vm/"))
            # a lock with no record_at, beside two records (a peer older
            # than the one-record rule): a restart's rebuilt copy, a move's
            # source, as such peers listed them
            if lock.get("record_at"):
                homes[uuid] = (lock["record_at"], True)
            else:
                homes[uuid] = (lock.get("host"), lock["kind"] != "recover")
            if lock["kind"] == "migrate":
                moving.add(uuid)
    return homes, moving


def _doubles(records, homes: dict[str, tuple[str, bool]]) -> set[tuple[str, str]]:
    """``(host, uuid)`` of the records not to list: a VM that a move or a
    restart holds has one record, where its lock says; a second one (left by
    a peer older than that rule) is not a second VM."""
    if not homes:
        return set()
    seen: dict[str, set] = {}
    for kv in records:
        vm = readable(kv, VM)
        if vm is not None and vm["uuid"] in homes:
            seen.setdefault(vm["uuid"], set()).add(vm["host"])
    doubles = set()
    for uuid, hosts in seen.items():
        host, there = homes[uuid]
        if len(hosts) > 1 and host in hosts:
            doubles |= {(h, uuid) for h in hosts if (h != host) == there}
    return doubles


_VM_NUMBERS = ("vcpus", "memory_mb", "disk_gb")
_FOREIGN = ("foreign_vms", "foreign_vcpus", "foreign_memory_mb", "foreign_disk_gb")
_HOST_NUMBERS = ("vcpus", "memory_mb", "free_memory_mb", "disk_gb", "free_disk_gb",
                 "cpu_usage", "net_rx_bytes", "net_tx_bytes", *_FOREIGN)


def _host_record(kv) -> dict | None:
    """A host record with its figures numbers (or None), else None."""
    value = readable(kv)
    return None if value is None else {**value, **_numbers(kv.key, value, _HOST_NUMBERS)}


def _text(value) -> str | None:
    return value if type(value) is str else None


def read_vms(store) -> list[dict]:
    """Every VM record: ``{host, name, uuid, state, vcpus, memory_mb, disk_gb,
    ip, addresses, ha, recovered}``.

    A VM has one record (:mod:`engine.hypervisor.host.vm_home`), so it is listed
    once, where that record is: while a move holds it, in state
    ``migrating``, on the host it leaves until its record arrives on the
    destination, there from then on.  A VM whose host
    is dead is ``unknown``: its record is
    the last its host wrote, and nobody can tell what runs there now.  A VM
    whose live host has no domain for it is ``missing``; ``crashed``: it is
    down though nobody stopped it through peerctl; ``restarts``: its HA
    restarts within the window (:mod:`engine.hypervisor.domain.harules`).
    ``state_reason``: libvirt's reason for a paused or crashed VM
    (``user``, ``io-error``, ``crashed``...), and ``qemu_log``: where its
    host keeps the guest's QEMU log, each None otherwise (and for a VM
    listed ``unknown`` or ``migrating``, whose record is not the news).
    ``recovered`` (``{from, time, data_as_of}``, else None): an HA restart
    rebuilt the VM after its host ``from`` died, from its replica of
    ``data_as_of`` (None: from its image)."""
    records, held, live = store.txn([], [Get(keys.vm(), True), Get(keys.lock("vm/"), True),
                                         Get(keys.host(), True)]).ranges
    alive = {keys.suffix(kv.key, keys.host()) for kv in live if is_live_record(kv)}
    homes, moving = _carried(held) if held else ({}, set())
    left = _doubles(records, homes)
    vms = []
    append = vms.append
    now = time.time()
    for kv in records:
        # A VM record's shape (:data:`VM`: host, name, uuid and state, text)
        # checked where those fields are read anyway; anything else takes
        # readable(), which says what is wrong.
        vm = kv.value
        if type(vm) is dict:
            get = vm.get
            host, name, uuid, state = get("host"), get("name"), get("uuid"), get("state")
        if not (type(vm) is dict and type(host) is str and type(name) is str
                and type(uuid) is str and type(state) is str):
            vm = readable(kv, VM)
            if vm is None:
                continue
            get = vm.get
            host, name, uuid, state = vm["host"], vm["name"], vm["uuid"], vm["state"]
        if left and (host, uuid) in left:
            continue
        if host not in alive:
            state = "unknown"
        if moving and uuid in moving:
            state = "migrating"
        vcpus, memory_mb, disk_gb = get("vcpus"), get("memory_mb"), get("disk_gb")
        if not (type(vcpus) is int and type(memory_mb) is int and type(disk_gb) is int):
            counted = _numbers(kv.key, vm, _VM_NUMBERS)
            vcpus, memory_mb, disk_gb = map(counted.get, _VM_NUMBERS)
        addresses, ha, recovered = get("addresses"), get("ha"), get("recovered")
        if addresses:
            addresses = _addresses(addresses)
        append({"host": host, "name": name, "uuid": uuid, "state": state,
                "vcpus": vcpus, "memory_mb": memory_mb, "disk_gb": disk_gb,
                "ip": first_ip(addresses) if addresses else None,
                "addresses": addresses or [],
                "ha": ha if ha in HA_POLICIES else "none",
                "recovered": _recovered(recovered) if recovered else None,
                "crashed": state in DOWN and get("crashed") is True,
                "restarts": restarts_within(vm, now) if get("restarts") else 0,
                "state_reason": _text(get("state_reason")) if state == vm["state"] else None,
                "qemu_log": _text(get("qemu_log")) if state == vm["state"] else None})
    return vms


def _numbers(key: str, record: dict, fields) -> dict:
    """Those of ``fields`` that ``record`` has, each a number or None: a
    value of another type in etcd is shown as missing, and reported (once
    per key), never a crash of the listing that adds it up."""
    found, bad = {}, []
    for field in fields:
        if field in record:
            value = record[field]
            if value is not None and type(value) not in (int, float):
                bad.append(f"{field!r} (a {type(value).__name__})")
                value = None
            found[field] = value
    if bad:
        report(key, "not a number, shown as missing: " + ", ".join(bad), skipped=False)
    return found


def _recovered(value) -> dict | None:
    if isinstance(value, dict) and isinstance(value.get("from"), str) \
            and isinstance(value.get("time"), (int, float)):
        as_of = value.get("data_as_of")
        return {"from": value["from"], "time": value["time"],
                "data_as_of": as_of if isinstance(as_of, (int, float)) else None}
    return None


# Each field's types; None: may be null (an interface libvirt does not name,
# a prefix nobody knows), but present.
_ADDRESS_FIELDS = {"interface": (str, type(None)), "mac": (str,), "addr": (str,),
                   "prefix": (int, type(None))}


def _addresses(value) -> list[dict]:
    """A record's ``addresses``, keeping only well-formed entries (a bad
    value in etcd costs that entry, never the listing)."""
    kept = []
    if not value or not isinstance(value, list):
        return kept
    for entry in value:
        if isinstance(entry, dict) and all(k in entry and type(entry[k]) in types
                                           for k, types in _ADDRESS_FIELDS.items()):
            try:
                ipaddress.ip_address(entry["addr"])
            except ValueError:
                continue
            kept.append({k: entry[k] for k in _ADDRESS_FIELDS})
    return kept


def ready_hosts(store, hosts: list[str]) -> set[str]:
    """Those of ``hosts`` that can take a VM: a live record and a placement
    provider holding inventory (a peer writes the first before the second)."""
    import engine.placement.etcd  # noqa: F401  (declares the shapes of placement/ keys)
    live, names, providers = store.txn([], [
        Get(keys.host(), True), Get(keys.placement("name/"), True),
        Get(keys.placement("rp/"), True)]).ranges
    alive = {keys.suffix(kv.key, keys.host()) for kv in live if is_live_record(kv)}
    uuid_of = {}
    for kv in names:
        uuid = readable(kv)
        if isinstance(uuid, str):
            uuid_of[keys.suffix(kv.key, keys.placement("name/"))] = uuid
    stocked = set()
    for kv in providers:
        provider = readable(kv)
        if provider is not None and provider.get("inventories") and provider.get("uuid"):
            stocked.add(provider.get("uuid"))
    return {h for h in hosts if h in alive and uuid_of.get(h) in stocked}
