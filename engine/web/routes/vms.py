"""The API's VMs: list, one, boot, the actions, HA, groups, adopt and unmanage."""
from __future__ import annotations

from engine.errors import NoSuch
from engine.operations import adoption, groups, vms

from .core import (Answer, BOOL, Call, CONFIRM, listed, MAX_WAIT, obj, PATTERNS, POSITIVE,
                   Refusal, route, started, STRING, STRINGS)

@route("GET", "/v1/vms", "list VMs", "vmlist [PATTERN...] [--all]",
       query=(("pattern", "string[]", "HOSTGLOB/VMGLOB or VMGLOB, repeatable"),
              ("all", "boolean", "foreign domains too, with managed, manager and problems")))
def list_vms(ctx, call: Call) -> Answer:
    patterns = call.query.get("pattern") or []
    if call.flag("all"):
        return Answer(listed(adoption.list_all(ctx, patterns), adoption.ALL_LISTED,
                              vms.ORDER))
    return Answer(listed(vms.list_vms(ctx, patterns), vms.LISTED, vms.ORDER))


@route("GET", "/v1/vms/{name}", "one VM", "vmlist NAME")
def show_vm(ctx, call: Call) -> Answer:
    from engine.operations.specs import check_name
    name = check_name(call.path["name"])
    rows = [row for row in vms.list_vms(ctx, [name]) if row["name"] == name]
    if not rows:
        raise NoSuch(f"no VM {name!r}")
    return Answer(listed(rows, vms.LISTED, vms.ORDER)[0])


BOOT = obj({"names": {"type": "array", "items": STRING, "minItems": 1},
             "resources": STRING, "required": STRING, "image": STRING, "on": STRING,
             "networks": STRINGS, "reservation": STRING,
             "ha": {"enum": ["restart", "none"]}, "group": STRING,
             "rule": {"enum": ["spread", "together"]}, "user_data": STRING,
             "ssh_keys": STRINGS, "hostname": STRING, "wait_ip": BOOL,
             "ip_timeout": POSITIVE, "dry_run": BOOL},
            ["names", "resources"])


@route("POST", "/v1/vms", "boot VMs", "boot NAME... --resources SPEC --detach", write=True,
       body=BOOT, automation=True)
def boot(ctx, call: Call) -> Answer:
    """``wait_ip``: the 202's document also names ``addresses``, the URL that
    waits (``ip_timeout`` seconds, at most the longest wait) until the boot
    has ended and its VMs have their addresses, answering what ``boot
    --wait-ip`` prints."""
    body = call.body
    seed = vms.given_seed(body.get("user_data"), body.get("ssh_keys"), body.get("hostname"))
    plan = vms.plan_boot(ctx, body["names"], body["resources"], required=body.get("required"),
                         image=body.get("image"), on=body.get("on"),
                         networks=body.get("networks"),
                         default_network=ctx.default_network, seed=seed,
                         reservation=body.get("reservation"), ha=body.get("ha", "none"),
                         group=body.get("group"), rule=body.get("rule"))
    answer = started(ctx, plan, body)
    if body.get("wait_ip") and answer.status == 202:
        automation = answer.doc["automation"]
        timeout = min(body.get("ip_timeout", 300), MAX_WAIT)
        answer.doc["addresses"] = f"/v1/automations/{automation}/addresses?timeout={timeout:g}"
    return answer


@route("GET", "/v1/groups", "list VM groups", "group list")
def list_groups(ctx, call: Call) -> Answer:
    return Answer(groups.list_groups(ctx))


@route("GET", "/v1/groups/{name}", "one VM group", "group show NAME")
def show_group(ctx, call: Call) -> Answer:
    return Answer(groups.show_group(ctx, call.path["name"]))


ACTION = obj({"patterns": PATTERNS, **CONFIRM}, ["patterns"])


@route("POST", "/v1/vms/{action}", "destroy, start, stop, reboot, suspend or resume VMs",
       "destroy|start|stop|reboot|suspend|resume PATTERN... --detach", write=True,
       body=ACTION, automation=True)
def vm_action(ctx, call: Call) -> Answer:
    action = call.path["action"]
    if action not in vms.VM_ACTIONS:
        raise Refusal(404, f"no such VM action {action!r} (want {', '.join(vms.VM_ACTIONS)})")
    return started(ctx, vms.plan_action(ctx, action, call.body["patterns"]), call.body)


HA = obj({"patterns": PATTERNS, "policy": {"enum": ["restart", "none"]}},
          ["patterns", "policy"])


@route("POST", "/v1/ha", "set the HA policy of VMs", "ha PATTERN... restart|none --detach",
       write=True, body=HA, automation=True)
def set_ha(ctx, call: Call) -> Answer:
    return started(ctx, vms.plan_ha(ctx, call.body["patterns"], call.body["policy"]),
                    call.body)


ADOPT = obj({"patterns": PATTERNS, "ha": {"enum": ["restart", "none"]}, **CONFIRM},
             ["patterns"])


@route("POST", "/v1/adopt", "adopt foreign domains in place",
       "adopt HOST/PATTERN... [--ha restart|none] --detach", write=True, body=ADOPT,
       automation=True)
def adopt(ctx, call: Call) -> Answer:
    return started(ctx, adoption.plan_adopt(ctx, call.body["patterns"],
                                             call.body.get("ha", "none")), call.body)


@route("POST", "/v1/unmanage", "let VMs go: they keep running, unmanaged",
       "unmanage PATTERN... --detach", write=True, body=ACTION, automation=True)
def unmanage(ctx, call: Call) -> Answer:
    return started(ctx, adoption.plan_unmanage(ctx, call.body["patterns"]), call.body)
