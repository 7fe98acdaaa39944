"""VMs: vmlist, boot, destroy/start/stop/reboot/suspend/resume, ha."""
from __future__ import annotations

import functools

from engine.errors import Failed, UsageError
from engine.operations import vms as ops

from . import table, through
from .context import say
from .follow import VM_RESULT_COLUMNS, act, vm_outcome
from .listing import listing, shown_fields
from .options import detach_option, dry_run_option, listing_options, positive, yes_option

C = table.Column
VM_COLUMNS = [C("host", "Host"), C("name", "Name"), C("uuid", "UUID"),
              C("vcpus", "VCPUs", right=True),
              C("memory_mb", "Memory", table.human_mb, True), C("state", "State"),
              C("disk_gb", "Disk", table.human_gb, True), C("ip", "IP"),
              C("addresses", "Addresses", lambda a: " ".join(
                  x["addr"] if x["prefix"] is None else f"{x['addr']}/{x['prefix']}"
                  for x in a or []) or "-"),
              C("ha", "HA"),
              C("recovered", "Recovered", lambda r: f"from {r['from']}" if r else "-"),
              C("crashed", "Crashed", lambda c: "yes" if c else "-"),
              C("restarts", "Restarts", right=True),
              C("backup", "Backup", lambda b: backup_age(b["time"])),
              C("replica", "Replica", lambda r: replica_shown(r)),
              C("state_reason", "Why"), C("qemu_log", "QEMU log")]
VMLIST_DEFAULT = ["host", "name", "vcpus", "memory_mb", "state", "ip"]
VMLIST_JSON = ops.LISTED


def backup_age(when: str) -> str:
    """How long ago a VM's newest backup was taken (``when``: ISO 8601 UTC)."""
    import time
    from engine.leases.times import human_span, parse_time
    return f"{human_span(time.time() - parse_time(when, 'backup time'))} ago"


def replica_shown(replica: dict) -> str:
    """A VM's replica as vmlist shows it: ``host2 8s ago``; ``host2 down
    2m ago`` (the gap until a new one is made elsewhere); ``none yet``;
    with the last update's error, if any."""
    if replica.get("stopping"):
        return "stopping"
    if replica.get("host") is None:
        shown = "none yet"
    else:
        shown = f"{replica['host']}{'' if replica.get('alive') else ' down'} " \
            f"{backup_age(replica['time'])}"
    return shown + (f" ({replica['error']})" if replica.get("error") else "")


def vm_totals(vms: list[dict]) -> str:
    """The line under vmlist's table, in one pass over the rows."""
    states: dict[str, int] = {}
    hosts = set()
    vcpus = memory_mb = disk_gb = 0
    for vm in vms:
        get = vm.get
        state = (get("state") or "unknown").split(":")[0]     # paused: user counts as paused
        if get("crashed"):
            state += " crashed"
        states[state] = states.get(state, 0) + 1
        hosts.add(get("host"))
        vcpus += get("vcpus") or 0
        memory_mb += get("memory_mb") or 0
        disk_gb += get("disk_gb") or 0
    by_state = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    return (f"{len(vms)} VM{'s' if len(vms) != 1 else ''} ({by_state or 'none'}) on "
            f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} using {vcpus} vCPUs, "
            f"{table.human_mb(memory_mb)} memory and {table.human_gb(disk_gb)} disk")


ALL_COLUMNS = [*VM_COLUMNS, C("managed", "Managed", lambda m: "yes" if m else "no"),
               C("manager", "Manager", lambda m: m or "-"),
               C("problems", "Not adoptable", lambda p: "; ".join(p or []) or "-")]


def cmd_vmlist(ctx) -> int:
    if ctx.args.all:
        from engine.operations import adoption
        read = functools.partial(through.read, ctx, functools.partial(
            adoption.list_all, ctx, ctx.args.patterns), "/v1/vms", pattern=ctx.args.patterns,
            all=True)
        if not ctx.json:
            read = functools.partial(_with_reasons, read)
        return listing(ctx, read, ALL_COLUMNS, [*VMLIST_DEFAULT, "managed"],
                       adoption.ALL_LISTED, ops.ORDER, vm_totals)
    joined = shown_fields(ctx, VM_COLUMNS, VMLIST_DEFAULT, VMLIST_JSON) & set(ops.JOINED)
    read = functools.partial(through.read, ctx, functools.partial(
        ops.list_vms, ctx, ctx.args.patterns, joined), "/v1/vms", pattern=ctx.args.patterns)
    if not ctx.json:
        read = functools.partial(_with_reasons, read)
    return listing(ctx, read, VM_COLUMNS, VMLIST_DEFAULT, VMLIST_JSON, ops.ORDER, vm_totals)


