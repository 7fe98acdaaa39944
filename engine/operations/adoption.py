"""Brownfield: foreign domains listed beside peerctl's VMs (``vmlist
--all``), taken under management in place (``adopt``) and let go
(``unmanage``).

Everything that can be known from etcd is checked before an automation
starts, so that a refusal is one line per domain with nothing written: a
domain another manager owns, one with problems its host reported (disks
or interfaces peerctl cannot move or back up), a name a peerctl VM has or
two selected domains share, a pattern matching nothing (saying which
hosts it names are down: a down host's foreign domains are not known).
``unmanage`` refuses a VM whose host is down, that is missing, replicated
(stop its replication first) or in a lease (its reservation holds it);
its backups are kept and counted in the result (``backups_kept``:
:func:`engine.operations.vms.note_backups_kept`).
"""
from __future__ import annotations

import fnmatch

from engine.core import keys
from engine.core.hosts import live_host_names
from engine.core.values import readable
from engine.errors import Failed, UsageError

from .plans import Plan, failed_doc
from .select import NoMatch, by_host_and_name, match_vms, select_vms, vm_pattern
from .vms import LISTED as MANAGED_LISTED
from .vms import list_vms

__all__ = ["ALL_LISTED", "list_all", "read_foreign", "plan_adopt", "plan_unmanage"]

# vmlist --all's JSON: a VM record's fields, whether peerctl manages it, the
# manager that does, and why peerctl could not adopt it
ALL_LISTED = [*MANAGED_LISTED, "managed", "manager", "problems"]


def read_foreign(store) -> list[dict]:
    """The foreign domains the live hosts' peers publish (``foreign/``)."""
    from engine.hypervisor.domain.shapes import FOREIGN
    live = live_host_names(store)
    rows = []
    for kv in store.range(keys.foreign())[0]:
        record = readable(kv, FOREIGN)
        if record is not None and record["host"] in live:
            rows.append({field: record.get(field) for field in ALL_LISTED})
    return rows


def list_all(ctx, patterns: list[str] = ()) -> list[dict]:
    """vmlist's rows with ``managed: true``, and the foreign domains with
    ``managed: false`` (a domain being adopted shows once, as managed)."""
    def read():
        managed = [{**vm, "managed": True, "manager": None, "problems": []}
                   for vm in list_vms(ctx)]
        known = {vm["uuid"] for vm in managed}
        return managed + [row for row in read_foreign(ctx.store()) if row["uuid"] not in known]
    if not patterns:
        return read()
    try:
        return select_vms(read, list(patterns), what="domain")
    except NoMatch as exc:
        raise NoMatch(str(exc), matched=exc.matched, result=exc.matched) from None


def _down_hosts(store, host_globs: set[str]) -> list[str]:
    """Hosts the globs name that are known (``hostcfg/``) but not alive."""
    live = live_host_names(store)
    known = {keys.suffix(kv.key, keys.host_config())
             for kv in store.range(keys.host_config(), keys_only=True)[0]}
    return sorted(h for h in known - live
                  if any(fnmatch.fnmatchcase(h, glob) for glob in host_globs))


def _check(vms: list[dict], why_not, verb: str) -> None:
    """Refuse, one line per VM that ``why_not(vm)`` gives a reason for
    (under a line saying how many), with a row per VM in the result."""
    rows = [{"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"],
             "state": vm["state"], "error": why_not(vm)} for vm in vms]
    lines = [f"{row['host']}/{row['name']}: {row['error']}" for row in rows if row["error"]]
    if not lines:
        return
    head = f"cannot {verb} {len(lines)} domain{'s' if len(lines) != 1 else ''}"
    raise Failed("\n  ".join([head + ":", *lines]) if len(lines) > 1 else
                 f"cannot {verb} {lines[0]}",
                 result={"automation": None, "state": "failed", "vms": rows})


