"""HA restart requests: ``ha_lock`` and ``vm_definition``, run by the
initiator (no target) for the ``recover`` automation
(``automations/ha.py``), and ``aside_delete`` on a host
(:func:`engine.hypervisor.aside.delete_aside`).

- ``ha_lock`` ``{uuid, host, owner, name?}``: the VM's lock
  (``locks/vm/<uuid>``, kind ``recover``), taken only while
  ``vms/<host>/<uuid>`` exists *and* ``hosts/<host>`` does not: once it is
  held the VM is the recovery's, and a host coming back leaves it alone
  (its peer restarts only VMs nobody holds).  -> ``{uuid, locked: true}``,
  or ``{uuid, locked: false, why}`` when the host is back (it keeps its
  VMs) or the VM left it; a VM another automation holds is an error.
- ``vm_definition`` ``{uuid}``: ``vmdef/<uuid>``'s ``build`` arguments.
"""
from engine.core import keys, locks
from engine.core.handlers import handler
from engine.core.store import absent, exists
from engine.core.values import readable
from engine.errors import Conflict, RequestError
from engine.hypervisor import shapes  # noqa: F401  (declares vmdef/)
from engine.hypervisor.aside import delete_aside

handler("aside_delete")(delete_aside)


def _name(args: dict) -> str:
    return f"VM {args['name']!r}" if args.get("name") else f"VM {args.get('uuid')}"


@handler("ha_lock")
def ha_lock(host, args: dict) -> dict:
    uuid, where, owner = args.get("uuid"), args.get("host"), args.get("owner")
    if not all(isinstance(v, str) and v for v in (uuid, where, owner)):
        raise RequestError("ha_lock needs uuid, host and owner")
    try:
        locks.take(host.store, f"vm/{uuid}", owner, f"being restarted: {where} is down",
                   [exists(keys.vm(where, uuid)), absent(keys.host(where))],
                   kind="recover", host=where)
    except Conflict as exc:
        if exc.reason != "condition":
            raise RequestError(f"{_name(args)} is busy: {exc}") from None
        if host.store.get(keys.host(where)) is not None:
            return {"uuid": uuid, "locked": False, "why": f"{where} is back: it keeps its VMs"}
        return {"uuid": uuid, "locked": False,
                "why": f"no longer on {where} (moved or destroyed meanwhile)"}
    return {"uuid": uuid, "locked": True}


@handler("vm_definition")
def vm_definition(host, args: dict) -> dict:
    uuid = args.get("uuid")
    kv = host.store.get(keys.vm_definition(str(uuid)))
    value = readable(kv)
    if value is None:
        raise RequestError(f"{_name(args)} has no recorded definition to rebuild it from"
                           + (f" ({keys.vm_definition(str(uuid))} is unreadable: "
                              "peerctl scrub)" if kv is not None else ""))
    return value["build"]
