"""HA restart requests: ``vm_definition``, run by the initiator (no target)
for the ``recover`` automation (``automations/ha.py``; its ``ha_lock`` is
in ``requests/locks.py``), and ``aside_delete`` on a host
(:func:`engine.hypervisor.aside.delete_aside`).

- ``vm_definition`` ``{uuid}``: ``vmdef/<uuid>``'s ``build`` arguments.
"""
from engine.core import keys
from engine.core.handlers import handler
from engine.core.values import readable
from engine.errors import RequestError
from engine.hypervisor import shapes  # noqa: F401  (declares vmdef/)
from engine.hypervisor.aside import delete_aside

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