def plan_adopt(ctx, patterns: list[str], ha: str = "none") -> Plan:
    """Adopt the foreign domains matching ``patterns`` (``HOSTGLOB/VMGLOB``:
    a foreign domain is named by its host), in place."""
    if ha not in ("restart", "none"):
        raise UsageError(f"bad HA policy {ha!r} (want restart or none)")
    for text in patterns:
        if "/" not in text:
            raise UsageError(f"bad pattern {text!r}: adopt takes HOSTGLOB/VMGLOB "
                             f"(a foreign domain is named by its host)")
        vm_pattern(text)
    store = ctx.store()
    foreign = read_foreign(store)
    chosen, unmatched = match_vms(foreign, list(patterns))
    if unmatched:
        down = _down_hosts(store, {vm_pattern(p)[0] for p in unmatched})
        raise NoMatch("no foreign domain matches " + ", ".join(repr(p) for p in unmatched)
                      + (f" ({', '.join(down)} {'is' if len(down) == 1 else 'are'} down: "
                         f"a down host's domains cannot be adopted)" if down else ""),
                      result=failed_doc())
    chosen = by_host_and_name(chosen)
    peerctl = {vm["name"]: vm["host"] for vm in list_vms(ctx)}
    first: dict[str, str] = {}

    def why_not(vm) -> str | None:
        label = first.setdefault(vm["name"], f"{vm['host']}/{vm['name']}")
        if vm.get("manager"):
            return f"it carries {vm['manager']} metadata: another manager owns it"
        if vm.get("problems"):
            return "; ".join(vm["problems"])
        if vm["name"] in peerctl:
            return f"a peerctl VM is named {vm['name']!r} already (on {peerctl[vm['name']]})"
        if label != f"{vm['host']}/{vm['name']}":
            return f"{label} is named {vm['name']!r} too (VM names are unique)"
        return None
    _check(chosen, why_not, "adopt")
    targets = [{"host": vm["host"], "name": vm["name"], "uuid": vm["uuid"]} for vm in chosen]
    return Plan("adopt", {"vms": targets, "ha": ha},
                [dict(t, state=vm["state"], vcpus=vm["vcpus"], memory_mb=vm["memory_mb"],
                      disk_gb=vm["disk_gb"]) for t, vm in zip(targets, chosen)],
                ask=len(targets) > 1, what="domains")


def _held_elsewhere(store) -> tuple[dict, dict]:
    """``({uuid: replica host}, {uuid: lease})``: VMs that are replicated,
    and VMs booted into a lease."""
    replicated = {}
    for kv in store.range(keys.replica())[0]:
        record = readable(kv)
        if isinstance(record, dict):
            replica = record.get("replica") if isinstance(record.get("replica"), dict) else {}
            replicated[keys.suffix(kv.key, keys.replica())] = \
                replica.get("host") or "another host"
    leased = {}
    for kv in store.range(keys.lease_vm(), keys_only=True)[0]:
        lease, _, uuid = keys.suffix(kv.key, keys.lease_vm()).partition("/")
        if uuid:
            leased[uuid] = lease
    return replicated, leased


def plan_unmanage(ctx, patterns: list[str]) -> Plan:
    """Let the VMs matching ``patterns`` go: they keep running, unmanaged."""
    from .vms import _read_vms
    vms = select_vms(lambda: _read_vms(ctx), list(patterns))
    replicated, leased = _held_elsewhere(ctx.store())

    def why_not(vm) -> str | None:
        if vm["state"] in ("unknown", "missing"):
            return (f"its host {vm['host']} is down" if vm["state"] == "unknown"
                    else f"its host {vm['host']} has no such domain (missing)")
        if vm["uuid"] in replicated:
            return (f"it is replicated to {replicated[vm['uuid']]}: stop that first "
                    f"(replicate {vm['name']} --stop)")
        if vm["uuid"] in leased:
            return f"it is in lease {leased[vm['uuid']]}: end the lease or destroy it there"
        return None
    _check(vms, why_not, "unmanage")
    targets = [{"host": vm["host"], "name": vm["name"], "uuid": vm["uuid"]} for vm in vms]
    return Plan("unmanage", {"vms": targets},
                [dict(t, state=vm["state"]) for t, vm in zip(targets, vms)],
                ask=len(targets) > 1)
