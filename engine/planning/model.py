"""The cluster as the planners see it: hosts with capacity and usage, VMs
with sizes, traits and groups; and the one test of "may this VM go there".

Plain data, no I/O: :mod:`engine.planning.snapshot` fills it from etcd and
placement, the benches and tests build it by hand.  Every planner
(``balance``, ``boot --dry-run``, ``evacuate --dry-run``) changes a copy as
it plans (:meth:`Cluster.move`, :meth:`Cluster.add`) so that each decision
sees the ones before it.

A host's capacity of a resource class is placement's
``(total - reserved) * allocation_ratio``; what it uses is placement's
usage (every consumer: VMs, migrations in flight, leases' reservations).

Promises:
- :meth:`Cluster.why_not` applies every rule a claim applies: the host is
  open (alive, not drained, not shut by a lease the VM is not in), it is
  not where the VM is, the VM's amounts fit, the host has the VM's required
  traits and none it forbids, and the VM's group's rule
  (:func:`engine.placement.groups.allows`) holds; it answers None or the first reason;
- hosts and VMs are iterated in natural name order, so the same cluster
  always gives the same plan.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from engine.placement import groups as grouprules
from engine.natural import natural_key
from engine.placement.traits import list_in_words

__all__ = ["Host", "Vm", "Cluster"]


@dataclass
class Host:
    name: str
    capacity: dict              # {RC: amount}: what placement lets be used
    used: dict                  # {RC: amount}
    traits: frozenset = frozenset()
    open: bool = True           # may take VMs: alive, not drained
    why_closed: str | None = None   # "down", "drained", "reserved by lease x"

    def free(self, rc: str) -> int:
        return self.capacity.get(rc, 0) - self.used.get(rc, 0)

    def fits(self, resources: dict) -> bool:
        return all(rc in self.capacity and self.used.get(rc, 0) + n <= self.capacity[rc]
                   for rc, n in resources.items())


@dataclass
class Vm:
    uuid: str
    name: str
    host: str | None            # None: not placed yet (a boot being planned)
    resources: dict             # {RC: amount}, as its allocation holds
    required: frozenset = frozenset()
    forbidden: frozenset = frozenset()
    group: str | None = None
    stuck: str | None = None    # why it must not be moved (None: it may)


@dataclass
class Cluster:
    hosts: dict                 # name -> Host
    vms: dict                   # uuid -> Vm
    rules: dict = field(default_factory=dict)   # group -> spread or together

    def copy(self) -> "Cluster":
        return copy.deepcopy(self)

    def host_names(self) -> list[str]:
        return sorted(self.hosts, key=natural_key)

    def members(self, group: str) -> dict:
        """The group's members as :func:`engine.placement.groups.occupied` reads them."""
        return {vm.uuid: {"uuid": vm.uuid, "name": vm.name, "host": vm.host}
                for vm in self.vms.values() if vm.group == group and vm.host}

    def group_allows(self, vm: Vm, host: str) -> bool:
        if not vm.group or vm.group not in self.rules:
            return True
        taken = grouprules.occupied(self.members(vm.group), vm.uuid)
        usable = lambda name: name in self.hosts and self.hosts[name].open   # noqa: E731
        return grouprules.allows(self.rules[vm.group], taken, usable)(host)

    def why_not(self, vm: Vm, host: str) -> str | None:
        """Why ``vm`` may not go to ``host`` (None: it may)."""
        target = self.hosts.get(host)
        if target is None:
            return f"{host} is not a host"
        if not target.open:
            return f"{host} is {target.why_closed or 'closed'}"
        if host == vm.host:
            return f"it is on {host} already"
        if not vm.required <= target.traits:
            return f"{host} lacks {list_in_words(sorted(vm.required - target.traits))}"
        if vm.forbidden & target.traits:
            return f"{host} has {list_in_words(sorted(vm.forbidden & target.traits))}"
        short = [rc for rc, n in vm.resources.items()
                 if rc not in target.capacity or target.used.get(rc, 0) + n > target.capacity[rc]]
        if short:
            return f"{host} is short of {', '.join(sorted(short))}"
        if not self.group_allows(vm, host):
            return f"group {vm.group!r} ({self.rules[vm.group]}) rules out {host}"
        return None

    def move(self, uuid: str, host: str) -> None:
        """VM ``uuid`` is now on ``host`` (its amounts move with it)."""
        vm = self.vms[uuid]
        if vm.host is not None:
            source = self.hosts[vm.host]
            for rc, n in vm.resources.items():
                source.used[rc] = source.used.get(rc, 0) - n
        target = self.hosts[host]
        for rc, n in vm.resources.items():
            target.used[rc] = target.used.get(rc, 0) + n
        vm.host = host

    def add(self, vm: Vm, host: str) -> None:
        """A new VM placed on ``host``."""
        self.vms[vm.uuid] = Vm(**{**vm.__dict__, "host": None})
        self.move(vm.uuid, host)
