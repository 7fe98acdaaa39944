"""The requests of a VM move (see ``automations/moves.py``): ``move_describe``,
``move_prepare``, ``move_adopt`` and ``move_locate`` from
:mod:`engine.hypervisor.moves.steps`, and ``move_migrate``, the copy itself, from
:mod:`engine.hypervisor.moves.migration` (QEMU/KVM).

And the same steps for up to :data:`MAX_VMS` VMs at once, which
``evacuate`` version 4 sends where a step was per VM (a step costs its
initiator, its executor and etcd far more than a VM's share of the work):

- ``lock_vms`` ``{owner, kind?, why?, vms: [{uuid, name?, host}]}`` and
  ``unlock_vms`` ``{owner, vms: [{uuid, name?, drop_record?}]}`` (initiator):
  each VM's ``lock_vm`` / ``unlock_vm``; when every lock is free (or every
  one the caller's), all in one transaction with the same guards;
- ``move_describe_vms`` (source) and ``destroy_vms`` (source, after the
  moves were confirmed): ``{vms: [args]}``, each VM's ``move_describe`` or
  ``destroy``;
- ``move_redefine_vms`` (destination, the test driver) ``{vms: [{uuid, name?,
  describe, state}]}``: each VM's ``move_prepare`` then ``move_adopt`` with
  the XML prepared; a VM already running here as asked (a re-sent step)
  is only adopted;
- ``claim_moves`` (initiator) ``{moves: [claim_move args]}``: the moves of
  VMs in no group placed in one pass and written in one transaction
  (:func:`engine.placement.moves.move_together`), any other (or any the
  pass could not make) by its own ``claim_move``;
- ``confirm_moves`` (initiator) ``{moves: [{uuid, consumer}]}``: the
  migration consumers released in one transaction, then each VM's group
  settled, as ``confirm_move`` does.

Each answers ``{vms: [...]}`` (``{moves: [...]}`` for the placement ones),
one entry per VM in order: ``{uuid, value}``, the single request's reply,
or ``{uuid, error}`` where that VM's request was refused.  Each is
idempotent as the single requests are, VM by VM: sent again, each finds
what the first run did.  A failure that is no refusal (etcd away, libvirt
gone) fails the whole step, as it would fail a single one.
"""

import structlog

from engine.placement import groups
from engine.core import keys, locks
from engine.core.handlers import HANDLERS, handler
from engine.core.store import Get, exists
from engine.core.values import readable
from engine.errors import RequestError
from engine.hypervisor.moves import steps as moves
from engine.hypervisor.host import vm_home
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.domain.disks import ACTIVE
from engine.hypervisor.domain.lookup import find_domain
from engine.leases.events import unreserved_each
from engine.placement import for_request
from engine.placement.moves import MoveClaim, move_together
from engine.placement.together import hosts_allowed

handler("move_describe")(moves.describe)
handler("move_prepare")(moves.prepare)
handler("move_adopt")(moves.adopt)
handler("move_locate")(moves.locate)

MAX_VMS = 16        # VMs in one batched step

log = structlog.get_logger("peerctl.moves")


@handler("move_migrate")
def move_migrate(host, args: dict) -> dict:
    from engine.hypervisor.moves import migration     # libvirt's migration API: QEMU hosts only
    return migration.migrate(host, args)


def _items(args: dict, field: str = "vms") -> list[dict]:
    items = args.get(field)
    if not isinstance(items, list) or not 0 < len(items) <= MAX_VMS \
            or not all(isinstance(i, dict) and isinstance(i.get("uuid"), str) for i in items):
        raise RequestError(f"{field} must be a list of 1 to {MAX_VMS} VMs with a uuid, "
                           f"got {str(items)[:80]}")
    return items


def _each(host, one, items: list[dict], common: dict | None = None) -> list[dict]:
    """``one(host, args)`` for each item, its refusal kept as that VM's."""
    replies = []
    for item in items:
        try:
            replies.append({"uuid": item["uuid"], "value": one(host, {**(common or {}),
                                                                      **item})})
        except RequestError as exc:
            replies.append({"uuid": item["uuid"], "error": str(exc)})
    return replies


def _many(request: str):
    """A batched step made of ``request`` run for each VM."""
    def each(host, args: dict) -> dict:
        return {"vms": _each(host, HANDLERS[request], _items(args))}
    return each


handler("move_describe_vms")(_many("move_describe"))
handler("destroy_vms")(_many("destroy"))


@handler("move_redefine_vms")
def move_redefine_vms(host, args: dict) -> dict:
    return {"vms": _each(host, _redefine, _items(args))}


