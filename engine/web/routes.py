"""The API's routes, one per command of the contract, each a thin call of
the operations layer (engine/operations/) answering the JSON that the
command's ``--format json`` prints.

A route is a :class:`Route`: its method and path, whether it writes (a
viewer is refused before it runs), the JSON Schema of its body (unknown
fields and wrong types are refused before it runs) and its query
parameters, and a handler ``handler(ctx, call) -> Answer`` that runs on the
server's pool of threads, where blocking on etcd is fine.  The table also
feeds the OpenAPI document (:mod:`.openapi`).

A write that starts an automation answers ``202 {"automation": ID}`` with
``Location: /v1/automations/ID``.  Work that the command line asks a person
to confirm (several VMs, a whole host) needs ``"yes": true`` in the body,
else ``409`` says what it would act on; ``"dry_run": true`` answers the
plan as ``--dry-run`` prints it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from engine.errors import Failed, NoSuch, UsageError
from engine.natural import sort_rows
from engine.operations import adoption, balance, groups, hosts, tasks, vms
from engine.operations.moves import MAX_DOWNTIME_RANGE_MS
from engine.operations.plans import Plan

__all__ = ["Route", "Call", "Answer", "ROUTES", "Refusal"]


@dataclasses.dataclass
class Call:
    """One request as a handler sees it: path parameters, query parameters
    (each a list of its values), the checked JSON body, and who asks."""
    path: dict
    query: dict
    body: dict
    role: str
    user: str

    def one(self, name: str, default=None):
        values = self.query.get(name) or []
        return values[-1] if values else default

    def flag(self, name: str) -> bool:
        value = self.one(name)
        if value in (None, "", "0", "false", "no"):
            return False
        if value in ("1", "true", "yes"):
            return True
        raise UsageError(f"bad value {value!r} for query parameter {name} (want true or false)")


@dataclasses.dataclass
class Answer:
    doc: object
    status: int = 200
    location: str | None = None


class Refusal(Failed):
    """A request the API answers with ``status`` and one line (and the
    fields of ``more``, beside ``error``)."""

    def __init__(self, status: int, message: str, more: dict | None = None):
        super().__init__(message)
        self.status = status
        self.more = more


MOST_NAMED = 10     # targets a confirmation's one line names; the rest are counted


def _label(row: dict) -> str:
    """One target as the command line's confirmation lists it."""
    if "name" in row:
        host = row.get("host") or row.get("from")
        return f"{host}/{row['name']}" if host else row["name"]
    if "vm" in row and "from" in row:
        return f"{row['vm']}: {row['from']} -> {row.get('to')}"
    return str(row.get("id") or row.get("host") or row.get("vm") or row)


def unconfirmed(verb: str, labels: list[str], what: str, how: str = '"yes": true',
                targets: list | None = None) -> Refusal:
    """The 409 of work that needs confirming: what it would act on, by name
    (the first :data:`MOST_NAMED`), and how to confirm; ``targets``, the
    rows a dry run lists, go beside the error."""
    named = ", ".join(labels[:MOST_NAMED]) + (
        f" and {len(labels) - MOST_NAMED} more" if len(labels) > MOST_NAMED else "")
    if len(labels) == 1:
        what = what.rstrip("s")
    return Refusal(409, f"{verb} would act on {len(labels)} {what} ({named}): send {how} "
                   "to confirm", {"targets": targets if targets is not None else labels})


@dataclasses.dataclass
class Route:
    method: str
    path: str
    handler: Callable
    summary: str
    command: str                   # the command line's equivalent, for the docs
    write: bool = False
    body: dict | None = None       # JSON Schema of the body; None: no body
    query: tuple = ()              # (name, type, description)
    automation: bool = False       # answers 202 with the automation's Location
    waits: bool = False            # may block for long: runs on the pool of waits


ROUTES: list[Route] = []


def route(method, path, summary, command, **options):
    def register(handler):
        ROUTES.append(Route(method, path, handler, summary, command, **options))
        return handler
    return register


