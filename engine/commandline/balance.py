"""Balance: even out hosts with live migrations, show the plan first, and
the cluster's ``--auto`` setting (docs/balance.md)."""
from __future__ import annotations

import argparse
import math

from engine.errors import Failed, UsageError
from engine.operations import balance as ops
from engine.operations.plans import failed_doc

from . import table, through
from .confirm import confirm
from .follow import act
from .options import detach_option, dry_run_option, positive, yes_option

C = table.Column


def _gain(value) -> str:
    return f"{float(value):.4f}"


PLAN_COLUMNS = [C("vm", "VM"), C("from", "From"), C("to", "To"), C("gain", "Gain", _gain, True),
                C("set", "Set", right=True)]
RESULT_COLUMNS = [*PLAN_COLUMNS, C("state", "State")]


def _score(value) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def _sets(sets: list[list[str]]) -> list[str]:
    if not sets:
        return []
    return ["sets (a set's moves touch disjoint hosts and run together; sets run in order):",
            *(f"  {n}: {' '.join(hosts)}" for n, hosts in enumerate(sets))]


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def show_plan(ctx, plan: ops.BalancePlan, state: str = "dry-run") -> int:
    """The plan as a table, the scores and the sets; no moves: one line."""
    doc = dict(plan.dry_run(), state=state)
    rows = doc["moves"]
    if not rows:
        ctx.emit(doc, f"balance: nothing to move (score {_score(doc['score_before'])}: "
                      f"no allowed move lowers it enough)")
        return 0
    lines = [table.render(rows, PLAN_COLUMNS),
             f"balance would make {_plural(len(rows), 'move')}: score "
             f"{_score(doc['score_before'])} -> {_score(doc['score_after'])}",
             *_sets(doc["sets"])]
    ctx.emit(doc, "\n".join(lines))
    return 0


def balance_outcome(ctx, automation: str, task: dict) -> int:
    """A balance's result: ``{automation, state, score_before, score_planned,
    score_after, moves: [{vm, uuid, from, to, gain, set, state, error}]}``;
    exit 1 unless it is done with no move failed."""
    result = task.get("result") or {}
    rows = [{f: row.get(f) for f in ops.RESULT_FIELDS} for row in result.get("moves") or []]
    doc = {"automation": automation, "state": task.get("state"),
           **{k: result.get(k) for k in ("score_before", "score_planned", "score_after")},
           "moves": rows}
    if task.get("error"):
        doc["error"] = task["error"]
    columns = RESULT_COLUMNS + ([C("error", "Error")] if any(r["error"] for r in rows) else [])
    count = {state: sum(r["state"] == state for r in rows)
             for state in ("moved", "skipped", "failed", "aborted")}
    summary = ", ".join(f"{n} {state}" for state, n in count.items() if n and state != "moved")
    text = (table.render(rows, columns) + "\n" if rows else "") + \
        (f"automation {automation} {task.get('state')}: {count['moved']} of "
         f"{_plural(len(rows), 'move')} made" + (f", {summary}" if summary else "")
         + f"; score {_score(doc['score_before'])} -> {_score(doc['score_after'])} "
           f"(planned {_score(doc['score_planned'])})")
    ctx.emit(doc, text)
    if task.get("state") != "done" or count["failed"]:
        raise Failed(f"balance {automation} {task.get('state')}"
                     + (f": {task['error']}" if task.get("error") else ""))
    return 0


def _settings(ctx) -> int:
    """``--auto on|off|show`` with ``--threshold``, ``--rounds``, ``--hold``."""
    args = ctx.args
    tuning = {"threshold": args.threshold, "rounds": args.rounds, "hold": args.hold}
    if args.hostglob is not None or args.dry_run or args.max_moves is not None or args.yes:
        raise UsageError("--auto takes no HOSTGLOB, --dry-run, --max-moves or --yes "
                         "(it changes a setting; run balance without it to balance now)")
    if args.auto in (None, "show") and any(v is not None for v in tuning.values()):
        raise UsageError("--threshold, --rounds and --hold go with --auto on or --auto off")
    if ctx.api is not None:
        body = {"auto": args.auto, "threshold": args.threshold, "rounds": args.rounds,
                "hold": args.hold}
        doc = ctx.api.call("GET", "/v1/balance/auto") if args.auto == "show" else \
            ctx.api.call("POST", "/v1/balance/auto",
                         body={k: v for k, v in body.items() if v is not None})
    elif args.auto == "show":
        doc = ops.balance_settings(ctx)
    else:
        from engine.core.validate import parse_duration
        hold = parse_duration(args.hold, "--hold") if args.hold is not None else None
        doc = ops.set_balance_settings(ctx, auto=args.auto == "on", threshold=args.threshold,
                                       rounds=args.rounds, hold=hold)
    lines = [f"balance --auto {'on' if doc['auto'] else 'off'}: threshold "
             f"{doc['threshold']:g}, {_plural(doc['rounds'], 'round')} above it, "
             f"hold {doc['hold']:g}s"]
    status = doc.get("status")
    if status:
        lines.append(f"balancer on {status['host']}, round {status['round']} at "
                     f"{status['time']}: " + ("a balance runs" if status.get("busy") else
                                             f"score {_score(status['score'])}, "
                                             f"{status['above']} round(s) above")
                     + (f"; last started {status['started']}" if status.get("started")
                        else ""))
    ctx.emit(doc, "\n".join(lines))
    return 0


