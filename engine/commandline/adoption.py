"""Brownfield: adopt (foreign domains taken under management in place) and
unmanage (VMs let go, left running); ``vmlist --all`` lists them (vms.py)."""
from __future__ import annotations

import functools

from engine.operations import adoption as ops

from . import table, through
from .follow import act, vm_outcome
from .options import detach_option, dry_run_option, yes_option
from .vms import backups_kept

C = table.Column
ADOPT_PLAN_COLUMNS = [C("host", "Host"), C("name", "Name"), C("state", "State"),
                      C("vcpus", "VCPUs", right=True),
                      C("memory_mb", "Memory", table.human_mb, True),
                      C("disk_gb", "Disk", table.human_gb, True), C("uuid", "UUID")]


def cmd_adopt(ctx) -> int:
    plan = through.planned(ctx, lambda: ops.plan_adopt(ctx, ctx.args.patterns, ctx.args.ha),
                           "/v1/adopt", {"patterns": ctx.args.patterns, "ha": ctx.args.ha},
                           "adopt", "domains")
    return act(ctx, plan, functools.partial(vm_outcome, verb="adopted"),
               dry_columns=ADOPT_PLAN_COLUMNS, would="would adopt")


def cmd_unmanage(ctx) -> int:
    plan = through.planned(ctx, lambda: ops.plan_unmanage(ctx, ctx.args.patterns),
                           "/v1/unmanage", {"patterns": ctx.args.patterns}, "unmanage")
    notes = functools.partial(backups_kept, ctx, states=None,
                              then="restore makes a new VM of one")
    return act(ctx, plan, functools.partial(vm_outcome, verb="let go", notes=notes),
               would="would let go")


def register(commands) -> None:
    sub = commands.add(
        "adopt", "take foreign domains under management, in place",
        "python peerctl.py adopt 'host3/legacy-*' --dry-run\n"
        "python peerctl.py adopt host3/db1 --ha restart",
        cmd_adopt,
        "Make peerctl VMs of domains it did not create (vmlist --all lists them, Managed "
        "no), where they are, running or shut off: no restart, no copy. Each one's size "
        "is claimed in placement on its host, peerctl's metadata is written into it and "
        "its record and definition into etcd; from then on every command works on it. "
        "Refused, one line per domain and nothing changed: a domain another manager owns "
        "(its metadata says so), disks peerctl cannot move or back up (block devices, "
        "files in no storage pool, CD-ROMs with media), interfaces on no network the "
        "host offers, a name a peerctl VM has, a claim that does not fit. On more than "
        "one domain it lists them and asks for --yes.")
    sub.add_argument("patterns", nargs="+", metavar="HOST/PATTERN",
                     help="HOSTGLOB/VMGLOB: foreign domains are named by their host")
    sub.add_argument("--ha", choices=("restart", "none"), default="none",
                     help="the adopted VMs' HA policy (default none; docs/ha.md)")
    yes_option(sub)
    dry_run_option(sub)
    detach_option(sub)

    sub = commands.add(
        "unmanage", "let VMs go: they keep running, unmanaged",
        "python peerctl.py unmanage host3/db1\npython peerctl.py unmanage 'legacy-*' --yes",
        cmd_unmanage,
        "The reverse of adopt, for any peerctl VM: it keeps running and stays defined, "
        "with no peerctl metadata; its claim, record and definition are freed, and "
        "peerctl lists it as foreign from then on and never touches it. Its backups "
        "are kept (and counted). Refused while the VM is replicated (replicate --stop "
        "first), in a lease, or its host is down. On more than one VM it lists them "
        "and asks for --yes.")
    sub.add_argument("patterns", nargs="+", metavar="PATTERN", help="HOSTGLOB/VMGLOB or VMGLOB")
    yes_option(sub)
    dry_run_option(sub)
    detach_option(sub)
