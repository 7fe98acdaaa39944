"""Which placement consumers the reconciler keeps, and which it releases
(``held_consumers`` in ``engine/hypervisor/host/reconciler.py``): each kind of
legitimate consumer outlives many passes of :func:`reconcile_once`, on a
real etcd and the etcd placement backend; a true orphan is released on its
second pass, not its first; and each kind stops holding once what held it
is gone (a lease ended, an automation finished)."""
from __future__ import annotations

import uuid as uuidlib

import pytest

from engine.core import keys
from engine.hypervisor.host.reconciler import held_consumers, reconcile_once
from engine.placement import open_placement
from tests.support.placement import make_provider

PASSES = 6
SLOT = {"VCPU": 1, "MEMORY_MB": 64}


@pytest.fixture
def placement(store):
    placement = open_placement("etcd", store)
    make_provider(placement, "h1", {"VCPU": 64, "MEMORY_MB": 65536})
    lease = store.grant(60)         # h1 is a live host, as its peer would hold it
    store.put(keys.host("h1"), {"host": "h1"}, lease=lease)
    yield placement
    store.revoke(lease)
    placement.close()


def claimed(placement, user="peerctl", consumer_type="INSTANCE") -> str:
    consumer = str(uuidlib.uuid4())
    rp = placement.provider("h1")["uuid"]
    placement.claim(consumer, {rp: SLOT}, project="peerctl", user=user,
                    consumer_type=consumer_type)
    return consumer


def held_by_placement(placement) -> set[str]:
    return {a["consumer"] for a in placement.all_allocations() if a["allocations"]}


def passes(store, placement, count=PASSES) -> list[list[str]]:
    """``count`` passes of one reconciler; what each released."""
    suspects: set[str] = set()
    return [reconcile_once(store, placement, suspects)["released"] for _ in range(count)]


# -- what holds a consumer: one planter per kind --------------------------------------

def vm_record(state):
    def plant(store, consumer):
        store.put(keys.vm("h1", consumer), {"host": "h1", "name": "v", "uuid": consumer,
                                            "state": state})
    return plant


def unreadable_vm_record(store, consumer):
    store.put(keys.vm("h1", consumer), "not a VM record")


def lease(state, consumer_of=lambda consumer: consumer):
    def plant(store, consumer):
        store.put(keys.lease("cap"), {"lease": "cap", "kind": "capacity", "start": 1.0,
                                      "end": 2e10, "state": state,
                                      "consumer": consumer_of(consumer),
                                      "resources": SLOT, "amount": 1, "slots": {"h1": 1}})
    return plant


def unreadable_lease_record(store, consumer):
    store.put(keys.lease("cap"), "not a lease record")


def lease_vm(state):
    def plant(store, consumer):
        lease(state, lambda _: str(uuidlib.uuid4()))(store, consumer)
        store.put(keys.lease_vm("cap", consumer), {"uuid": consumer, "name": "in-cap"})
    return plant


def automation(state, request, field="consumer", in_spec=False, kind="migrate"):
    """An automation ``kind`` in ``state`` (None: a summary that cannot be
    read) whose step ``request`` names the consumer in ``field`` (or whose
    spec lists it among its VMs)."""
    def plant(store, consumer):
        automation_id = uuidlib.uuid4().hex
        store.put(keys.task(automation_id), {"id": automation_id, "kind": kind,
                                            "state": state})
        store.put(keys.spec(automation_id), {
            "id": automation_id, "kind": kind, "version": 1,
            "args": {"vms": [{"uuid": consumer, "name": "v"}] if in_spec else []}})
        if not in_spec:
            store.put(keys.auto(automation_id, "log/00000001"), {
                "index": 1, "request": request, "target": "h1", "worker": "w", "seq": 0,
                "fingerprint": "f", "args": {field: consumer, "source": "h1"}})
    return plant


def locked(store, consumer):
    store.put(keys.lock(f"vm/{consumer}"), {"owner": "someone", "why": "being moved",
                                            "held": "a move nobody could tell"})


def reservation_of(plant):
    """The consumer as a lease's reservation is claimed (type RESERVATION,
    user the lease's name)."""
    plant.user, plant.consumer_type = "cap", "RESERVATION"
    return plant


