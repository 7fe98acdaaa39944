"""VMs: list them, boot them, act on them, set their HA policy, find the
one a console attaches to."""
from __future__ import annotations

import time

from engine.errors import Failed, UsageError
from engine.wording import given, option, speaks_json

from .plans import Plan, check_somewhere, failed_doc, refuse_down_hosts
from .select import NoMatch, host_pattern, select_vms
from .specs import check_names, hostname_of, parse_resources

__all__ = ["LISTED", "ORDER", "JOINED", "list_vms", "plan_boot", "plan_action", "plan_ha",
           "console_target", "wait_for_addresses", "paused_why", "given_seed",
           "boot_addresses", "ADDRESSED_FIELDS",
           "note_backups_kept",
           "VM_ACTIONS", "DESTRUCTIVE", "ENDED"]

# vmlist's JSON: each row's fields, and the order of the rows
LISTED = ["host", "name", "uuid", "state", "vcpus", "memory_mb", "disk_gb", "ip",
          "addresses", "ha", "recovered", "crashed", "restarts", "backup", "replica",
          "state_reason", "qemu_log"]
ORDER = "host,name"
# vmlist's fields read beside the VM records, each in a range read of its own
JOINED = ("backup", "replica")
VM_ACTIONS = ("destroy", "start", "stop", "reboot", "suspend", "resume")
# Actions that take a service down: on more than one VM a person confirms them.
DESTRUCTIVE = ("destroy", "stop", "reboot", "suspend")


def _read_vms(ctx) -> list[dict]:
    from engine.cluster import read_vms
    return read_vms(ctx.store())


def _listed(ctx, joined=JOINED) -> list[dict]:
    """vmlist's rows: the VM records, with those of :data:`JOINED` asked
    for: ``backup``, its newest backup's ``{id, time}`` or None (one range
    read of ``backups/``), and ``replica``
    (:func:`~engine.operations.replicas.replicas_by_uuid`) or None when it
    is not replicated."""
    vms = _read_vms(ctx)
    if "backup" in joined:
        from .backups import newest_by_uuid
        newest = newest_by_uuid(ctx.store()).get
        for vm in vms:
            vm["backup"] = newest(vm["uuid"])
    if "replica" in joined:
        from .replicas import replicas_by_uuid
        replica = replicas_by_uuid(ctx.store()).get
        for vm in vms:
            vm["replica"] = replica(vm["uuid"])
    return vms


def list_vms(ctx, patterns: list[str] = (), joined=JOINED) -> list[dict]:
    """Every VM the cluster knows (vmlist's rows), or those matching any of
    ``patterns``: :class:`NoMatch` naming the patterns matching nothing,
    carrying the VMs the others matched.  ``joined``: those of
    :data:`JOINED` the rows need (a listing that shows neither reads
    neither)."""
    if not patterns:
        return _listed(ctx, joined)
    try:
        return select_vms(lambda: _listed(ctx, joined), list(patterns))
    except NoMatch as exc:
        raise NoMatch(str(exc), matched=exc.matched, result=exc.matched) from None


def _targets(vms: list[dict]) -> list[dict]:
    return [{"host": vm["host"], "name": vm["name"], "uuid": vm["uuid"]} for vm in vms]


def plan_action(ctx, kind: str, patterns: list[str]) -> Plan:
    """destroy, start, stop, reboot, suspend or resume the VMs matching
    ``patterns``, in one automation.  Any action but destroy needs the
    VM's host to answer and the VM to be there: a VM whose host is down
    (``unknown``) or that its host lost (``missing``) is refused here, one
    line saying what to do, nothing started (destroy ends either)."""
    if kind not in VM_ACTIONS:
        raise UsageError(f"unknown VM action {kind!r} (want {', '.join(VM_ACTIONS)})")
    vms = select_vms(lambda: _read_vms(ctx), list(patterns))
    if kind != "destroy":
        _refuse_unreachable(kind, vms)
    targets = _targets(vms)
    return Plan(kind, {"vms": targets},
                [dict(t, state=vm.get("state")) for t, vm in zip(targets, vms)],
                ask=kind in DESTRUCTIVE and len(vms) > 1)


def _refuse_unreachable(kind: str, vms: list[dict]) -> None:
    """``kind`` (not destroy) cannot act on a VM whose host is down or that
    its host lost: one line for the first such VM, how many more."""
    refuse_down_hosts(vms, f"it can be {_DONE[kind]}", lead=f"cannot {kind} VM {{name!r}}: it",
                      after=" (or destroy it)")
    lost = [vm for vm in vms if vm.get("state") == "missing"]
    if lost:
        vm = lost[0]
        raise Failed(f"cannot {kind} VM {vm['name']!r}: it is missing: {vm['host']} no longer "
                     f"has its domain; destroy it, or restore it from a backup ('backup list "
                     f"{vm['name']}', then 'restore ID --as NAME')"
                     + (f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""),
                     result=failed_doc())


_DONE = {"start": "started", "stop": "stopped", "reboot": "rebooted", "suspend": "suspended",
         "resume": "resumed"}
ENDED = ("destroyed", "disowned")     # what destroy leaves a VM as


