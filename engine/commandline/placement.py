"""Placement: placement providers, allocations, candidates (docs/placement.md)."""
from __future__ import annotations

from engine.operations import placement as ops

from . import table, through
from .options import positive

C = table.Column
PROVIDER_COLUMNS = [
    C("name", "Name"), C("uuid", "UUID"), C("generation", "Gen", right=True),
    C("inventories", "Inventory", lambda inv: " ".join(
        f"{rc}:{v.get('total')}" for rc, v in sorted(inv.items()))),
    C("usages", "Used", lambda u: " ".join(f"{rc}:{n}" for rc, n in sorted(u.items()))),
    C("traits", "Traits")]


def _allocations_text(allocations: dict) -> str:
    return " ".join(f"{provider}:" + ",".join(f"{rc}={n}" for rc, n in sorted(res.items()))
                    for provider, res in sorted(allocations.items()))


def _show(ctx, rows, columns) -> int:
    ctx.emit(rows, table.render(rows, columns))
    return 0


def cmd_providers(ctx) -> int:
    return _show(ctx, through.read(ctx, lambda: ops.providers(ctx, ctx.args.hostglob),
                                   "/v1/placement/providers", pattern=ctx.args.hostglob),
                 PROVIDER_COLUMNS)


def cmd_allocations(ctx) -> int:
    return _show(ctx, through.read(ctx, lambda: ops.allocations(ctx, ctx.args.consumer),
                                   "/v1/placement/allocations", consumer=ctx.args.consumer),
                 [C("consumer", "Consumer"), C("allocations", "Allocations", _allocations_text)])


def cmd_candidates(ctx) -> int:
    args = ctx.args
    return _show(ctx, through.read(ctx, lambda: ops.candidates(ctx, args.spec, args.required,
                                                               args.limit),
                                   "/v1/placement/candidates", resources=args.spec,
                                   required=args.required, limit=args.limit),
                 [C("host", "Host"), C("allocations", "Allocations", _allocations_text)])


def register(commands) -> None:
    sub = commands.add("placement", "inspect placement: providers, allocations, candidates",
                       "python peerctl.py placement providers 'host1*'\n"
                       "python peerctl.py placement allocations\n"
                       "python peerctl.py placement candidates VCPU:2,MEMORY_MB:512 --limit 5",
                       None)
    what = commands.verbs(sub)
    p = what.add("providers", "resource providers",
                 "python peerctl.py placement providers 'host1*'", cmd_providers,
                 "List the resource providers (one per host) matching HOSTGLOB: their "
                 "inventories, usages, traits and aggregates.")
    p.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    p = what.add("allocations", "allocations by consumer",
                 "python peerctl.py placement allocations", cmd_allocations,
                 "List what each consumer (a VM, a lease's reservation) holds on which "
                 "provider; with CONSUMER (a uuid), only that one.")
    p.add_argument("consumer", nargs="?", metavar="CONSUMER")
    p = what.add("candidates", "where SPEC would fit, best first",
                 "python peerctl.py placement candidates VCPU:2,MEMORY_MB:512 "
                 "--required HW_CPU_X86_AVX2 --limit 5\n"
                 "python peerctl.py placement candidates "
                 "'resources=VCPU:1&resources1=MEMORY_MB:256&group_policy=none'",
                 cmd_candidates,
                 "List the allocation candidates for SPEC, best first: the hosts where "
                 "it would fit now and what it would take from each provider. SPEC is "
                 "VCPU:1,MEMORY_MB:256 or the whole Placement query language "
                 "(resources=...&required=...&member_of=...&in_tree=...).")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--required", metavar="TRAITS",
                   help="traits the host must (TRAIT) or must not (!TRAIT) have")
    p.add_argument("--limit", type=positive, metavar="N",
                   help="at most N candidates (default: the query's limit=, else 10)")