def _redefine(host, args: dict) -> dict:
    """One VM's ``move_prepare`` and ``move_adopt`` (the test driver's move)."""
    want = args.get("state")
    here = find_domain(host, args["uuid"])
    if here is None or vm_state(here) not in ACTIVE or want not in ACTIVE:
        prepared = moves.prepare(host, {"uuid": args["uuid"], "name": args.get("name"),
                                        "describe": args.get("describe")})
        args = {**args, "xml": prepared["xml"]}
    return moves.adopt(host, {k: args.get(k) for k in ("uuid", "name", "state", "xml")})


# -- locks: every one in one transaction when none is in the way --------------------

@handler("lock_vms")
def lock_vms(host, args: dict) -> dict:
    items, owner = _items(args), args.get("owner")
    if not isinstance(owner, str) or not owner \
            or not all(isinstance(i.get("host"), str) and i["host"] for i in items):
        raise RequestError("lock_vms needs an owner and each VM's host")
    kind, why = args.get("kind"), args.get("why")
    # lock_vm's fields, in its order: a VM's lock reads the same whichever step took it
    wanted = {f"vm/{i['uuid']}": {"kind": kind, "host": i["host"]} for i in items}
    if locks.take_all(host.store, owner, why or "busy", wanted,
                      [exists(keys.vm(i["host"], i["uuid"])) for i in items]):
        return {"vms": [{"uuid": i["uuid"], "value": {"uuid": i["uuid"], "owner": owner}}
                        for i in items]}
    return {"vms": _each(host, HANDLERS["lock_vm"], items,
                         {"owner": owner, "kind": kind, "why": why})}


@handler("unlock_vms")
def unlock_vms(host, args: dict) -> dict:
    items, owner = _items(args), args.get("owner")
    if not any(i.get("hold") for i in items) and vm_home.release_all(
            host.store, owner, {i["uuid"]: i.get("drop_record") for i in items}):
        return {"vms": [{"uuid": i["uuid"], "value": {"uuid": i["uuid"], "released": True}}
                        for i in items]}
    return {"vms": _each(host, HANDLERS["unlock_vm"], items, {"owner": owner})}


# -- placement: the moves' migration allocations -------------------------------------

def _in_groups(store, uuids: list[str]) -> set[str]:
    """Which of ``uuids`` are in a group, in one read."""
    ranges = store.txn([], [Get(keys.group_of(u)) for u in uuids]).ranges
    return {u for u, kvs in zip(uuids, ranges) if kvs and readable(kvs[0])}


@handler("claim_moves")
def claim_moves(host, args: dict) -> dict:
    items = _items(args, "moves")
    done: dict[int, dict] = {}
    with for_request(host.store) as placement:
        if placement.backend == "etcd":
            grouped = _in_groups(host.store, [i["uuid"] for i in items])
            alone = [n for n, i in enumerate(items) if i["uuid"] not in grouped
                     and isinstance(i.get("consumer"), str) and not i.get("live_only")
                     and not i.get("exclude")]
            if alone:
                unreserved = unreserved_each(host.store)
                claims = [MoveClaim(items[n]["uuid"], items[n]["consumer"],
                                    unreserved(items[n].get("required")),
                                    hosts_allowed([items[n].get("source")], items[n].get("hosts")),
                                    items[n].get("prefer"))
                          for n in alone]
                try:
                    made = move_together(placement, claims)
                except Exception as exc:    # each goes alone, and meets the error itself
                    log.info("claim_moves_alone", moves=len(alone), error=str(exc))
                    made = [None] * len(alone)
                done = {n: m for n, m in zip(alone, made) if m is not None}
    # the rest each by its own claim_move
    alone_replies = iter(_each(host, HANDLERS["claim_move"],
                               [item for n, item in enumerate(items) if n not in done]))
    return {"moves": [{"uuid": item["uuid"], "value": done[n]} if n in done
                      else next(alone_replies) for n, item in enumerate(items)]}


@handler("confirm_moves")
def confirm_moves(host, args: dict) -> dict:
    items = _items(args, "moves")
    consumers = [i.get("consumer") for i in items]
    with for_request(host.store) as placement:
        together = placement.backend == "etcd" and all(isinstance(c, str) for c in consumers)
        if together:
            try:
                placement.release_together(consumers)
            except Exception:       # each goes alone, and meets the error itself
                together = False
    if not together:
        return {"moves": _each(host, HANDLERS["confirm_move"], items)}
    for uuid in _in_groups(host.store, [i["uuid"] for i in items]):
        groups.settle(host.store, uuid)
    return {"moves": [{"uuid": i["uuid"], "value": {"consumer": i["consumer"],
                                                    "confirmed": True}} for i in items]}
