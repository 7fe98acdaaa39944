"""The cluster score that ``balance`` lowers: how unevenly the hosts are
used, plus a penalty for each VM sitting where its group's rule says it
should not.  Lower is better; 0 is an even cluster that keeps every rule.

The shape is Ganeti hbal's cluster score (man/hbal.rst, "CLUSTER
SCORING"): a sum of standard deviations of per-host fractions (values
within [0, 1], so the terms compare "consistently across all metrics"),
plus counts for hard constraints, which outweigh any evening out and so
"cause the algorithm to actively move instances" out of a broken state.
As Proxmox's static-load scheduler does (proxmox-resource-scheduling,
``topsis_alternative_with``: "base values on percentages to allow comparing
nodes with different stats"), a host's load of a resource class is the
fraction of its capacity in use, so hosts of different sizes compare.

``score(cluster, hosts)`` is, over the *open* hosts among ``hosts``:

- for each resource class of :data:`WEIGHTS` that one of them has capacity
  of: the population standard deviation of ``used / capacity`` over the
  hosts that have capacity of it, times the class's weight;
- plus :data:`VIOLATION_PENALTY` for each VM on one of ``hosts`` (open or
  not) whose group's rule is broken: in a ``spread`` group, every member
  beyond the first on a host; in a ``together`` group, every member not on
  the group's most common host.

Promises:
- :class:`Spread` gives a move's score in O(resource classes), without
  visiting the hosts (hbal's one-step lookahead, made cheap), and after
  :meth:`Spread.apply` its value is what a fresh ``Spread`` of the moved
  cluster gives (running sums are compensated and shifted to the
  cluster's overall fraction used, which moves among the scored hosts
  leave unchanged), within 1e-12;
- pure: reads the cluster, never changes it.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from engine.natural import natural_key

__all__ = ["WEIGHTS", "VIOLATION_PENALTY", "score", "Spread", "scope_of"]

# Memory and CPU count alike (VCPU capacity already includes placement's
# allocation ratio, so both fractions are of what may be handed out); disk
# weighs half: it is a limit on where a VM fits, not a load the host
# carries while the VM runs, and fits are checked separately.
WEIGHTS = {"MEMORY_MB": 1.0, "VCPU": 1.0, "DISK_GB": 0.5}

# A broken group rule outweighs any evening out (the weighted standard
# deviations of fractions within [0, 1] sum to at most 1.25).
VIOLATION_PENALTY = 1.0


def score(cluster, hosts: Iterable[str] | None = None) -> float:
    """The score of ``cluster`` over ``hosts`` (default: every host)."""
    return Spread(cluster, hosts).value


def scope_of(cluster, hosts: Iterable[str] | None) -> list[str]:
    """``hosts`` (default every host of ``cluster``) in natural order, each
    once; names that are not hosts of ``cluster`` are left out."""
    if hosts is None:
        return cluster.host_names()
    return sorted({name for name in hosts if name in cluster.hosts}, key=natural_key)


class _Sum:
    """A running sum with Neumaier's compensation: adding and taking away
    thousands of terms leaves it within an ulp or two of the exact sum."""
    __slots__ = ("total", "carry")

    def __init__(self, terms: Iterable[float] = ()):
        self.total = self.carry = 0.0
        for term in terms:
            self.add(term)

    def add(self, term: float) -> None:
        total = self.total + term
        if abs(self.total) >= abs(term):
            self.carry += (self.total - total) + term
        else:
            self.carry += (term - total) + self.total
        self.total = total

    @property
    def value(self) -> float:
        return self.total + self.carry


class _Class:
    """One resource class over the hosts scored for it: each host's
    fraction used, less ``shift``, and the sums of those and their squares."""
    __slots__ = ("rc", "weight", "capacity", "used", "shift", "n", "s1", "s2", "now")

    def __init__(self, rc: str, weight: float, capacity: dict, used: dict):
        self.rc, self.weight = rc, weight
        self.capacity, self.used = capacity, used      # host -> amount (scored hosts only)
        # The overall fraction used: unchanged by moves among these hosts, so
        # a fresh Spread after the moves shifts by the same amount.
        self.shift = sum(used.values()) / sum(capacity.values())
        self.n = len(capacity)
        self.s1 = _Sum(used[host] / capacity[host] - self.shift for host in capacity)
        self.s2 = _Sum((used[host] / capacity[host] - self.shift) ** 2 for host in capacity)
        self.now = self.std(self.s1.value, self.s2.value)

    def std(self, s1: float, s2: float) -> float:
        mean = s1 / self.n
        variance = s2 / self.n - mean * mean
        return math.sqrt(variance) if variance > 0 else 0.0

    def std_after(self, amount: float, source: str, dest: str) -> float:
        # The hot loop of a plan: written out, no helper calls.
        capacity, used, shift = self.capacity, self.used, self.shift
        s1, s2 = self.s1.total + self.s1.carry, self.s2.total + self.s2.carry
        if source in capacity:
            size, have = capacity[source], used[source]
            before, after = have / size - shift, (have - amount) / size - shift
            s1 += after - before
            s2 += after * after - before * before
        if dest in capacity:
            size, have = capacity[dest], used[dest]
            before, after = have / size - shift, (have + amount) / size - shift
            s1 += after - before
            s2 += after * after - before * before
        mean = s1 / self.n
        variance = s2 / self.n - mean * mean
        return math.sqrt(variance) if variance > 0 else 0.0

    def apply(self, amount: float, source: str, dest: str) -> None:
        for host, change in ((source, -amount), (dest, amount)):
            if host in self.capacity:
                before = self.used[host] / self.capacity[host] - self.shift
                self.used[host] += change
                after = self.used[host] / self.capacity[host] - self.shift
                self.s1.add(after - before)
                self.s2.add(after * after - before * before)
        self.now = self.std(self.s1.value, self.s2.value)


class _Groups:
    """Where each rule-bound group's members are, and how many of them on
    the scored hosts break its rule."""

    def __init__(self, cluster, scope: set):
        self.scope = scope
        self.rules = dict(cluster.rules)
        self.where: dict[str, Counter] = {}        # group -> Counter(host)
        for vm in cluster.vms.values():
            if vm.host is not None and vm.group in self.rules:
                self.where.setdefault(vm.group, Counter())[vm.host] += 1
        self.count = sum(self.broken(group, hosts) for group, hosts in self.where.items())

    def broken(self, group: str, hosts: Counter) -> int:
        if self.rules[group] == "spread":
            return sum(n - 1 for host, n in hosts.items() if n > 1 and host in self.scope)
        home = self.home(hosts)
        return sum(n for host, n in hosts.items() if host != home and host in self.scope)

    @staticmethod
    def home(hosts: Counter) -> str | None:
        """A together group's most common host (ties: first in natural order)."""
        crowded = [host for host, n in hosts.items() if n > 0]
        if not crowded:
            return None
        return min(crowded, key=lambda host: (-hosts[host], natural_key(host)))

    def change(self, group: str | None, source: str, dest: str) -> int:
        """How the count of broken members changes when a member of
        ``group`` goes from ``source`` to ``dest``."""
        hosts = self.where.get(group) if group is not None else None
        if hosts is None:
            return 0
        if self.rules[group] == "spread":   # the common case, in O(1)
            change = 0
            if source in self.scope:
                change -= 1 if hosts[source] > 1 else 0
            if dest in self.scope:
                change += 1 if hosts[dest] > 0 else 0
            return change
        moved = Counter(hosts)
        moved[source] -= 1
        moved[dest] += 1
        return self.broken(group, moved) - self.broken(group, hosts)

    def apply(self, group: str | None, source: str, dest: str) -> None:
        if group in self.where:
            self.count += self.change(group, source, dest)
            hosts = self.where[group]
            hosts[source] -= 1
            hosts[dest] += 1
            if hosts[source] == 0:
                del hosts[source]


