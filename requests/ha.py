"""HA restart requests: ``vm_definition``, run by the initiator (no target)
for the ``recover`` automation (``automations/ha.py``; its ``ha_lock`` is
in ``requests/locks.py``), and ``aside_delete`` on a host
(:func:`engine.hypervisor.host.aside.delete_aside`).

- ``vm_definition`` ``{uuid}``: ``vmdef/<uuid>``'s ``build`` arguments.
- ``note_restart`` ``{uuid, host, automation, time}``: the VM's record on
  ``host`` gains ``restarts[automation] = time`` (the last
  :data:`KEEP_RESTARTS` kept); run twice, it is noted once.  A VM with no
  record there is left alone.
"""
from engine.core import keys
from engine.core.handlers import handler
from engine.core.store import Put, modified_at
from engine.core.values import readable
from engine.errors import RequestError
from engine.hypervisor.domain import shapes  # noqa: F401  (declares vmdef/)
from engine.hypervisor.host.aside import delete_aside

handler("aside_delete")(delete_aside)


@handler("vm_definition")
def vm_definition(host, args: dict) -> dict:
    uuid = args.get("uuid")
    kv = host.store.get(keys.vm_definition(str(uuid)))
    value = readable(kv)
    if value is None:
        name = repr(args["name"]) if args.get("name") else uuid
        raise RequestError(f"VM {name} has no recorded definition to rebuild it from"
                           + (f" ({keys.vm_definition(str(uuid))} is unreadable: "
                              "peerctl scrub)" if kv is not None else ""))
    return value["build"]


KEEP_RESTARTS = 10


@handler("note_restart")
def note_restart(host, args: dict) -> dict:
    uuid, where, automation = args.get("uuid"), args.get("host"), args.get("automation")
    when = args.get("time")
    if not all(isinstance(v, str) and v for v in (uuid, where, automation)) \
            or not isinstance(when, (int, float)):
        raise RequestError("note_restart needs uuid, host, automation and time")
    key = keys.vm(where, uuid)
    for _ in range(20):
        kv = host.store.get(key)
        record = readable(kv)
        if record is None:
            return {"uuid": uuid, "noted": False}
        restarts = dict(record.get("restarts") or {})
        if restarts.get(automation) == when:
            return {"uuid": uuid, "noted": True}
        restarts[automation] = when
        kept = dict(sorted(restarts.items(), key=lambda item: item[1])[-KEEP_RESTARTS:])
        if host.store.txn([modified_at(key, kv.mod_revision)],
                          [Put(key, {**record, "restarts": kept})]).succeeded:
            return {"uuid": uuid, "noted": True}
    raise RequestError(f"{key}: changed 20 times in a row while noting a restart")