def note_backups_kept(ctx, rows: list[dict], states=ENDED, count=None) -> list[dict]:
    """destroy's (or unmanage's) result ``rows``, each VM it ended (in
    ``states``; None: any without an error) that has backups with
    ``backups_kept``: how many (they stay until ``backup delete`` removes
    them: no schedule matches a VM peerctl no longer has); one range read
    of ``backups/``.  ``count(uuids)``: ``{uuid: N}`` (default: from etcd)."""
    from .backups import count_backups
    gone = [row for row in rows if (states is None or row.get("state") in states)
            and not row.get("error") and row.get("uuid")]
    counts = (count or (lambda uuids: count_backups(ctx, uuids)))([row["uuid"] for row in gone])
    for row in gone:
        if counts.get(row["uuid"]):
            row["backups_kept"] = counts[row["uuid"]]
    return rows


def plan_ha(ctx, patterns: list[str], policy: str) -> Plan:
    """Set the HA policy (restart or none) of the VMs matching ``patterns``;
    their hosts must be up."""
    if policy not in ("restart", "none"):
        raise UsageError(f"bad HA policy {policy!r} (want restart or none)")
    vms = select_vms(lambda: _read_vms(ctx), list(patterns))
    refuse_down_hosts(vms, "its HA policy can change")
    targets = _targets(vms)
    return Plan("ha", {"vms": targets, "policy": policy},
                [dict(t, ha=vm.get("ha")) for t, vm in zip(targets, vms)])


def plan_boot(ctx, names: list[str], resources: str, *, required: str | None = None,
              image: str | None = None, on: str | None = None,
              networks: list[str] | None = None, default_network: str = "default",
              seed: dict | None = None, reservation: str | None = None,
              ha: str = "none", group: str | None = None, rule: str | None = None) -> Plan:
    """Create and start one VM per name, each placed where ``resources``
    (a spec) and the required traits fit.  ``networks``: names given
    (``["none"]`` for no interface), else ``default_network``; ``seed``:
    ``{hostname, user_data, ssh_keys}`` for cloud-init, or None;
    ``group``/``rule``: the VMs join that group (spread or together).

    The plan's targets say where each VM would land (and its alternates),
    computed as the claims choose (:mod:`engine.planning.placements`);
    each VM's claim asks for that host first (``prefer``).  A VM its
    group's rule leaves no host for is refused here, nothing started."""
    check_names(list(names))
    resources, traits = parse_resources(resources, required)
    from .images import check_image
    check_image(ctx, image)
    on = host_pattern(on) if on is not None else None
    clash = [f"{vm['name']} (on {vm['host']})" for vm in _read_vms(ctx) if vm["name"] in names]
    if clash:
        raise Failed("VM name already in use: " + ", ".join(clash), result=failed_doc())
    networks = _networks(ctx, networks, default_network)
    traits += [t for t in _network_traits(networks) if t not in traits]
    if reservation is not None:
        from engine.leases import commands as leases
        from engine.leases.model import check_name
        check_name(reservation)
        traits += [t for t in leases.boot_into(ctx.store(), reservation, resources)
                   if t not in traits]
    if on is not None:
        check_somewhere(ctx, on, reservation)
    from .groups import group_for_boot, plan_landing, refuse_broken_rule
    joined = group_for_boot(ctx, group, rule) if group is not None else None
    if rule is not None and group is None:
        raise UsageError(f"{given('rule', rule)} needs {option('group')}"
                         if speaks_json() else f"--{rule} needs --group NAME")
    vms = [{"name": name, "resources": resources, "required": traits, "image": image, "on": on,
            **({"ha": ha} if ha != "none" else {}),
            **({"reservation": reservation} if reservation else {}),
            **({"networks": networks} if networks else {}),
            **({"seed": {**seed, "hostname": seed["hostname"] or hostname_of(name)}}
               if seed else {}),
            **({"group": joined} if joined else {})} for name in names]
    landing = plan_landing(ctx, vms, on)
    refuse_broken_rule(landing)
    for vm, row in zip(vms, landing):
        if row["host"]:
            vm["prefer"] = row["host"]
    return Plan("boot", {"vms": vms}, landing)


def given_seed(user_data: str | None = None, ssh_keys: list[str] | None = None,
               hostname: str | None = None) -> dict | None:
    """The cloud-init seed's inputs as the API gives them (the user-data
    file's text, public key lines, a hostname), checked as ``boot
    --user-data FILE --ssh-key FILE --hostname NAME`` checks them, within the
    same caps; None when none is given."""
    from engine.hypervisor.domain import seed
    if user_data is None and not ssh_keys and not hostname:
        return None
    return {"hostname": seed.check_hostname(hostname) if hostname else None,
            "user_data": (seed.given_user_data(user_data, option("user_data"))
                          if user_data is not None else None),
            "ssh_keys": seed.given_ssh_keys(list(ssh_keys or []), option("ssh_keys"))}


