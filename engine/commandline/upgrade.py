"""Rolling upgrade: upgrade --to VERSION, upgrade --rollback, and cluster
feature-level (docs/upgrade.md)."""
from __future__ import annotations

from engine.errors import Failed, UsageError
from engine.operations import upgrade as ops
from engine.operations.plans import failed_doc

from . import table, through
from .confirm import confirm
from .follow import run
from .options import detach_option, dry_run_option, positive, seconds, yes_option

C = table.Column


def _seconds(value) -> str:
    return "-" if value is None else f"{float(value):.2f}s"


PLAN_COLUMNS = [C("host", "Host"), C("from", "From"), C("to", "To"), C("state", "State")]
RESULT_COLUMNS = [*PLAN_COLUMNS, C("out_of_service_s", "OutOfService", _seconds, True)]


def upgrade_outcome(ctx, automation: str, task: dict) -> int:
    """``{automation, state, hosts: [{host, from, to, state, out_of_service_s,
    error}]}``; exit 1 unless every host is upgraded or was current."""
    result = task.get("result") or {}
    rows = [{f: row.get(f) for f in ops.HOST_FIELDS} for row in result.get("hosts") or []]
    doc = {"automation": automation, "state": task.get("state"), "hosts": rows}
    if task.get("error"):
        doc["error"] = task["error"]
    columns = RESULT_COLUMNS + ([C("error", "Error")] if any(r["error"] for r in rows) else [])
    done = sum(r["state"] in ("upgraded", "current") for r in rows)
    text = (table.render(rows, columns) + "\n" if rows else "") + \
        f"automation {automation} {task.get('state')}: {done} of {len(rows)} hosts on the release"
    ctx.emit(doc, text)
    if task.get("state") != "done":
        raise Failed(f"upgrade {automation} {task.get('state')}"
                     + (f": {task['error']}" if task.get("error") else ""))
    return 0


def cmd_upgrade(ctx) -> int:
    args = ctx.args
    if bool(args.to) == bool(args.rollback):
        raise UsageError("upgrade needs --to VERSION or --rollback (one of them)")
    def direct():
        if args.rollback:
            return ops.plan_rollback(ctx, args.hostglob, parallel=args.parallel,
                                     deadline=args.deadline)
        return ops.plan_upgrade(ctx, args.to, args.hostglob, parallel=args.parallel,
                                deadline=args.deadline)
    body = {"to": args.to, "rollback": args.rollback or None, "hosts": args.hostglob,
            "parallel": args.parallel, "deadline": args.deadline}
    plan = through.planned(ctx, direct, "/v1/upgrade",
                           {k: v for k, v in body.items() if v is not None}, "upgrade",
                           "hosts", "hosts")
    if args.dry_run:
        verb = "roll back" if args.rollback else f"move to {args.to}"
        ctx.emit(plan.dry_run(), table.render(plan.targets, PLAN_COLUMNS)
                 + f"\nupgrade would {verb} {len(plan.targets)} host"
                   f"{'s' if len(plan.targets) != 1 else ''}, {args.parallel} at a time")
        return 0
    if plan.ask and not args.yes:
        confirm("upgrade", [f"{r['host']}: {r['from']} -> {r['to']}" for r in plan.targets],
                "hosts", cancelled=failed_doc("hosts", "cancelled"))
    return run(ctx, plan, upgrade_outcome)


def cmd_feature_level(ctx) -> int:
    level = ctx.args.level
    if level is None:
        doc = through.read(ctx, lambda: ops.feature_level(ctx), "/v1/cluster/feature-level")
    else:
        doc = through.write(ctx, lambda: ops.raise_feature_level(ctx, level), "POST",
                            "/v1/cluster/feature-level", {"level": level})
    lines = [table.render(doc["hosts"], [C("host", "Host"), C("version", "Version"),
                                          C("feature_level", "Supports", right=True)]),
             f"cluster feature level {doc['level']}"
             + (f" (was {doc['previous']})" if doc.get("previous") not in (None, doc["level"])
                else "")
             + (f"; every live host supports up to {doc['supported']}"
                if doc["supported"] is not None else "")]
    ctx.emit(doc, "\n".join(lines))
    return 0