def cmd_balance(ctx) -> int:
    args = ctx.args
    if args.auto is not None or any(v is not None for v in (args.threshold, args.rounds,
                                                              args.hold)):
        return _settings(ctx)
    body = {"hosts": args.hostglob, "max_moves": args.max_moves, "parallel": args.parallel}
    plan = through.planned(ctx, lambda: ops.plan_balance(ctx, args.hostglob,
                                                         max_moves=args.max_moves,
                                                         parallel=args.parallel),
                           "/v1/balance", {k: v for k, v in body.items() if v is not None},
                           "balance", "moves", "moves")
    if args.dry_run:
        return show_plan(ctx, plan)
    if isinstance(plan, through.RemotePlan) and plan.answer is not None:
        plan.dry = plan.answer          # nothing to move: the peer started nothing
        return show_plan(ctx, plan, "done")
    if not plan.targets and not isinstance(plan, through.RemotePlan):
        return show_plan(ctx, plan, "done")
    if plan.ask and not args.yes:
        confirm("balance", [f"{m['vm']}: {m['from']} -> {m['to']} (set {m['set']})"
                            for m in plan.targets], "moves",
                cancelled=failed_doc("moves", "cancelled"))
    plan.ask = False        # asked above
    return act(ctx, plan, balance_outcome)


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a score above 0: {text!r}")
    return value


def register(commands) -> None:
    sub = commands.add(
        "balance", "even out hosts with live migrations, showing the plan first",
        "python peerctl.py balance --dry-run\n"
        "python peerctl.py balance 'rack1-*' --max-moves 10 --yes\n"
        "python peerctl.py balance --auto on --threshold 0.2 --rounds 3 --hold 2h",
        cmd_balance,
        "Plan live migrations that lower the cluster's score (the spread of the hosts' "
        "used share of memory, vCPUs and disk; docs/balance.md), greedily, one move "
        "ahead, each move gaining at least the minimum and respecting every rule a "
        "migrate does (capacity, traits, drains, leases, groups); then run them as one "
        "automation: the plan's sets in order, each set's moves (disjoint hosts) N at a "
        "time (--parallel). Each move is checked again just before it runs and skipped, "
        "with the reason, when it is no longer good. A VM a balance moved is not moved "
        "by another for the hold time (--hold). HOSTGLOB: only VMs on matching hosts "
        "move, only between them. --dry-run prints the plan: each move with its gain "
        "and set, the score before and after, the sets. A real run lists the moves and "
        "asks for --yes. --auto on|off: a cluster setting: the balancer starts a balance "
        "by itself when the score stays above --threshold for --rounds rounds in a row "
        "(--auto show prints the settings).")
    sub.add_argument("hostglob", nargs="?", metavar="HOSTGLOB",
                     help="only balance between the hosts matching this (default all)")
    sub.add_argument("--max-moves", type=positive, metavar="N",
                     help="plan at most N moves (the best first)")
    sub.add_argument("--parallel", type=positive, default=4, metavar="N",
                     help="moves of one set made at the same time (default 4)")
    sub.add_argument("--auto", choices=("on", "off", "show"),
                     help="balance by itself when the score stays high (a cluster setting)")
    sub.add_argument("--threshold", type=_threshold, metavar="SCORE",
                     help="with --auto: the score above which it balances")
    sub.add_argument("--rounds", type=positive, metavar="N",
                     help="with --auto: rounds in a row above the threshold first (default 3)")
    sub.add_argument("--hold", metavar="DURATION",
                     help="with --auto on|off: how long a moved VM is left where it is by "
                          "every balance (30m, 2h; default 1h)")
    yes_option(sub, "do not ask before moving")
    dry_run_option(sub, "only print the plan")
    detach_option(sub)
