"""The API's replicas: replicate VMs, and stop replicating them
(docs/replicas.md).  Neither starts an automation: each answers what
``replicate`` and ``replicate --stop`` print.  VMs are chosen by patterns,
so stopping is a ``POST`` with ``{patterns, yes, dry_run}``, as
``POST /v1/vms/destroy`` is."""
from __future__ import annotations

from .core import (Answer, BOOL, Call, CONFIRM, label, obj, PATTERNS, route, STRING,
                   unconfirmed)

REPLICATE = obj({"patterns": PATTERNS, "every": {"type": ["string", "number"]}, "to": STRING,
                 "from_image_if_no_replica": BOOL, **CONFIRM}, ["patterns", "every"])


@route("POST", "/v1/replicas", "keep a replica of VMs' disks on another host",
       "replicate PATTERN... --every DURATION [--to HOSTGLOB] [--from-image-if-no-replica]",
       write=True, body=REPLICATE)
def replicate(ctx, call: Call) -> Answer:
    from engine.core.validate import parse_duration
    from engine.operations import replicas
    from engine.wording import option
    b = call.body
    every = replicas.check_every(parse_duration(b["every"], option("every")))
    return Answer(replicas.replicate(ctx, b["patterns"], every, b.get("to"),
                                     "image" if b.get("from_image_if_no_replica") else None,
                                     dry_run=b.get("dry_run", False)))


@route("POST", "/v1/replicas/stop", "stop replicating VMs and delete their replicas",
       "replicate PATTERN... --stop --yes", write=True,
       body=obj({"patterns": PATTERNS, **CONFIRM}, ["patterns"]))
def stop(ctx, call: Call) -> Answer:
    from engine.operations import replicas
    vms = replicas.replicated(ctx, call.body["patterns"])
    if call.body.get("dry_run"):
        return Answer({"state": "dry-run",
                       "vms": [dict(replicas.row_of(vm), state="would stop") for vm in vms]})
    if len(vms) > 1 and not call.body.get("yes"):
        rows = [replicas.row_of(vm) for vm in vms]
        raise unconfirmed("replicate --stop", [label(row) for row in rows], "VMs",
                          targets=rows)
    return Answer(replicas.stop(ctx, vms))