def _networks(ctx, given: list[str] | None, default: str) -> list[str]:
    """Network names some live host offers; ``none``: no interface."""
    from engine.hypervisor.domain.networks import parse_names
    where = "in --network" if given else "in the network setting"
    networks = parse_names(given if given else [default], where)
    if not networks:
        return []
    from engine.cluster import read_hosts
    from .hosts import networks_of
    hosts = read_hosts(ctx.store())
    offered = {name for host in hosts for name in networks_of(host)}
    unknown = [name for name in dict.fromkeys(networks) if name not in offered]
    if unknown and hosts:   # no host known at all: the boot says so itself
        hint = (f"hosts offer: {', '.join(sorted(offered))}" if offered
                else "no host offers any network")
        none = "" if given else "; boot --network none for a VM without one"
        raise UsageError(f"unknown network {', '.join(unknown)} ({hint}{none})")
    return networks


def _network_traits(networks: list[str]) -> list[str]:
    from engine.hypervisor.domain.networks import network_trait
    return list(dict.fromkeys(network_trait(name) for name in networks))


def paused_why(vm: dict) -> str:
    """``paused (io-error); see host1:/var/log/libvirt/qemu/web1.log``: a
    VM record's state with libvirt's reason and where its QEMU log is."""
    said = vm["state"] + (f" ({vm['state_reason']})" if vm.get("state_reason") else "")
    return said + (f"; see {vm['host']}:{vm['qemu_log']}" if vm.get("qemu_log") else "")


def wait_for_addresses(ctx, vms: list[dict], timeout: float, poll: float = 0.5,
                       noticed=None, read=None) -> list[str]:
    """Fill each built VM's ``ip`` from its record as its guest gets one, for
    up to ``timeout`` seconds; the names still without one.  A VM built
    without a network interface has none to wait for.  A guest paused or
    crashed for a reason that does not pass by itself (QEMU paused it on an
    error, someone paused it) will get no address: it is waited for no
    longer, and its row gets ``why`` (:func:`paused_why`); ``noticed(vm)``
    is called once for each, as it is seen.  ``read()`` gives the VMs'
    records (default: all of them, from etcd)."""
    from engine.hypervisor.domain.shapes import PASSING
    read = read or (lambda: _read_vms(ctx))
    waiting = [vm for vm in vms if vm.get("host") and not vm.get("error")]
    deadline = time.monotonic() + timeout
    while True:
        records = {vm["uuid"]: vm for vm in read()}
        for vm in waiting:
            record = records.get(vm["uuid"]) or {}
            vm["ip"] = record.get("ip")
            if not vm["ip"] and not vm.get("why") and record.get("state") in ("paused", "error") \
                    and record.get("state_reason") not in PASSING:
                vm["why"] = paused_why(record)
                if noticed:
                    noticed(vm)
        missing = [vm["name"] for vm in waiting if not vm["ip"]]
        if all(vm["ip"] or vm.get("why") for vm in waiting) or time.monotonic() >= deadline:
            return missing
        time.sleep(poll)


ADDRESSED_FIELDS = ["name", "uuid", "host", "state", "error", "ip"]   # boot --wait-ip's rows


def boot_addresses(ctx, automation: str, timeout: float) -> dict:
    """What ``boot --wait-ip`` prints for boot ``automation``: follow it until
    it ends, then wait for the address of each VM it built with a network
    interface (:func:`wait_for_addresses`), all within ``timeout`` seconds;
    ``{automation, state, vms: [{name, uuid, host, state, error, ip}]}``,
    ``ip`` None for a VM without one yet (or none to get)."""
    from . import tasks
    deadline = time.monotonic() + timeout
    task = tasks.get_task(ctx, automation)
    if task.get("kind") != "boot":
        raise Failed(f"automation {automation} is a {task.get('kind')}, not a boot: only a "
                     "boot's VMs get addresses waited for")
    for task in tasks.follow(ctx, automation, timeout=timeout):
        pass
    wired = {vm["name"] for vm in (task.get("args") or {}).get("vms") or []
             if vm.get("networks")}
    vms = [vm for vm in (task.get("result") or {}).get("vms") or [] if vm["name"] in wired]
    if task.get("state") == "done" and vms:
        wait_for_addresses(ctx, vms, max(deadline - time.monotonic(), 0.0))
    return tasks.vm_result(automation, task, ADDRESSED_FIELDS)


def console_target(ctx, pattern: str) -> tuple[dict, str]:
    """The one VM ``pattern`` matches and its host's libvirt URI."""
    from engine.cluster import read_hosts
    try:
        vms = select_vms(lambda: _read_vms(ctx), [pattern])
    except NoMatch as exc:
        raise Failed(str(exc)) from None
    if len(vms) > 1:
        raise UsageError(f"{pattern!r} matches {len(vms)} VMs ("
                         + ", ".join(f"{vm['host']}/{vm['name']}" for vm in vms[:5])
                         + (", ..." if len(vms) > 5 else "") + "): console needs one")
    vm = vms[0]
    record = {h["host"]: h for h in read_hosts(ctx.store())}.get(vm["host"]) or {}
    from engine.hypervisor.host.reachability import reached_at
    uri = reached_at(record)
    if not uri:
        raise Failed(f"no host record for {vm['host']}, the host of VM {vm['name']}: "
                     "its libvirt URI is unknown")
    return vm, uri