def cmd_verify(ctx) -> int:
    from engine.operations.verify import verify
    found = through.write(ctx, lambda: verify(ctx), "POST", "/v1/cluster/verify", {})
    problems = found["problems"]
    lines = [f"{p['check']}: {p['problem']}" for p in problems]
    skipped: dict[str, list[str]] = {}
    for s in found["skipped"]:
        skipped.setdefault(s["what"], []).append(s["host"])
    if skipped:
        lines.append("skipped (no TCP endpoint to probe): " + "; ".join(
            f"{what} of {', '.join(hosts)}" for what, hosts in skipped.items()))
    if problems:
        lines.append(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} "
                     f"({found['hosts']} hosts)")
    else:
        lines.append(f"no problem found: {found['hosts']} host"
                     f"{'s' if found['hosts'] != 1 else ''}; checked "
                     f"{', '.join(found['checked'])}")
    ctx.emit(found, "\n".join(lines))
    return 1 if problems else 0


def register(commands) -> None:
    sub = commands.add(
        "upgrade", "move hosts to another release of peerctl, one at a time, nothing stopped",
        "python peerctl.py upgrade --to 0.2.0 --dry-run\n"
        "python peerctl.py upgrade --to 0.2.0 --yes\n"
        "python peerctl.py upgrade --to 0.2.0 'rack1-*' --parallel 2 --yes\n"
        "python peerctl.py upgrade --rollback --yes", cmd_upgrade,
        "Hand each live host matching HOSTGLOB over to release VERSION (code add stores "
        "one; code list shows them), N hosts at a time (--parallel), as one automation. Each "
        "host installs the release under its state directory (checking its sha256), and "
        "its peer hands over to a process of the release on the same lease: the host "
        "never looks dead, its VMs keep running, its HA guard stays quiet. The next host "
        "starts once this one is back (host record, guard, its VMs listed). A host whose "
        "new release does not come up within --deadline is taken back by its old "
        "process and the upgrade stops, saying why. --rollback returns hosts to the "
        "release each ran before, while the cluster's feature level allows it.")
    sub.add_argument("hostglob", nargs="?", metavar="HOSTGLOB",
                     help="only the hosts matching this (default all)")
    sub.add_argument("--to", metavar="VERSION", help="the release to run (code list)")
    sub.add_argument("--rollback", action="store_true",
                     help="return hosts to the release they ran before")
    sub.add_argument("--parallel", type=positive, default=1, metavar="N",
                     help="hosts handed over at the same time (default 1)")
    sub.add_argument("--deadline", type=seconds, metavar="SECONDS",
                     help="how long a host's new release has to come up before it is "
                          "rolled back (default 60)")
    yes_option(sub, "do not ask before upgrading")
    dry_run_option(sub, "only print which hosts would move, from what to what")
    detach_option(sub)

    sub = commands.add(
        "cluster", "the cluster as a whole: its feature level, and what is wrong with it",
        "python peerctl.py cluster verify\n"
        "python peerctl.py cluster feature-level\n"
        "python peerctl.py cluster feature-level 2", None,
        "verify: one line per problem (etcd's members, hosts down, mixed versions, hosts' "
        "libvirt URIs, networks, disk space, storage pools, certificates, and from the "
        "hosts every pair's libvirt and migration ports and clocks), exit 1 if any. "
        "feature-level: the level says which shapes peers may write. New code keeps "
        "writing the old shapes until the level is raised, so two releases run side by "
        "side and a host can go back to its previous release until then.")
    what = commands.verbs(sub)
    what.add("verify", "say what is wrong with the cluster, one line per problem",
             "python peerctl.py cluster verify", cmd_verify,
             "Checks etcd (every member answers, no alarm, at least 3 members), the hosts "
             "(none down; one version and feature level; each host's libvirt_remote "
             "reachable from the others' machines and its own; the same networks "
             "offered everywhere; 10 % of disk free at least; each storage pool's free "
             "space covering what its VMs' thin disks may still grow into) and "
             "certificates (this command's and etcd's, 30 days at least). Then every live "
             "host, through one automation, connects to every other host's libvirt and "
             "migration port and reads its clock: a pair that cannot connect, or a clock "
             "more than 0.5 s off the hosts' median, is a problem; an endpoint with no TCP "
             "port (test:///default, qemu:///system) is listed as skipped. One line per "
             "problem, exit 1 if any; none: one line saying what was checked. Records each "
             "host's outcome, which hostlist shows as verify.")
    p = what.add("feature-level", "show the cluster's feature level, or raise it to N",
                 "python peerctl.py cluster feature-level 2", cmd_feature_level,
                 "Without N: the level, and each live host's version and the highest level "
                 "it supports. With N: raise the level to N, refused (naming them) while "
                 "any live host does not support N. The level never goes down; once "
                 "raised, upgrade --rollback is refused for hosts whose previous release "
                 "does not support it.")
    p.add_argument("level", nargs="?", type=positive, metavar="N")