def _obj(properties: dict, required=()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


STRING = {"type": "string"}
STRINGS = {"type": "array", "items": {"type": "string"}}
PATTERNS = {"type": "array", "items": {"type": "string"}, "minItems": 1}
BOOL = {"type": "boolean"}
POSITIVE = {"type": "integer", "minimum": 1}
CONFIRM = {"yes": BOOL, "dry_run": BOOL}


def _listed(rows: list[dict], fields: list[str], order: str) -> list[dict]:
    """The command line's JSON listing: sorted as it sorts, its fields only
    (``zip``/``map``: twice as fast as a dict comprehension on 10,000 rows)."""
    return [dict(zip(fields, map(row.get, fields))) for row in sort_rows(rows, order, fields)]


def _started(ctx, plan: Plan, body: dict) -> Answer:
    """A planned automation: its dry run, a refusal until confirmed, or
    started (202 with its Location)."""
    if body.get("dry_run"):
        return Answer(plan.dry_run())
    if plan.ask and not body.get("yes"):
        if not plan.targets and plan.args.get("hosts"):     # an evacuation of empty hosts
            raise unconfirmed(plan.kind, list(plan.args["hosts"]), "hosts")
        raise unconfirmed(plan.kind, [_label(row) for row in plan.targets], plan.what,
                          targets=plan.targets)
    automation = tasks.start(ctx, plan)
    return Answer({"automation": automation}, 202, f"/v1/automations/{automation}")


# -- VMs --------------------------------------------------------------------

@route("GET", "/v1/vms", "list VMs", "vmlist [PATTERN...] [--all]",
       query=(("pattern", "string[]", "HOSTGLOB/VMGLOB or VMGLOB, repeatable"),
              ("all", "boolean", "foreign domains too, with managed, manager and problems")))
def list_vms(ctx, call: Call) -> Answer:
    patterns = call.query.get("pattern") or []
    if call.flag("all"):
        return Answer(_listed(adoption.list_all(ctx, patterns), adoption.ALL_LISTED,
                              vms.ORDER))
    return Answer(_listed(vms.list_vms(ctx, patterns), vms.LISTED, vms.ORDER))


@route("GET", "/v1/vms/{name}", "one VM", "vmlist NAME")
def show_vm(ctx, call: Call) -> Answer:
    from engine.operations.specs import check_name
    name = check_name(call.path["name"])
    rows = [row for row in vms.list_vms(ctx, [name]) if row["name"] == name]
    if not rows:
        raise NoSuch(f"no VM {name!r}")
    return Answer(_listed(rows, vms.LISTED, vms.ORDER)[0])


BOOT = _obj({"names": {"type": "array", "items": STRING, "minItems": 1},
             "resources": STRING, "required": STRING, "image": STRING, "on": STRING,
             "networks": STRINGS, "reservation": STRING,
             "ha": {"enum": ["restart", "none"]}, "group": STRING,
             "rule": {"enum": ["spread", "together"]}, "dry_run": BOOL},
            ["names", "resources"])


@route("POST", "/v1/vms", "boot VMs", "boot NAME... --resources SPEC --detach", write=True,
       body=BOOT, automation=True)
def boot(ctx, call: Call) -> Answer:
    body = call.body
    plan = vms.plan_boot(ctx, body["names"], body["resources"], required=body.get("required"),
                         image=body.get("image"), on=body.get("on"),
                         networks=body.get("networks"),
                         default_network=ctx.default_network,
                         reservation=body.get("reservation"), ha=body.get("ha", "none"),
                         group=body.get("group"), rule=body.get("rule"))
    return _started(ctx, plan, body)


@route("GET", "/v1/groups", "list VM groups", "group list")
def list_groups(ctx, call: Call) -> Answer:
    return Answer(groups.list_groups(ctx))


@route("GET", "/v1/groups/{name}", "one VM group", "group show NAME")
def show_group(ctx, call: Call) -> Answer:
    return Answer(groups.show_group(ctx, call.path["name"]))


ACTION = _obj({"patterns": PATTERNS, **CONFIRM}, ["patterns"])


@route("POST", "/v1/vms/{action}", "destroy, start, stop, reboot, suspend or resume VMs",
       "destroy|start|stop|reboot|suspend|resume PATTERN... --detach", write=True,
       body=ACTION, automation=True)
def vm_action(ctx, call: Call) -> Answer:
    action = call.path["action"]
    if action not in vms.VM_ACTIONS:
        raise Refusal(404, f"no such VM action {action!r} (want {', '.join(vms.VM_ACTIONS)})")
    return _started(ctx, vms.plan_action(ctx, action, call.body["patterns"]), call.body)


HA = _obj({"patterns": PATTERNS, "policy": {"enum": ["restart", "none"]}},
          ["patterns", "policy"])


@route("POST", "/v1/ha", "set the HA policy of VMs", "ha PATTERN... restart|none --detach",
       write=True, body=HA, automation=True)
def set_ha(ctx, call: Call) -> Answer:
    return _started(ctx, vms.plan_ha(ctx, call.body["patterns"], call.body["policy"]),
                    call.body)


ADOPT = _obj({"patterns": PATTERNS, "ha": {"enum": ["restart", "none"]}, **CONFIRM},
             ["patterns"])


@route("POST", "/v1/adopt", "adopt foreign domains in place",
       "adopt HOST/PATTERN... [--ha restart|none] --detach", write=True, body=ADOPT,
       automation=True)
def adopt(ctx, call: Call) -> Answer:
    return _started(ctx, adoption.plan_adopt(ctx, call.body["patterns"],
                                             call.body.get("ha", "none")), call.body)


@route("POST", "/v1/unmanage", "let VMs go: they keep running, unmanaged",
       "unmanage PATTERN... --detach", write=True, body=ACTION, automation=True)
def unmanage(ctx, call: Call) -> Answer:
    return _started(ctx, adoption.plan_unmanage(ctx, call.body["patterns"]), call.body)


# -- hosts --------------------------------------------------------------------

HOSTGLOB = (("pattern", "string", "a glob on host names"),)


@route("GET", "/v1/hosts", "list hosts", "hostlist [HOSTGLOB]", query=HOSTGLOB)
def list_hosts(ctx, call: Call) -> Answer:
    return Answer(_listed(hosts.list_hosts(ctx, call.one("pattern")), hosts.LISTED,
                          hosts.ORDER))


@route("GET", "/v1/hoststats", "host usage", "hoststats [HOSTGLOB]", query=HOSTGLOB)
def host_stats(ctx, call: Call) -> Answer:
    return Answer(_listed(hosts.list_hosts(ctx, call.one("pattern")), hosts.STATS,
                          hosts.ORDER))


PING = _obj({"hosts": STRING, "rounds": POSITIVE})


@route("POST", "/v1/ping", "round trips to live hosts", "ping [HOSTGLOB] [--rounds N] --detach",
       write=True, body=PING, automation=True)
def ping(ctx, call: Call) -> Answer:
    return _started(ctx, hosts.plan_ping(ctx, call.body.get("hosts"),
                                         call.body.get("rounds", 1)), call.body)


# -- moves ----------------------------------------------------------------------

BALANCE = _obj({"hosts": STRING, "max_moves": POSITIVE, "parallel": POSITIVE, **CONFIRM})


@route("POST", "/v1/balance", "even out hosts with live migrations",
       "balance [HOSTGLOB] [--max-moves N] [--parallel N] --detach", write=True, body=BALANCE,
       automation=True)
def start_balance(ctx, call: Call) -> Answer:
    body = call.body
    plan = balance.plan_balance(ctx, body.get("hosts"), max_moves=body.get("max_moves"),
                                parallel=body.get("parallel", 4))
    if not plan.targets and not body.get("dry_run"):
        return Answer({**plan.dry_run(), "state": "done"})      # nothing to move: nothing started
    return _started(ctx, plan, body)


MIGRATE = _obj({"patterns": PATTERNS, "to": STRING, "offline": BOOL, "parallel": POSITIVE,
                "bandwidth_mib": POSITIVE, "postcopy": BOOL,
                "max_downtime_ms": {"type": "integer", "minimum": MAX_DOWNTIME_RANGE_MS[0],
                                    "maximum": MAX_DOWNTIME_RANGE_MS[1]},
                **CONFIRM}, ["patterns"])


@route("POST", "/v1/migrate", "move VMs to other hosts", "migrate PATTERN... --detach",
       write=True, body=MIGRATE, automation=True)
def migrate(ctx, call: Call) -> Answer:
    from engine.operations import moves
    body = call.body
    plan = moves.plan_migrate(ctx, body["patterns"], body.get("to"),
                              offline=body.get("offline", False),
                              parallel=body.get("parallel", 4),
                              bandwidth_mib=body.get("bandwidth_mib"),
                              postcopy=body.get("postcopy", False),
                              max_downtime_ms=body.get("max_downtime_ms"))
    return _started(ctx, plan, body)


@route("POST", "/v1/hosts/{pattern}/drain", "drain hosts: no new VMs land there",
       "drain HOSTGLOB --yes", write=True, body=_obj(dict(CONFIRM)))
def drain(ctx, call: Call) -> Answer:
    return _drain(ctx, call, True)


@route("POST", "/v1/hosts/{pattern}/undrain", "undrain hosts", "undrain HOSTGLOB",
       write=True, body=_obj({}))
def undrain(ctx, call: Call) -> Answer:
    return _drain(ctx, call, False)


def _drain(ctx, call: Call, drained: bool) -> Answer:
    from engine.operations import moves
    names = [h["host"] for h in moves.plan_drain(ctx, call.path["pattern"])]
    if drained and call.body.get("dry_run"):
        return Answer({"hosts": [{"host": h, "drained": True} for h in names],
                       "state": "dry-run"})
    if drained and len(names) > 1 and not call.body.get("yes"):
        raise unconfirmed("drain", names, "hosts")
    return Answer({"hosts": moves.set_drained(ctx, names, drained, by=call.user)})


EVACUATE = _obj({"to": STRING, "parallel": POSITIVE, **CONFIRM})


@route("POST", "/v1/hosts/{pattern}/evacuate", "drain hosts and move every VM off them",
       "evacuate HOSTGLOB --yes --detach", write=True, body=EVACUATE, automation=True)
def evacuate(ctx, call: Call) -> Answer:
    from engine.operations import moves
    body = call.body
    plan = moves.plan_evacuate(ctx, call.path["pattern"], body.get("to"),
                               body.get("parallel", 4), planned=bool(body.get("dry_run")))
    if body.get("dry_run") or (plan.ask and not body.get("yes")):
        return _started(ctx, plan, body)
    planned = moves.evacuate_after_drain(ctx, plan, by=call.user)
    if planned is None:
        return Answer({"automation": None, "state": "done", "vms": []})
    planned.ask = False
    return _started(ctx, planned, body)


@route("POST", "/v1/hosts/{name}/remove", "take a host out of the cluster for good",
       "host remove NAME --yes", write=True, body=_obj(CONFIRM))
def remove_host(ctx, call: Call) -> Answer:
    """No evacuation here (``POST /v1/hosts/{name}/evacuate`` first): a host
    with VMs is refused, as the command line refuses it without --evacuate."""
    from engine.operations import host_removal
    removal = host_removal.plan_removal(ctx, call.path["name"])
    if removal.done:
        return Answer({**host_removal.dry_run(removal, []), "state": "done"})
    host_removal.refuse_what_blocks(removal, evacuate=False)
    if call.body.get("dry_run"):
        return Answer(host_removal.dry_run(removal, []))
    if not call.body.get("yes"):
        raise unconfirmed(f"host remove {removal.host}", removal.removed, "changes")
    return Answer(host_removal.remove_host(ctx, removal.host, by=call.user))


# -- automations --------------------------------------------------------------------

@route("GET", "/v1/tasks", "list automations", "tasks [--all]",
       query=(("all", "boolean", "ended ones too"),))
def list_tasks(ctx, call: Call) -> Answer:
    return Answer(_listed(tasks.list_tasks(ctx, include_finished=call.flag("all")),
                          tasks.LISTED, tasks.ORDER))


@route("GET", "/v1/automations/{id}", "one automation with its log", "task ID")
def get_task(ctx, call: Call) -> Answer:
    return Answer(_known(ctx, call.path["id"]))


def _known(ctx, automation: str) -> dict:
    try:
        return tasks.get_task(ctx, automation)
    except Failed as exc:
        raise Refusal(404, str(exc)) from None


MAX_WAIT = 300.0


@route("GET", "/v1/automations/{id}/wait", "wait until an automation ends",
       "wait ID [--timeout S]", waits=True,
       query=(("timeout", "number", f"seconds, at most {MAX_WAIT:g} (default 30)"),))
def wait(ctx, call: Call) -> Answer:
    automation = call.path["id"]
    _known(ctx, automation)
    text = call.one("timeout", "30")
    try:
        timeout = float(text)
    except ValueError:
        raise UsageError(f"bad timeout {text!r}: want seconds") from None
    if not 0 <= timeout <= MAX_WAIT:
        raise UsageError(f"bad timeout {text!r}: 0 to {MAX_WAIT:g} seconds")
    last = None
    for last in tasks.follow(ctx, automation, timeout=timeout):
        pass
    return Answer(last)


@route("DELETE", "/v1/automations/{id}", "ask an automation to stop", "abort ID", write=True)
def abort(ctx, call: Call) -> Answer:
    _known(ctx, call.path["id"])
    return Answer(tasks.abort(ctx, call.path["id"]))


# -- leases ---------------------------------------------------------------------------

@route("GET", "/v1/leases", "list leases", "lease list [PATTERN]",
       query=(("pattern", "string", "a glob on lease names"),))
def list_leases(ctx, call: Call) -> Answer:
    from engine.operations import lease_docs, leases
    return Answer(_listed(leases.list_leases(ctx, call.one("pattern")),
                          lease_docs.LEASE_FIELDS, "start,lease"))


@route("GET", "/v1/leases/{name}", "one lease", "lease show NAME")
def show_lease(ctx, call: Call) -> Answer:
    from engine.operations import leases
    return Answer(leases.show(ctx, call.path["name"]))


LEASE = _obj({"name": STRING, "start": STRING, "end": STRING, "hosts": POSITIVE,
              "resources": STRING, "amount": POSITIVE, "required": STRING, "on": STRING,
              "on_end": {"enum": ["destroy", "stop", "keep"]}, "warn": STRING},
             ["name", "start", "end"])


@route("POST", "/v1/leases", "reserve hosts or capacity", "lease create NAME ...",
       write=True, body=LEASE)
def create_lease(ctx, call: Call) -> Answer:
    from engine.operations import leases
    b = call.body
    return Answer(leases.create(ctx, b["name"], b["start"], b["end"], hosts=b.get("hosts"),
                                resources=b.get("resources"), amount=b.get("amount"),
                                required=b.get("required"), on=b.get("on"),
                                on_end=b.get("on_end", "destroy"), warn=b.get("warn")), 201)


@route("POST", "/v1/leases/{name}/extend", "move a lease's end", "lease extend NAME --end T",
       write=True, body=_obj({"end": STRING}, ["end"]))
def extend_lease(ctx, call: Call) -> Answer:
    from engine.operations import leases
    return Answer(leases.extend(ctx, call.path["name"], call.body["end"]))


@route("DELETE", "/v1/leases/{name}", "end a lease now and forget it",
       "lease delete NAME --yes", write=True,
       query=(("yes", "boolean", "confirm when it destroys VMs"),
              ("dry_run", "boolean", "say what it would do")))
def delete_lease(ctx, call: Call) -> Answer:
    from engine.operations import leases
    plan = leases.plan_delete(ctx, call.path["name"])
    if call.flag("dry_run"):
        return Answer(plan)
    if plan["destroys"] and not call.flag("yes"):
        raise unconfirmed(f"lease delete {call.path['name']} (destroying its VMs)",
                          [_label(vm) for vm in plan["vms"]], "VMs", "?yes=true",
                          plan["vms"])
    return Answer(leases.delete(ctx, call.path["name"]))


# -- backups ---------------------------------------------------------------------------

@route("GET", "/v1/backups", "list backups", "backup list [PATTERN]",
       query=(("pattern", "string", "a VM pattern"),))
def list_backups(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer(_listed(backups.list_backups(ctx, call.one("pattern")), backups.LISTED,
                          backups.ORDER))


BACKUP = _obj({"patterns": PATTERNS, "to": STRING, "full": BOOL, "protect": BOOL, **CONFIRM},
              ["patterns"])


@route("POST", "/v1/backups", "back up VMs to another host", "backup PATTERN... --detach",
       write=True, body=BACKUP, automation=True)
def backup(ctx, call: Call) -> Answer:
    from engine.operations import backups
    b = call.body
    return _started(ctx, backups.plan_backup(ctx, b["patterns"], b.get("to"),
                                             full=b.get("full", False),
                                             protect=b.get("protect", False)), b)


@route("DELETE", "/v1/backups/{id}", "delete a backup", "backup delete ID --yes --detach",
       write=True, automation=True)
def delete_backup(ctx, call: Call) -> Answer:
    from engine.operations import backups
    plan = backups.plan_delete(ctx, [call.path["id"]])
    return _started(ctx, plan, {"yes": True})


@route("POST", "/v1/backups/{id}/protect", "keep a backup from every prune and delete",
       "backup protect ID", write=True)
def protect_backup(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer({"state": "protected",
                   "backups": backups.set_protected(ctx, [call.path["id"]], True)})


@route("POST", "/v1/backups/{id}/unprotect", "let prunes and delete remove a backup again",
       "backup unprotect ID", write=True)
def unprotect_backup(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer({"state": "unprotected",
                   "backups": backups.set_protected(ctx, [call.path["id"]], False)})


@route("GET", "/v1/backups/schedules", "list backup schedules", "backup schedule list")
def list_schedules(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer(_listed(backups.list_schedules(ctx), backups.SCHEDULE_FIELDS, "pattern"))


KEEP = {"type": "integer", "minimum": 0}
SCHEDULE = _obj({"pattern": STRING, "every": {"type": ["string", "number"]}, "keep_last": KEEP, "keep_daily": KEEP,
                 "keep_weekly": KEEP, "to": STRING}, ["pattern", "every"])


@route("POST", "/v1/backups/schedules", "back up VMs at every interval",
       "backup schedule PATTERN --every DURATION [--keep-* N] [--to HOSTGLOB]", write=True,
       body=SCHEDULE)
def set_schedule(ctx, call: Call) -> Answer:
    from engine.operations import backups
    b = call.body
    keep = {option: b.get(f"keep_{option}") for option in backups.KEEP_OPTIONS}
    return Answer(backups.set_schedule(ctx, b["pattern"], b["every"], keep, b.get("to")))


@route("DELETE", "/v1/backups/schedules/{id}", "delete a backup schedule (its backups stay)",
       "backup schedule delete ID", write=True)
def delete_schedule(ctx, call: Call) -> Answer:
    from engine.operations import backups
    return Answer({"state": "deleted",
                   "schedules": backups.delete_schedules(ctx, [call.path["id"]])})


RESTORE = _obj({"backup": STRING, "as": STRING, "on": STRING}, ["backup"])


@route("POST", "/v1/restores", "rebuild a VM from a backup",
       "restore BACKUP [--as NAME] [--on HOSTGLOB] --detach", write=True, body=RESTORE,
       automation=True)
def restore(ctx, call: Call) -> Answer:
    from engine.operations import backups
    b = call.body
    return _started(ctx, backups.plan_restore(ctx, b["backup"], b.get("as"), b.get("on")), b)


# -- placement ---------------------------------------------------------------------------

@route("GET", "/v1/placement/providers", "resource providers", "placement providers [HOSTGLOB]",
       query=HOSTGLOB)
def providers(ctx, call: Call) -> Answer:
    from engine.operations import placement
    return Answer(placement.providers(ctx, call.one("pattern")))


@route("GET", "/v1/placement/allocations", "allocations", "placement allocations [CONSUMER]",
       query=(("consumer", "string", "one consumer's uuid"),))
def allocations(ctx, call: Call) -> Answer:
    from engine.operations import placement
    return Answer(placement.allocations(ctx, call.one("consumer")))


@route("GET", "/v1/placement/candidates", "where a VM would fit",
       "placement candidates SPEC [--required TRAITS] [--limit N]",
       query=(("resources", "string", "SPEC, required"), ("required", "string", "traits"),
              ("limit", "integer", "at most this many")))
def candidates(ctx, call: Call) -> Answer:
    from engine.operations import placement
    spec = call.one("resources")
    if not spec:
        raise UsageError("query parameter resources is required (VCPU:1,MEMORY_MB:256,...)")
    limit = call.one("limit")
    if limit is not None:
        if not limit.isdigit() or int(limit) < 1:
            raise UsageError(f"bad limit {limit!r}: want a positive integer")
        limit = int(limit)
    return Answer(placement.candidates(ctx, spec, call.one("required"), limit))