HELD = {
    "a running VM's record": vm_record("running"),
    "a shut-off VM's record": vm_record("shutoff"),
    "a missing VM's record": vm_record("missing"),
    "an unknown VM's record": vm_record("unknown"),
    "an unreadable VM record": unreadable_vm_record,
    "a pending lease's reservation": reservation_of(lease("pending")),
    "an active lease's reservation": reservation_of(lease("active")),
    "a degraded lease's reservation": reservation_of(lease("degraded")),
    "an ending lease's reservation": reservation_of(lease("ending")),
    "a lease in error's reservation": reservation_of(lease("error")),
    "the reservation of an unreadable lease": reservation_of(unreadable_lease_record),
    "a VM booted into an active lease, not yet built": lease_vm("active"),
    "a VM booted into an ending lease": lease_vm("ending"),
    "a boot's VM, claimed, not yet published": automation("running", "", in_spec=True,
                                                          kind="boot"),
    "a migration consumer": automation("running", "claim_move"),
    "a recovery consumer": automation("running", "claim_move", kind="recover"),
    "a VM a running step names by uuid": automation("running", "build", field="uuid"),
    "an automation whose summary is unreadable": automation(None, "claim_move"),
    "a locked VM": locked,
}

ORPHANS = {
    "nobody's": lambda store, consumer: None,
    "an ended lease's reservation": reservation_of(lease("ended")),
    "the old reservation of a lease made again": reservation_of(
        lease("active", lambda _: str(uuidlib.uuid4()))),
    "a VM of an ended lease, never built": lease_vm("ended"),
    "a migration consumer of a finished move": automation("done", "claim_move"),
    "a consumer an aborted boot named": automation("aborted", "", in_spec=True, kind="boot"),
}


def planted(store, placement, plant) -> str:
    """A consumer claimed as ``plant`` says (its user and type), then
    given the holder ``plant`` writes (or none)."""
    consumer = claimed(placement, getattr(plant, "user", "peerctl"),
                       getattr(plant, "consumer_type", "INSTANCE"))
    plant(store, consumer)
    return consumer


@pytest.mark.parametrize("kind", HELD)
def test_a_legitimate_consumer_outlives_every_pass(store, placement, kind):
    consumer = planted(store, placement, HELD[kind])
    assert consumer in held_consumers(store, {a["consumer"]: a
                                              for a in placement.all_allocations()})
    assert passes(store, placement) == [[]] * PASSES
    assert consumer in held_by_placement(placement)


@pytest.mark.parametrize("kind", ORPHANS)
def test_a_true_orphan_is_released_on_its_second_pass(store, placement, kind):
    consumer = planted(store, placement, ORPHANS[kind])
    assert passes(store, placement, 3) == [[], [consumer], []]
    assert consumer not in held_by_placement(placement)


def test_a_lease_holds_its_reservation_until_it_has_ended(store, placement):
    """The same consumer, held through the lease's whole life, released two
    passes after the record says ``ended`` (its own release would have
    freed it already; this is the crash between the two)."""
    consumer = claimed(placement, "cap", "RESERVATION")
    suspects: set[str] = set()
    for state in ("pending", "active", "ending", "error", "ending"):
        lease(state)(store, consumer)
        for _ in range(2):
            assert reconcile_once(store, placement, suspects)["released"] == []
    lease("ended")(store, consumer)
    assert reconcile_once(store, placement, suspects)["released"] == []
    assert reconcile_once(store, placement, suspects)["released"] == [consumer]


def test_orphans_are_released_and_the_held_kept_in_one_pass(store, placement):
    kept = {kind: claimed(placement, getattr(plant, "user", "peerctl"),
                          getattr(plant, "consumer_type", "INSTANCE"))
            for kind, plant in HELD.items()
            if "lease" not in kind and "unreadable" not in kind}
    for kind, consumer in kept.items():
        HELD[kind](store, consumer)
    orphans = {claimed(placement) for _ in range(3)}
    released = passes(store, placement)
    assert released[0] == [] and set(released[1]) == orphans and released[2:] == [[]] * 4
    assert set(kept.values()) <= held_by_placement(placement)
    assert not orphans & held_by_placement(placement)