def _with_reasons(read) -> list[dict]:
    """The table's State says why a VM is paused or crashed, as libvirt
    does (``paused: io-error``); JSON keeps ``state`` and ``state_reason``
    apart."""
    from engine.operations.select import NoMatch
    try:
        rows = read()
    except NoMatch as exc:
        exc.matched[:] = [_reasoned(row) for row in exc.matched]
        raise
    return [_reasoned(row) for row in rows]


def _reasoned(row: dict) -> dict:
    return dict(row, state=f"{row['state']}: {row['state_reason']}") \
        if row.get("state_reason") else row


def cmd_boot(ctx) -> int:
    args = ctx.args
    seed = _seed(args)
    plan = through.planned(
        ctx, lambda: ops.plan_boot(ctx, args.names, args.resources, required=args.required,
                                   image=args.image, on=args.on, networks=args.network,
                                   default_network=ctx.settings["network"], seed=seed,
                                   reservation=args.reservation, ha=args.ha,
                                   group=args.group, rule=args.rule),
        "/v1/vms", _boot_body(args, seed), "boot")
    outcome = vm_outcome
    if args.wait_ip:
        if isinstance(plan, through.RemotePlan):    # the peer's default network: unknown here
            wired = set() if args.network == ["none"] else set(args.names)
        else:
            wired = {vm["name"] for vm in plan.args["vms"] if vm.get("networks")}
        outcome = functools.partial(_with_addresses, timeout=args.ip_timeout, wired=wired)
    return act(ctx, plan, outcome, dry_columns=LANDING_COLUMNS, would="would place")


def _boot_body(args, seed: dict | None) -> dict:
    """``POST /v1/vms``'s body for this boot (its route makes the same plan)."""
    body = {"names": args.names, "resources": args.resources, "required": args.required,
            "image": args.image, "on": args.on, "networks": args.network,
            "reservation": args.reservation, "ha": args.ha, "group": args.group,
            "rule": args.rule}
    if seed:
        user_data = seed["user_data"]
        if isinstance(user_data, bytes):
            try:
                user_data = user_data.decode()
            except UnicodeDecodeError:
                raise UsageError(f"--user-data {args.user_data}: not UTF-8 text, which is all "
                                 "the API carries") from None
        body.update(user_data=user_data, ssh_keys=seed["ssh_keys"] or None,
                    hostname=seed["hostname"])
    return {k: v for k, v in body.items() if v is not None}


# boot --dry-run: where each VM would land, as its claim will choose
LANDING_COLUMNS = [C("name", "Name"), C("host", "Host"), C("alternates", "Alternates"),
                   C("error", "Why not")]


def _seed(args) -> dict | None:
    """``--user-data``, ``--ssh-key``, ``--hostname`` read and checked: the
    cloud-init seed's inputs, or None when none is given."""
    if not (args.user_data or args.ssh_key or args.hostname):
        return None
    from engine.hypervisor.domain import seed
    keys = [key for path in args.ssh_key or [] for key in seed.read_ssh_keys(path)]
    if len(keys) > seed.MAX_SSH_KEYS:
        raise UsageError(f"{len(keys)} SSH keys; at most {seed.MAX_SSH_KEYS}")
    return {"hostname": seed.check_hostname(args.hostname) if args.hostname else None,
            "user_data": seed.read_user_data(args.user_data) if args.user_data else None,
            "ssh_keys": keys}


def _with_addresses(ctx, automation: str, task: dict, timeout: float, wired: set) -> int:
    """``boot --wait-ip``: once built, wait until every built VM with a
    network interface has an address, then report with an IP column."""
    vms = [vm for vm in (task.get("result") or {}).get("vms") or [] if vm["name"] in wired]
    missing = []
    if task.get("state") == "done" and vms:
        say(f"waiting up to {timeout:g} s for the address of {len(vms)} "
            f"VM{'s' if len(vms) != 1 else ''}")
        missing = ops.wait_for_addresses(
            ctx, vms, timeout, noticed=lambda vm: say(f"{vm['name']}: {vm['why']}: it will "
                                                      "get no address; not waiting for it"),
            read=functools.partial(through.read, ctx, functools.partial(ops.list_vms, ctx, []),
                                   "/v1/vms"))
    status = vm_outcome(ctx, automation, task, ["name", "uuid", "host", "state", "error", "ip"],
                        VM_RESULT_COLUMNS + [C("ip", "IP")])
    stuck = [vm for vm in vms if vm.get("why") and not vm.get("ip")]
    if stuck:
        raise Failed(f"no address for {stuck[0]['name']}: {stuck[0]['why']}"
                     + (f" (and {len(stuck) - 1} more)" if len(stuck) > 1 else ""))
    if missing:
        raise Failed(f"no address within {timeout:g} s for: {', '.join(missing)} "
                     "(the VMs run; vmlist shows their address once they have one)")
    return status


