"""Where a boot's VMs would land, and where an evacuation's (or a
migration's) VMs would go.

The same choice a claim makes (``requests/placement.py``), made on a
snapshot for every VM in turn, each seeing the ones before it: among the
open hosts matching ``--on``/``--to`` that have the VM's traits, fit its
amounts and keep its group's rule, the least loaded after it (the mean
free share of each class it asks for, as placement weighs candidates);
ties go to the first host in natural name order, where placement would
draw lots.  The real command then asks each claim for the planned host
first (``prefer``), so that on a quiet cluster the plan and the result
agree; a planned host that no longer fits falls back to the claim's own
choice.

Promises:
- nothing is read but the snapshot and nothing is written;
- a VM no host can take gets ``host: None`` and ``error``, one line naming
  what stopped it (the group, when its rule did), and takes no capacity
  from the VMs after it.
"""
from __future__ import annotations

import fnmatch

from engine.wording import given

from .model import Cluster, Vm

__all__ = ["plan_boots", "plan_evacuation", "ALTERNATES"]

ALTERNATES = 2      # hosts after the first a boot would try (boot's attempts - 1)


def _weight(cluster: Cluster, host: str, resources: dict) -> float:
    target = cluster.hosts[host]
    shares = [(target.capacity[rc] - target.used.get(rc, 0) - n) / target.capacity[rc]
              if target.capacity.get(rc) else 0.0 for rc, n in resources.items()]
    return round(sum(shares) / len(shares), 6) if shares else 0.0


def _ranked(cluster: Cluster, vm: Vm, pattern: str, leaving=()) -> tuple[list[str], dict]:
    """Hosts ``vm`` may go to, best first; and why each other one may not
    (its own host goes without saying)."""
    fits, why = [], {}
    for name in cluster.host_names():
        if not fnmatch.fnmatchcase(name, pattern) or name in leaving or name == vm.host:
            continue
        reason = cluster.why_not(vm, name)
        if reason is None:
            fits.append(name)
        else:
            why[name] = reason
    order = {name: i for i, name in enumerate(fits)}
    fits.sort(key=lambda name: (-_weight(cluster, name, vm.resources), order[name]))
    return fits, why


def _named(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _refusal(vm: Vm, why: dict, cluster: Cluster, where: str) -> str:
    """One line: why no host takes ``vm`` (its group first, when its rule
    ruled out some)."""
    if not why:
        return f"no host {where}"
    grouped = [name for name, reason in why.items() if reason.startswith("group ")]
    others = [reason for reason in why.values() if not reason.startswith("group ")]
    if grouped:
        rest = f"; the others: {'; '.join(others[:3])}" if others else ""
        return (f"group {vm.group!r} ({cluster.rules.get(vm.group)}) rules out "
                f"{_named(grouped)}{rest}")
    return "no host can take it: " + "; ".join(others[:6]) + (
        f"; and {len(others) - 6} more" if len(others) > 6 else "")


def plan_boots(cluster: Cluster, vms: list[Vm], *, on: str | None = None,
               alternates: int = ALTERNATES) -> list[dict]:
    """``[{name, host, alternates, error}]``, in the order of ``vms``
    (each a :class:`Vm` without a host; ``group`` and its rule in
    ``cluster.rules``).  ``cluster`` is changed: each VM is added where it
    lands."""
    rows = []
    for vm in vms:
        ranked, why = _ranked(cluster, vm, on or "*")
        if not ranked:
            rows.append({"name": vm.name, "host": None, "alternates": [],
                         "error": _refusal(vm, why, cluster,
                                           f"matches {given('on', on)}" if on else "is known")})
            continue
        cluster.add(vm, ranked[0])
        rows.append({"name": vm.name, "host": ranked[0], "alternates": ranked[1:1 + alternates],
                     "error": None})
    return rows


def plan_evacuation(cluster: Cluster, leaving: list[str], uuids: list[str], *,
                    to: str | None = None) -> list[dict]:
    """``[{name, uuid, from, host, error}]``: where each VM of the hosts
    ``leaving`` would go, in the order of ``uuids``; ``cluster`` is changed
    as the moves are planned.  With no host ``leaving``, where each VM
    would be migrated to (``migrate --dry-run``)."""
    for name in leaving:
        if name in cluster.hosts:
            cluster.hosts[name].open, cluster.hosts[name].why_closed = False, "being evacuated"
    rows = []
    for uuid in uuids:
        vm = cluster.vms[uuid]
        source = vm.host
        ranked, why = _ranked(cluster, vm, to or "*", leaving)
        if not ranked:
            rows.append({"name": vm.name, "uuid": uuid, "from": source, "host": None,
                         "error": _refusal(vm, why, cluster,
                                           f"matches {given('to', to)}" if to else "is known")})
            continue
        cluster.move(uuid, ranked[0])
        rows.append({"name": vm.name, "uuid": uuid, "from": source, "host": ranked[0],
                     "error": None})
    return rows
