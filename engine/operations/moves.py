"""Moving VMs: migrate some, drain and undrain hosts, evacuate hosts.

A move needs somewhere to go: a live, undrained host other than the VM's
own, matching ``to`` when given; without one it is refused, naming why,
before anything is written.  A live move's switch-over is planned to pause
the guest for at most ``max_downtime_ms`` (:data:`DEFAULT_MAX_DOWNTIME_MS`
unless asked otherwise, within :data:`MAX_DOWNTIME_RANGE_MS`)."""
from __future__ import annotations

import fnmatch
import os

from engine.core import features
from engine.errors import Failed, PlacementError, Refused, UsageError
from engine.wording import given, option

from .plans import Plan, failed_doc
from .select import host_pattern, select_hosts, select_vms, vm_pattern, by_host_and_name

__all__ = ["plan_migrate", "plan_evacuate", "evacuate_after_drain", "set_drained",
           "plan_drain", "operator", "max_downtime", "DEFAULT_MAX_DOWNTIME_MS",
           "MAX_DOWNTIME_RANGE_MS"]

# Proxmox starts a live migration at 100 ms; QEMU's own default is 300 ms.
DEFAULT_MAX_DOWNTIME_MS = 100
# A pause of seconds is no longer a live move: more is a slip (seconds for ms).
MAX_DOWNTIME_RANGE_MS = (1, 10_000)
DOWNTIME_LEVEL = 2          # the cluster feature level that passes it to peers


def max_downtime(value) -> int:
    """``value`` (a number, or its text) as a live move's maximum downtime
    in whole milliseconds; :class:`UsageError` quoting it when it is none,
    or out of range."""
    low, high = MAX_DOWNTIME_RANGE_MS
    number = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        raise UsageError(f"must be a whole number of milliseconds from {low} to {high}: "
                         f"{value!r}")
    return number


def _takers(hosts: list[dict], glob: str) -> set[str]:
    """Hosts matching ``glob`` that can take a moved VM: alive, not drained,
    not disabled (placement refuses the others anyway; this says so first)."""
    return {h["host"] for h in hosts
            if h.get("status") == "up" and fnmatch.fnmatchcase(h["host"], glob)}


def _nowhere(what: str, to: str | None, hosts: list[dict], why_own: str) -> str:
    """The one line saying why ``what`` has no destination: ``--to`` (or
    the cluster) offers no live, undrained host but those it leaves."""
    where = given("to", to) if to is not None else "the cluster"
    matched = [h for h in hosts if fnmatch.fnmatchcase(h["host"], to or "*")]
    if not matched:
        return f"nowhere to move {what}: {where} matches no host"
    up = [h["host"] for h in matched if h.get("status") == "up"]
    if not up:
        return (f"nowhere to move {what}: {where} has no live, undrained host ("
                + ", ".join(f"{h['host']} {h.get('status')}" for h in matched) + ")")
    return (f"nowhere to move {what}: {where} offers only {', '.join(up)}, "
            f"{why_own}")


def _move_target(vm: dict, landing: dict | None = None) -> dict:
    planned = (landing or {}).get(vm["uuid"]) or {}
    return {"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"], "state": vm.get("state"),
            **({"prefer": planned["host"]} if planned.get("host") else {})}


def _row(vm: dict, landing: dict | None = None) -> dict:
    planned = (landing or {}).get(vm["uuid"]) or {}
    return {"name": vm["name"], "uuid": vm["uuid"], "from": vm["host"],
            "host": planned.get("host"), "state": vm.get("state"),
            **({"error": planned["error"]} if planned.get("error") else {})}


def _landing(ctx, leaving: list[str], vms: list[dict], to: str | None) -> dict:
    """Where each of ``vms`` would go, none to a host in ``leaving`` (by
    uuid: ``{host, error}``), as the moves' claims choose
    (:mod:`engine.planning.placements`): ``evacuate --dry-run`` and
    ``migrate --dry-run`` show it, the real moves ask each claim for that
    host first."""
    from engine.planning.placements import plan_evacuation
    from engine.planning.snapshot import read_cluster
    try:
        with ctx.placement() as placement:
            cluster = read_cluster(ctx.store(), placement)
    except PlacementError as exc:
        raise Failed(f"placement: {exc}", result=failed_doc()) from None
    uuids = [vm["uuid"] for vm in vms if vm["uuid"] in cluster.vms]
    return {row["uuid"]: row for row in plan_evacuation(cluster, leaving, uuids, to=to)}


