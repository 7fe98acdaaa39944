"""One automation at a time per VM: ``lock_vm``, ``ha_lock`` and ``unlock_vm``, run by
the initiator (no target).  The lock is ``locks/vm/<uuid>``
(:mod:`engine.core.locks`).

- ``lock_vm`` ``{uuid, host, owner, why, kind?, name?, force?}``: taken only
  while ``vms/<host>/<uuid>`` exists, so an automation acts on the VM where
  it was listed, not on a host it has since left.  A second automation is
  refused with one line naming the holder; but a replica update's lock is
  waited for (up to :data:`REPLICA_WAIT`), since it is short.  ``force`` (destroy) takes a lock
  a failed move left held for an operator.
- ``ha_lock`` ``{uuid, host, owner, name?}`` (HA restart,
  ``automations/ha.py``): the lock, kind ``recover``, taken only while
  ``vms/<host>/<uuid>`` exists *and* no lease holds ``hosts/<host>`` (a
  record put by hand is no live host) *and* the
  VM is not disowned there (``disowned/<host>/<uuid>``: a recovery restarted
  it elsewhere already, and the record is one a hung peer published again
  before it noticed its lease had gone): once it is held the VM is the
  recovery's, and a host coming back leaves it alone.  It takes over a
  replica update's lock: that update's source is dead, it cannot end well.
  -> ``{uuid, locked: true}``, or ``{uuid, locked: false, why}`` when the
  host is back (it keeps its VMs), the VM left it or was restarted
  elsewhere; a VM another automation holds is an error.
- ``unlock_vm`` ``{uuid, owner, drop_record?, hold?}``: releases it, in the
  same transaction leaving the VM's one record where the automation's
  outcome says (:func:`engine.hypervisor.host.vm_home.release`: after a move or
  an HA restart confirmed away from ``drop_record``, where it arrived; after
  one reverted, back where it was); with ``hold`` (a reason) the lock stays,
  held for an operator (a move whose outcome nobody can tell), and the
  record where it is.  A lock no longer the caller's (a re-sent unlock)
  writes nothing.
"""
import time

from engine.core import keys, locks
from engine.core.hosts import is_live_record
from engine.core.handlers import handler
from engine.core.store import absent, exists, lease_is
from engine.errors import Conflict, RequestError
from engine.hypervisor.host import vm_home


def _name(args: dict) -> str:
    return f"VM {args['name']!r}" if args.get("name") else f"VM {args.get('uuid')}"


def _lock_args(args: dict, request: str) -> tuple[str, str, str]:
    uuid, where, owner = args.get("uuid"), args.get("host"), args.get("owner")
    if not all(isinstance(v, str) and v for v in (uuid, where, owner)):
        raise RequestError(f"{request} needs uuid, host and owner")
    return uuid, where, owner


REPLICA_WAIT = 60.0     # seconds another automation waits for a replica update to end
POLL = 0.2


def _take_vm_lock(host, args: dict, uuid: str, where: str, owner: str) -> dict:
    """The lock, waiting up to :data:`REPLICA_WAIT` while a replica update
    (kind ``replica``) holds it: an update is short, and a move or destroy
    should not fail for it.  An update never waits for another one."""
    deadline = time.monotonic() + REPLICA_WAIT
    while True:
        try:
            return locks.take(host.store, f"vm/{uuid}", owner, args.get("why") or "busy",
                              [exists(keys.vm(where, uuid))], force=bool(args.get("force")),
                              kind=args.get("kind"), host=where)
        except Conflict as exc:
            holder = locks.holder(host.store, f"vm/{uuid}") if exc.reason == "locked" else None
            if holder is None or holder.get("kind") != "replica" \
                    or args.get("kind") == "replica" or time.monotonic() >= deadline:
                raise
        time.sleep(POLL)


@handler("lock_vm")
def lock_vm(host, args: dict) -> dict:
    uuid, where, owner = _lock_args(args, "lock_vm")
    try:
        lock = _take_vm_lock(host, args, uuid, where, owner)
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
    if args.get("hold"):
        held = locks.hold(host.store, f"vm/{uuid}", owner, str(args["hold"]))
        return {"uuid": uuid, "held": held}
    return {"uuid": uuid,
            "released": vm_home.release(host.store, uuid, owner, args.get("drop_record"))}


@handler("ha_lock")
def ha_lock(host, args: dict) -> dict:
    uuid, where, owner = _lock_args(args, "ha_lock")
    try:
        locks.take(host.store, f"vm/{uuid}", owner, f"being restarted: {where} is down",
                   [exists(keys.vm(where, uuid)), lease_is(keys.host(where), 0),
                    absent(keys.disowned(where, uuid))],
                   kind="recover", host=where, preempt=("replica",))
    except Conflict as exc:
        if exc.reason != "condition":
            raise RequestError(f"{_name(args)} is busy: {exc}") from None
        record = host.store.get(keys.host(where))
        if record is not None and is_live_record(record):
            return {"uuid": uuid, "locked": False, "why": f"{where} is back: it keeps its VMs"}
        if host.store.get(keys.disowned(where, uuid)) is not None:
            return {"uuid": uuid, "locked": False,
                    "why": f"disowned on {where}: it runs elsewhere already"}
        return {"uuid": uuid, "locked": False,
                "why": f"no longer on {where} (moved or destroyed meanwhile)"}
    return {"uuid": uuid, "locked": True}