def backups_kept(ctx, doc: dict, states=ops.ENDED, then: str | None = None) -> list[str]:
    """Under destroy's (or unmanage's) result, one line per VM it ended (in
    ``states``; None: every VM without an error) that has backups; ``then``:
    what to do with them (default: how to delete them)."""
    lines = []
    for row in ops.note_backups_kept(ctx, doc["vms"], states, _backup_counter(ctx)):
        if row.get("backups_kept"):
            n, name = row["backups_kept"], row["name"]
            lines.append(f"{name}: its {n} backup{'s are' if n != 1 else ' is'} kept (backup "
                         f"list {name}); " + (then or "backup delete removes "
                                              + ("them" if n != 1 else "it")))
    return lines


def _backup_counter(ctx):
    """Through the API, ``{uuid: N}`` from ``backup list``'s rows; else None
    (the operations layer reads etcd)."""
    if ctx.api is None:
        return None

    def count(uuids):
        wanted, counts = set(uuids), {}
        if wanted:
            for row in ctx.api.call("GET", "/v1/backups"):
                if row.get("uuid") in wanted:
                    counts[row["uuid"]] = counts.get(row["uuid"], 0) + 1
        return counts
    return count


def cmd_vm_action(ctx) -> int:
    kind = ctx.args.command
    outcome = (functools.partial(vm_outcome, notes=functools.partial(backups_kept, ctx))
               if kind == "destroy" else vm_outcome)
    plan = through.planned(ctx, lambda: ops.plan_action(ctx, kind, ctx.args.patterns),
                           f"/v1/vms/{kind}", {"patterns": ctx.args.patterns}, kind)
    return act(ctx, plan, outcome)


def cmd_ha(ctx) -> int:
    outcome = functools.partial(vm_outcome, fields=["name", "uuid", "host", "ha", "error"],
                                columns=[C("name", "Name"), C("host", "Host"), C("ha", "HA"),
                                         C("uuid", "UUID")], verb="changed")
    plan = through.planned(ctx, lambda: ops.plan_ha(ctx, ctx.args.patterns, ctx.args.policy),
                           "/v1/ha", {"patterns": ctx.args.patterns, "policy": ctx.args.policy},
                           "ha")
    return act(ctx, plan, outcome)


