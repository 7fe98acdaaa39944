"""One automation at a time per VM: ``lock_vm`` and ``unlock_vm``, run by
the initiator (no target).  The lock is ``locks/vm/<uuid>``
(:mod:`engine.core.locks`).

- ``lock_vm`` ``{uuid, host, owner, why, kind?, name?, force?}``: taken only
  while ``vms/<host>/<uuid>`` exists, so an automation acts on the VM where
  it was listed, not on a host it has since left.  A second automation is
  refused with one line naming the holder.  ``force`` (destroy) takes a lock
  a failed move left held for an operator.
- ``unlock_vm`` ``{uuid, owner, drop_record?, hold?}``: releases it, in the
  same transaction deleting ``vms/<drop_record>/<uuid>`` (the source's
  record after a move); with ``hold`` (a reason) the lock stays, held for an
  operator (a move whose outcome nobody can tell).
"""
from engine.core import keys, locks
from engine.core.handlers import handler
from engine.core.store import Delete, exists
from engine.errors import Conflict, RequestError


def _name(args: dict) -> str:
    return f"VM {args['name']!r}" if args.get("name") else f"VM {args.get('uuid')}"


@handler("lock_vm")
def lock_vm(host, args: dict) -> dict:
    uuid, where, owner = args.get("uuid"), args.get("host"), args.get("owner")
    if not all(isinstance(v, str) and v for v in (uuid, where, owner)):
        raise RequestError("lock_vm needs uuid, host and owner")
    try:
        lock = locks.take(host.store, f"vm/{uuid}", owner, args.get("why") or "busy",
                          [exists(keys.vm(where, uuid))], force=bool(args.get("force")),
                          kind=args.get("kind"), host=where)
    except Conflict as exc:
        if exc.reason == "condition":
            raise RequestError(f"{_name(args)} is no longer on {where} (moved or destroyed "
                               "since it was listed): list it again") from None
        raise RequestError(f"{_name(args)} is busy: {exc}; try again when that ends"
                           + (" (destroy takes it over)" if exc.reason == "held" else "")) \
            from None
    return {"uuid": uuid, "owner": lock["owner"]}


@handler("unlock_vm")
def unlock_vm(host, args: dict) -> dict:
    uuid, owner = args.get("uuid"), args.get("owner")
    ops = [Delete(keys.vm(args["drop_record"], uuid))] if args.get("drop_record") else []
    if args.get("hold"):
        held = locks.hold(host.store, f"vm/{uuid}", owner, str(args["hold"]), ops)
        return {"uuid": uuid, "held": held}
    return {"uuid": uuid, "released": locks.release(host.store, f"vm/{uuid}", owner, ops)}