def plan_migrate(ctx, patterns: list[str], to: str | None = None, *, offline: bool = False,
                 parallel: int = 4, bandwidth_mib: int | None = None,
                 postcopy: bool = False,
                 max_downtime_ms: int | None = None) -> Plan:
    """Move the VMs matching ``patterns`` to other hosts (matching ``to``).
    The plan's rows say where each VM would go, or why no host can take it
    (``{name, uuid, from, host, state, error}``), as evacuate's do; each
    move's claim asks for that host first.  ``max_downtime_ms`` needs the cluster's feature level 2 (older peers
    know no such argument): below it, none is passed and QEMU's default
    applies, and asking for one is refused."""
    if max_downtime_ms is not None:
        try:
            max_downtime_ms = max_downtime(max_downtime_ms)
        except UsageError as exc:
            raise UsageError(f"max_downtime_ms {exc}") from None
    for text in patterns:
        vm_pattern(text)        # bad patterns and --to are usage errors before any read
    to = host_pattern(to) if to is not None else None
    from engine.cluster import read_hosts, read_vms
    store = ctx.store()
    vms = select_vms(lambda: read_vms(store), list(patterns))
    _no_snapshots(store, vms, "moving it")
    hosts = read_hosts(store)
    takers = _takers(hosts, to or "*")
    stuck = [vm for vm in vms if not takers - {vm["host"]}]
    if stuck:
        raise Failed(_nowhere(", ".join(repr(vm["name"]) for vm in stuck), to, hosts,
                              "where it is" if len(stuck) == 1 else "where they are"),
                     result=failed_doc())
    if features.cluster_level(store) >= DOWNTIME_LEVEL:
        max_downtime_ms = max_downtime_ms or DEFAULT_MAX_DOWNTIME_MS
    elif max_downtime_ms is not None:
        raise Refused(f"{option('max_downtime_ms', '--max-downtime')} needs the cluster's "
                      f"feature level {DOWNTIME_LEVEL}: "
                      "raise it with 'cluster feature-level' once every host runs this "
                      "release (docs/upgrade.md)")
    landing = _landing(ctx, [], vms, to)
    return Plan("migrate", {
        "vms": [_move_target(vm, landing) for vm in vms], "to": to, "offline": bool(offline),
        "parallel": parallel,
        **({"max_downtime_ms": max_downtime_ms} if max_downtime_ms else {}),
        **({"bandwidth_mib": bandwidth_mib} if bandwidth_mib else {}),
        **({"postcopy": True} if postcopy else {})},
        [_row(vm, landing) for vm in vms], ask=len(vms) > 1)


def _no_snapshots(store, vms: list[dict], doing: str) -> None:
    """A migration copies a VM's disks as they are now, not its snapshots
    (libvirt refuses to migrate a VM that has some): one line naming the
    first VM's snapshot, nothing started."""
    from engine.errors import RequestError
    from engine.backups.snapshots import refuse_if_snapshots
    for vm in vms:
        try:
            refuse_if_snapshots(store, vm["uuid"], vm["name"], doing)
        except RequestError as exc:
            raise Failed(str(exc), result=failed_doc()) from None


def _on(store, hosts: list[str]) -> list[dict]:
    from engine.cluster import read_vms
    return by_host_and_name([vm for vm in read_vms(store) if vm["host"] in hosts])


def plan_evacuate(ctx, pattern: str, to: str | None = None, parallel: int = 4, *,
                  planned: bool = True) -> Plan:
    """Drain the hosts matching ``pattern`` and move every VM off them.
    The plan lists the VMs there now, with where each would go unless
    ``planned`` is false (a real run: :func:`evacuate_after_drain` drains
    and plans again with what is there then, so the first plan would be
    read for nothing)."""
    host_pattern(pattern)       # bad patterns, --to too, are usage errors before any read
    to = host_pattern(to) if to is not None else None
    from engine.cluster import read_hosts
    store = ctx.store()
    hosts = read_hosts(store)
    leaving = [h["host"] for h in select_hosts(lambda: hosts, pattern, result=failed_doc())]
    vms = _on(store, leaving)
    _no_snapshots(store, vms, "evacuating its host")
    if (vms or to is not None) and not _takers(hosts, to or "*") - set(leaving):
        raise Failed(_nowhere(f"the VMs of {', '.join(leaving)}", to, hosts,
                              "which " + ("is" if len(leaving) == 1 else "are")
                              + " being evacuated"), result=failed_doc())
    landing = _landing(ctx, leaving, vms, to) if planned else None
    return Plan("evacuate", {"hosts": leaving, "vms": [_move_target(vm, landing) for vm in vms],
                             "to": to, "parallel": parallel},
                [_row(vm, landing) for vm in vms], ask=len(vms) > 1 or len(leaving) > 1)


def evacuate_after_drain(ctx, plan: Plan, by: str | None = None) -> Plan | None:
    """Drain the plan's hosts first, so that nothing new lands there while
    the VMs leave, then plan with the VMs there now (booted since or not);
    None when there are none to move."""
    set_drained(ctx, plan.args["hosts"], True, by)
    vms = _on(ctx.store(), plan.args["hosts"])
    if not vms:
        return None
    landing = _landing(ctx, plan.args["hosts"], vms, plan.args.get("to"))
    return Plan("evacuate", dict(plan.args, vms=[_move_target(vm, landing) for vm in vms]),
                [_row(vm, landing) for vm in vms], ask=plan.ask)


def plan_drain(ctx, pattern: str) -> list[dict]:
    """The host records matching ``pattern`` (NoMatch naming it), each with
    ``vms``: how many VMs are on it now."""
    from engine.cluster import read_hosts
    return select_hosts(lambda: read_hosts(ctx.store()), pattern, result={"hosts": []})


def operator() -> str:
    """Who drains, for ``drained/<host>``: user@machine."""
    import getpass
    import socket
    try:
        user = getpass.getuser()
    except Exception:       # no name for this uid
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def set_drained(ctx, names: list[str], drained: bool, by: str | None = None) -> list[dict]:
    """Drain (or undrain) each host: ``[{host, drained}]``; two quick writes
    per host, no automation.  ``by``: who asks (default: this process's
    user@machine)."""
    from engine.placement.drains import set_drained as write
    try:
        with ctx.placement() as placement:
            return write(ctx.store(), names, drained, by=by or operator(), placement=placement)
    except PlacementError as exc:
        raise Failed(f"placement: {exc}", result={"hosts": []}) from None