class Spread:
    """The score of a cluster over some hosts, kept up to date move by move.

    ``value`` is :func:`score`; ``after(vm, source, dest)`` the score were
    ``vm`` moved from ``source`` to ``dest`` (fit and rules unchecked: that
    is :meth:`~engine.planning.model.Cluster.why_not`'s job), and
    ``apply`` records that move.  The cluster itself is read once and
    never changed."""

    def __init__(self, cluster, hosts: Iterable[str] | None = None):
        self.hosts = scope_of(cluster, hosts)
        scored = [name for name in self.hosts if cluster.hosts[name].open]
        self.scored = frozenset(scored)
        self.classes: list[_Class] = []
        for rc, weight in WEIGHTS.items():
            capacity = {name: cluster.hosts[name].capacity[rc] for name in scored
                        if cluster.hosts[name].capacity.get(rc, 0) > 0}
            if capacity:
                used = {name: cluster.hosts[name].used.get(rc, 0) for name in capacity}
                self.classes.append(_Class(rc, weight, capacity, used))
        self.groups = _Groups(cluster, set(self.hosts))

    @property
    def value(self) -> float:
        spread = sum(c.weight * c.now for c in self.classes)
        return spread + VIOLATION_PENALTY * self.groups.count

    def stds(self) -> dict[str, float]:
        """Each scored resource class's standard deviation (unweighted)."""
        return {c.rc: c.now for c in self.classes}

    def after(self, vm, source: str, dest: str) -> float:
        return (self.spread_after(vm.resources, source, dest)
                + VIOLATION_PENALTY * self.broken_after(vm.group, source, dest))

    def spread_after(self, resources: dict, source: str, dest: str) -> float:
        """The weighted standard deviations were ``resources`` moved."""
        total = 0.0
        for c in self.classes:
            amount = resources.get(c.rc)
            total += c.weight * (c.std_after(amount, source, dest) if amount else c.now)
        return total

    def broken_after(self, group: str | None, source: str, dest: str) -> int:
        """The VMs breaking their group's rule were a member of ``group`` moved."""
        if group is None:
            return self.groups.count
        return self.groups.count + self.groups.change(group, source, dest)

    def apply(self, vm, source: str, dest: str) -> None:
        for c in self.classes:
            amount = vm.resources.get(c.rc, 0)
            if amount:
                c.apply(amount, source, dest)
        self.groups.apply(vm.group, source, dest)