def register(commands) -> None:
    sub = commands.add("vmlist", "list VMs: host, name, vcpus, memory, state",
                       "python peerctl.py vmlist 'host1/*web*' -o name,state,uuid --sort -memory_mb",
                       cmd_vmlist, "List VMs from one read of the cluster state, with a totals "
                       "line. With patterns, only the VMs matching any of them; a pattern "
                       "matching nothing exits 1, after the VMs the others matched.")
    sub.add_argument("patterns", nargs="*", metavar="PATTERN",
                     help="HOSTGLOB/VMGLOB or VMGLOB")
    sub.add_argument("--all", action="store_true",
                     help="also the domains peerctl did not create (foreign: Managed no, "
                          "with why each could not be adopted); JSON rows gain managed, "
                          "manager and problems")
    listing_options(sub, ALL_COLUMNS, "host,name")

    sub = commands.add("boot", "create and start VMs, placed by the cluster",
                       "python peerctl.py boot web1 web2 --resources VCPU:1,MEMORY_MB:256,DISK_GB:1 "
                       "--required '!CUSTOM_SLOW' --on 'host1*'\n"
                       "python peerctl.py boot web3 web4 --resources VCPU:1,MEMORY_MB:256 "
                       "--group web --spread --dry-run", cmd_boot,
                       "Create and start one VM per NAME in one automation: each is placed "
                       "on a host with room for SPEC and the required traits, claimed, "
                       "built and started. --dry-run shows where each would land, and "
                       "its alternates, as the claims will choose, or why no host can take "
                       "it (then it exits 1, as the boot would fail); the boot then asks "
                       "each claim for that host first.")
    sub.add_argument("names", nargs="+", metavar="NAME")
    sub.add_argument("--resources", required=True, metavar="SPEC",
                     help="VCPU:1,MEMORY_MB:256,DISK_GB:1 or resources=...&required=...")
    sub.add_argument("--required", metavar="TRAITS",
                     help="traits the host must (TRAIT) or must not (!TRAIT) have")
    sub.add_argument("--image", metavar="URL",
                     help="disk image to boot from: http(s):// or file:// URL inside the "
                          "image sources (images sources; default: images/ under each "
                          "host's state directory), cached per host; end it with "
                          "#sha256=HEX to have the download checked")
    sub.add_argument("--on", metavar="HOSTGLOB", help="only place on hosts matching this")
    sub.add_argument("--network", action="append", metavar="NAME",
                     help="a network interface on NAME (repeatable, in order; MACs derive "
                          "from the VM's uuid); 'none' for no interface (default: the "
                          "network setting, 'default')")
    sub.add_argument("--user-data", metavar="FILE",
                     help="cloud-init user-data (at most 64 KiB), on a NoCloud seed CD-ROM")
    sub.add_argument("--ssh-key", action="append", metavar="FILE",
                     help="an OpenSSH public key file for the guest (repeatable; default: "
                          "none), in the seed's meta-data public-keys")
    sub.add_argument("--hostname", metavar="NAME",
                     help="the guest's hostname in the seed (default: the VM name)")
    sub.add_argument("--reservation", metavar="LEASE",
                     help="boot into an active lease: on its hosts, or taking one of its "
                          "capacity slots (the VM must fit a slot)")
    sub.add_argument("--ha", choices=("restart", "none"), default="none",
                     help="restart: when the VM's host dies, the VM is fenced there and "
                          "started again on another host, from its image (default none: it "
                          "waits, state unknown, for its host; docs/ha.md)")
    sub.add_argument("--group", metavar="NAME",
                     help="the VMs join group NAME, whose rule every placement keeps "
                          "(boot, migrate, evacuate, HA restart, balance; docs/placement.md)")
    rule = sub.add_mutually_exclusive_group()
    rule.add_argument("--spread", dest="rule", action="store_const", const="spread",
                      help="a new group's rule: at most one of its VMs per host")
    rule.add_argument("--together", dest="rule", action="store_const", const="together",
                      help="a new group's rule: all its VMs on one host")
    sub.add_argument("--wait-ip", action="store_true",
                     help="after the build, wait for each VM's guest address and print it")
    sub.add_argument("--ip-timeout", type=positive, default=300, metavar="SECONDS",
                     help="how long --wait-ip waits (default 300)")
    dry_run_option(sub, "only show where each VM would land, and its alternates; "
                        "claim nothing")
    detach_option(sub)

    for action in ops.VM_ACTIONS:
        caution = (" On more than one VM it lists them and asks for --yes."
                   if action in ops.DESTRUCTIVE else "")
        if action != "destroy":
            caution += (" A VM whose host is down, or that its host lost (missing), is "
                        "refused at once, saying what to do.")
        sub = commands.add(action, f"{action} the VMs matching patterns, in parallel",
                           f"python peerctl.py {action} 'host17/*sql*' --dry-run\n"
                           f"python peerctl.py {action} '*webfront*' --yes", cmd_vm_action,
                           f"{action.capitalize()} every VM matching any PATTERN, all in one "
                           f"automation.{caution} A pattern matching nothing exits 1.")
        sub.add_argument("patterns", nargs="+", metavar="PATTERN",
                         help="HOSTGLOB/VMGLOB or VMGLOB")
        yes_option(sub)
        dry_run_option(sub)
        detach_option(sub)

    sub = commands.add("ha", "set the HA policy of VMs",
                       "python peerctl.py ha 'db*' restart\npython peerctl.py ha 'host3/*' none",
                       cmd_ha, "Set what happens to every VM matching a PATTERN when its host "
                       "dies: restart (fenced there, started again on another host from its "
                       "image; the old disks are kept aside when the host returns) or none (it "
                       "waits for its host, listed as unknown). The VMs' hosts must be up.")
    sub.add_argument("patterns", nargs="+", metavar="PATTERN",
                     help="HOSTGLOB/VMGLOB or VMGLOB")
    sub.add_argument("policy", choices=("restart", "none"), metavar="restart|none")
    detach_option(sub)
