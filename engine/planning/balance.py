"""The balance plan: live migrations, one at a time, each the move that
lowers the cluster score (:mod:`engine.planning.score`) the most.

Ganeti's hbal (man/hbal.rst, "ALGORITHM"): "at each step, we compute the
best instance move that lowers the cluster score", looking one step ahead
only; it stops when the best step gains less than a minimum (hbal's
``-g``) or after ``-l`` steps; its "jobsets" group moves touching disjoint
nodes.  Proxmox's balancer
(proxmox-resource-scheduling, ``score_best_balancing_migration_candidates``)
scores each candidate migration as if it were done, and truncates
imbalances to their significant digits so that equal candidates order by
name, not by rounding noise: so do we (:data:`_DIGITS`).

What a step considers (an exhaustive scan is O(VMs x hosts) per step, too
slow for 50,000 VMs in Python), a documented heuristic:

- hosts are ranked by the score's gradient (how much a little more load
  there would raise the score: the sum over resource classes of
  ``weight * (fraction - mean) / std``), re-ranked when a class's standard
  deviation has drifted by :data:`_DRIFT` since the last ranking;
- sources: the hosts from the most loaded down, until :data:`SOURCES` of
  them offered a move gaining enough (so a step widens itself to every host
  when few moves remain);
- on a source, VMs of the same amounts, traits and group are
  interchangeable: one of each kind is tried, the first in natural order;
- destinations: for each kind, the first :data:`DESTINATIONS` hosts that
  :meth:`~engine.planning.model.Cluster.why_not` accepts, from the least
  loaded up, among the :data:`DEST_SCAN` least loaded hosts and only those
  less loaded than the source;
- a VM of a spread group sharing its host with another member is always
  tried, against every host: such a move mends a broken rule.

Rules of a plan:
- a VM moves at most once (no ping-pong inside one plan); a ``stuck`` VM
  (held after a recent balance, locked, ...) and a member of a ``together``
  group never move (the group moves as a whole or not at all, and a
  balance does not move groups); VMs move only between open hosts of the
  scope, and every move passes ``why_not`` on the cluster as the moves
  before it left it, so no host ends over capacity;
- a move must lower the score by at least ``min_gain / n``, ``n`` the open
  hosts scored: a move changes two hosts of ``n``, so its effect on a
  standard deviation shrinks as ``1/n``, and a fixed threshold would stop a
  1,000-host plan before its first move or let a 4-host plan chase crumbs;
- deterministic: ties go to natural name order, never to chance;
- pure: the caller's cluster is not changed.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from engine.errors import UsageError
from engine.natural import natural_key
from engine.planning.model import Cluster
from engine.planning.score import VIOLATION_PENALTY, Spread, scope_of

__all__ = ["MIN_GAIN", "Move", "BalancePlan", "plan_balance", "check_move"]

# The least gain worth a live migration, per host scored (a move must gain
# min_gain / n).  Moving a VM holding a share `a` of a host from a host at
# fraction xs to one at xd gains about weight * a * (xs - xd - a) / std / n
# in one class: 0.01 stops once hosts differ by little more than a VM.
# hbal's -g 0.01 is absolute and applies only below a score of 0.1
# (--min-gain-limit): on 1,000 hosts it would stop at once or never.
MIN_GAIN = 0.01

SOURCES = 2         # sources that offered a move, per step
SOURCE_SCAN = 16    # ... or fewer once this many were looked at (all, while none offered)
DESTINATIONS = 2    # destinations tried per kind of VM
DEST_SCAN = 64      # least loaded hosts looked at for them
_DRIFT = 0.1        # re-rank hosts when a standard deviation moved by 10 %
_DIGITS = 12        # gains equal to 12 places are equal: names decide
_UNSEEN = object()


@dataclass
class Move:
    uuid: str
    name: str
    source: str
    dest: str
    gain: float             # how much this move lowers the score
    score_after: float
    set: int = 0            # moves of one set touch disjoint hosts: they may run together


@dataclass
class BalancePlan:
    score_before: float
    score_after: float
    moves: list[Move]
    hosts: list[str]        # the scope, in natural order

    def sets(self) -> list[list[Move]]:
        """The moves by set, sets in the order they run."""
        sets: list[list[Move]] = []
        for move in self.moves:
            while len(sets) <= move.set:
                sets.append([])
            sets[move.set].append(move)
        return sets

    def to_rows(self) -> list[dict]:
        return [{"vm": m.name, "uuid": m.uuid, "from": m.source, "to": m.dest,
                 "gain": round(m.gain, 6), "set": m.set} for m in self.moves]


def plan_balance(cluster: Cluster, *, hosts: Iterable[str] | None = None,
                 max_moves: int | None = None, min_gain: float = MIN_GAIN) -> BalancePlan:
    """The moves that even out ``hosts`` (default: every host), best first.

    ``hosts``: host names (a HOSTGLOB the caller expanded): only VMs on
    them move, only to them, and the score is over them.  ``max_moves``:
    stop after that many.  Raises :class:`~engine.errors.UsageError` for a
    name that is not a host, or a negative bound."""
    scope = _checked_scope(cluster, hosts)
    if max_moves is not None and max_moves < 0:
        raise UsageError(f"bad move limit {max_moves}: want 0 or more")
    if min_gain < 0:
        raise UsageError(f"bad minimum gain {min_gain}: want 0 or more")
    planner = _Planner(cluster, scope, min_gain)
    before = planner.spread.value
    moves: list[Move] = []
    while max_moves is None or len(moves) < max_moves:
        choice = planner.best_move()
        if choice is None:
            break
        vm, dest = choice
        source, was = vm.host, planner.spread.value
        planner.apply(vm, dest)
        now = planner.spread.value
        moves.append(Move(vm.uuid, vm.name, source, dest, was - now, now))
    _assign_sets(moves)
    return BalancePlan(before, moves[-1].score_after if moves else before, moves, scope)


def check_move(cluster: Cluster, uuid: str, dest: str, *, source: str | None = None,
               hosts: Iterable[str] | None = None,
               min_gain: float = MIN_GAIN) -> tuple[float, str | None]:
    """Is a planned move still worth making on ``cluster`` as it is now?

    ``(gain, None)`` when VM ``uuid`` (still on ``source``, when given) may
    go to ``dest`` and that lowers the score over ``hosts`` by at least
    ``min_gain / n``; otherwise ``(gain, reason)``, the reason a short
    phrase about the VM ("it is no longer on host3", "host7 is short of
    MEMORY_MB", "it would gain only 0.0002")."""
    vm = cluster.vms.get(uuid)
    if vm is None:
        return 0.0, "it no longer exists"
    if source is not None and vm.host != source:
        return 0.0, f"it is no longer on {source}"
    if vm.host not in cluster.hosts:
        return 0.0, "it is on no host"
    scope = _checked_scope(cluster, hosts)
    inside = set(scope)
    for host in (vm.host, dest):
        if host in cluster.hosts and host not in inside:
            return 0.0, f"{host} is not among the hosts balanced"
    spread = Spread(cluster, scope)
    gain = spread.value - spread.after(vm, vm.host, dest) if dest in inside else 0.0
    if vm.host not in spread.scored:
        return gain, f"{vm.host} is {cluster.hosts[vm.host].why_closed or 'closed'}"
    why = _why_immovable(cluster, vm) or cluster.why_not(vm, dest)
    if why is not None:
        return gain, why
    least = min_gain / len(spread.scored)
    if gain < least:
        return gain, f"it would gain only {gain:.2g} (at least {least:.2g} wanted)"
    return gain, None


def _checked_scope(cluster: Cluster, hosts: Iterable[str] | None) -> list[str]:
    if hosts is not None:
        hosts = list(hosts)
        unknown = sorted((name for name in hosts if name not in cluster.hosts), key=natural_key)
        if unknown:
            raise UsageError(f"no host named {', '.join(unknown)}")
    return scope_of(cluster, hosts)


def _why_immovable(cluster: Cluster, vm) -> str | None:
    if vm.stuck:
        return vm.stuck
    if cluster.rules.get(vm.group) == "together":
        return f"it is in together group {vm.group!r}"
    return None


def _assign_sets(moves: list[Move]) -> None:
    """hbal's jobsets, keeping order: each move joins the first set after
    the last one that touches its source or its destination."""
    last: dict[str, int] = {}
    for move in moves:
        move.set = max(last.get(move.source, -1), last.get(move.dest, -1)) + 1
        last[move.source] = last[move.dest] = move.set


def _by_name(offer) -> tuple:
    _, vm, dest = offer
    return natural_key(vm.name), natural_key(dest), vm.uuid


def _kind(vm) -> tuple:
    """VMs of one kind on one host are interchangeable for a plan."""
    return (tuple(sorted(vm.resources.items())), vm.required, vm.forbidden, vm.group)


class _Planner:
    """The working state of one plan: a copy of the cluster, its score,
    the movable VMs by host and kind, and the hosts ranked by load."""

    def __init__(self, cluster: Cluster, scope: list[str], min_gain: float):
        # Copy what moves change: hosts' usage now, a VM when it moves
        # (a deep copy of 50,000 VMs would cost more than the whole plan).
        self.work = Cluster({name: dataclasses.replace(host, used=dict(host.used))
                             for name, host in cluster.hosts.items()},
                            dict(cluster.vms), dict(cluster.rules))
        self.spread = Spread(self.work, scope)
        self.least = min_gain / max(len(self.spread.scored), 1)
        self.views: dict[str, Cluster] = {}     # spread group -> the cluster its rule reads
        self.kinds: dict[str, dict[tuple, list[str]]] = {}  # host -> kind -> uuids, by name
        for vm in sorted(cluster.vms.values(), key=lambda vm: natural_key(vm.name)):
            if vm.group in self.work.rules:
                vm = self.work.vms[vm.uuid] = dataclasses.replace(vm)
                if self.work.rules[vm.group] == "spread":
                    view = self.views.setdefault(
                        vm.group, Cluster(self.work.hosts, {}, self.work.rules))
                    view.vms[vm.uuid] = vm
            if vm.host in self.spread.scored and _why_immovable(self.work, vm) is None:
                self.kinds.setdefault(vm.host, {}).setdefault(_kind(vm), []).append(vm.uuid)
        self.rank = {name: i for i, name in enumerate(self.spread.hosts)}
        self.traits_ok: dict[tuple, frozenset] = {}
        self.crowded = {(group, host) for group, where in self.spread.groups.where.items()
                        if group in self.views for host, n in where.items()
                        if n > 1 and host in self.spread.scored}
        self.rerank()

    # -- ranking hosts by load -----------------------------------------------------

    def rerank(self) -> None:
        self.ranked_stds = self.spread.stds()
        self.means = {c.rc: c.shift + c.s1.value / c.n for c in self.spread.classes}
        self.entry = {host: self.entry_of(host) for host in self.spread.scored}
        self.order = sorted(self.entry.values())

    def entry_of(self, host: str) -> tuple:
        load = 0.0
        for c in self.spread.classes:
            std = self.ranked_stds[c.rc]
            if std > 0 and host in c.capacity:
                load += c.weight * (c.used[host] / c.capacity[host] - self.means[c.rc]) / std
        return (load, self.rank[host], host)

    def rerank_hosts(self, *hosts: str) -> None:
        stds = self.spread.stds()
        if any(abs(stds[rc] - old) > _DRIFT * old for rc, old in self.ranked_stds.items()):
            self.rerank()
            return
        for host in hosts:
            if host in self.entry:
                del self.order[bisect.bisect_left(self.order, self.entry[host])]
                self.entry[host] = self.entry_of(host)
                bisect.insort(self.order, self.entry[host])

    # -- choosing --------------------------------------------------------------------

    def best_move(self):
        """The (vm, dest) that gains most among those considered, or None."""
        offers = []
        for group, host in sorted(self.crowded, key=lambda gh: (gh[0], self.rank[gh[1]])):
            offers.extend(self.offers(host, None, len(self.order), group=group))
        # Mending a rule gains about VIOLATION_PENALTY, any other move at most
        # the spread part of the score: when a mend beats that, look no further.
        spread_part = sum(c.weight * c.now for c in self.spread.classes)
        if offers and max(gain for gain, _, _ in offers) >= spread_part:
            choice = self.first_allowed(offers)
            if choice is not None:
                return choice
        return self.first_allowed(offers + self.evening_offers())

    def evening_offers(self) -> list:
        """Offers from the most loaded hosts down, until SOURCES of them
        offered (or fewer, once SOURCE_SCAN were looked at)."""
        offers = []
        productive = 0
        for looked, (load, _, source) in enumerate(reversed(self.order), 1):
            found = self.offers(source, load, DEST_SCAN)
            if found:
                offers.extend(found)
                productive += 1
            if productive == SOURCES or (productive and looked >= SOURCE_SCAN):
                break
        return offers

    def first_allowed(self, offers: list):
        """Best gain first, equal gains in natural order of VM then host: the
        first that why_not accepts (the scan applied only its cheap tests)."""
        offers = sorted(offers, key=lambda offer: -offer[0])
        start = 0
        while start < len(offers):
            end = start
            while end < len(offers) and offers[end][0] == offers[start][0]:
                end += 1
            for _, vm, dest in sorted(offers[start:end], key=_by_name):
                if self.views.get(vm.group, self.work).why_not(vm, dest) is None:
                    return vm, dest
            start = end
        return None

    def offers(self, source: str, load: float | None, scan: int, group=None) -> list:
        """The moves out of ``source`` that gain enough: for each kind of
        movable VM there (of ``group`` only, when given), the best few
        destinations among the ``scan`` least loaded hosts."""
        found = []
        value = self.spread.value
        evened = {}     # (amounts, dest) -> spread part after (None: no room); kinds share it
        for kind, uuids in self.kinds.get(source, {}).items():
            if group is not None and kind[3] != group:
                continue
            vm = self.work.vms[uuids[0]]
            # why_not's tests, cheaply: the scan keeps only open hosts,
            # traits do not change during a plan, a spread group's hosts are
            # counted.  why_not itself has the last word (best_move).
            suits = self.suited(vm)
            hosts = self.work.hosts
            taken = self.spread.groups.where.get(vm.group, ()) if vm.group in self.views else ()
            tried = 0
            for dest_load, _, dest in self.order[:scan]:
                if load is not None and dest_load >= load:
                    break
                if dest == source or dest not in suits or dest in taken:
                    continue
                spread = evened.get((kind[0], dest), _UNSEEN)
                if spread is _UNSEEN:
                    spread = evened[kind[0], dest] = (
                        self.spread.spread_after(vm.resources, source, dest)
                        if hosts[dest].fits(vm.resources) else None)
                if spread is None:
                    continue
                gain = value - spread - VIOLATION_PENALTY * self.spread.broken_after(
                    vm.group, source, dest)
                if gain >= self.least:
                    found.append((round(gain, _DIGITS), vm, dest))
                tried += 1
                if tried == DESTINATIONS:
                    break
        return found

    def suited(self, vm) -> frozenset:
        """The scored hosts whose traits ``vm`` accepts."""
        key = (vm.required, vm.forbidden)
        if key not in self.traits_ok:
            self.traits_ok[key] = frozenset(
                name for name in self.spread.scored
                if vm.required <= self.work.hosts[name].traits
                and not vm.forbidden & self.work.hosts[name].traits)
        return self.traits_ok[key]

    # -- moving ----------------------------------------------------------------------

    def apply(self, vm, dest: str) -> None:
        source = vm.host
        if vm.group not in self.work.rules:         # copy on write (grouped ones are copies)
            vm = self.work.vms[vm.uuid] = dataclasses.replace(vm)
        self.spread.apply(vm, source, dest)
        self.work.move(vm.uuid, dest)
        kinds = self.kinds[source]
        kind = _kind(vm)
        kinds[kind].remove(vm.uuid)                 # moved once: not again
        if not kinds[kind]:
            del kinds[kind]
        if vm.group in self.views:
            where = self.spread.groups.where[vm.group]
            for host in (source, dest):
                if where.get(host, 0) > 1 and host in self.spread.scored:
                    self.crowded.add((vm.group, host))
                else:
                    self.crowded.discard((vm.group, host))
        self.rerank_hosts(source, dest)
