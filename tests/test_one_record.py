"""One truth per VM: a VM has exactly one ``vms/`` record at every etcd
revision, and every listing shows it once, whatever step a move, an HA
restart or a boot's fallback is at (docs/keyspace.md, "Which VMs exist";
``engine/hypervisor/host/vm_home.py``).

Each test replays, step by step, a history the soak (``bench/soak.py``)
found losing or doubling a VM, calling the very request handlers an
executor would call, in this process, on two test-driver hosts of the
test's own and a real etcd; after every step it reads every revision
etcd wrote since the step before and checks each of them.
"""
from __future__ import annotations

import uuid as uuidlib

import pytest

from engine.cluster import read_vms
from engine.core import keys
from engine.errors import RequestError
from engine.hypervisor.host.reconciler import reconcile_once, sweep_ghosts
from engine.placement import open_placement
from tests.support.etcd_history import events_since
from tests.support.handlers import call, new_host
from tests.support.placement import make_provider
from tests.support.vms import big_test_host

BUILD = {"vcpus": 1, "memory_mb": 64, "disk_gb": 0, "image": None}


class Recorder:
    """Every revision of ``vms/`` etcd wrote, checked as it is read: a VM
    has at most one record at each (and, once it has had one, at least one,
    unless ``gone`` says it may end)."""

    def __init__(self, store):
        self.store = store
        self.revision = store.revision()
        self.records: dict[str, dict] = {}        # key -> record, as of self.revision
        self.seen: set[str] = set()

    def step(self, gone=()):
        events, now = events_since(self.store, keys.vm(), self.revision + 1)
        by_revision: dict[int, list] = {}
        for event in events:
            by_revision.setdefault(event.kv.mod_revision, []).append(event)
        for revision in sorted(by_revision):
            for event in by_revision[revision]:
                if event.kind == "delete":
                    self.records.pop(event.kv.key, None)
                else:
                    self.records[event.kv.key] = event.kv.value
            self.check(revision, gone)
        self.revision = now
        return self

    def check(self, revision, gone):
        homes: dict[str, list] = {}
        for record in self.records.values():
            homes.setdefault(record["uuid"], []).append(record["host"])
        for uuid, hosts in homes.items():
            assert len(hosts) == 1, f"revision {revision}: VM {uuid} has records on {hosts}"
        self.seen |= set(homes)
        vanished = self.seen - set(homes) - set(gone)
        assert not vanished, f"revision {revision}: VMs {vanished} have no record"

    def home(self, uuid) -> str:
        (host,) = [r["host"] for r in self.records.values() if r["uuid"] == uuid]
        return host


def alive(store, *names):
    """``names`` are live hosts, as their peers would hold them."""
    lease = store.grant(60)
    for name in names:
        store.put(keys.host(name), {"host": name}, lease=lease)


def listed(store, uuid) -> list[dict]:
    return [vm for vm in read_vms(store) if vm["uuid"] == uuid]


@pytest.fixture
def hosts(store, tmp_path):
    return [new_host(tmp_path / name, store, big_test_host(tmp_path / f"{name}.xml"), name)
            for name in ("h1", "h2")]


def built(h, name, **extra):
    uuid = str(uuidlib.uuid4())
    call(h, "build", uuid=uuid, name=name, **BUILD, **extra)
    return uuid


def moved_by_redefinition(store, history, source, dest, uuid, owner):
    """A move of evacuate version 4 on the test driver, step by step."""
    locked = call(source, "lock_vms", owner=owner, kind="migrate", why="being moved",
                  vms=[{"uuid": uuid, "host": source.host}])
    assert "error" not in locked["vms"][0], locked
    history.step()
    described = call(source, "move_describe_vms", vms=[{"uuid": uuid}])["vms"][0]["value"]
    call(dest, "move_redefine_vms", vms=[{"uuid": uuid, "describe": described,
                                          "state": "running"}])
    history.step()
    return described


def test_a_moved_vm_is_listed_once_at_every_step_of_its_move(store, hosts):
    """Finding 4: between the move's clean-up of its source and its unlock,
    no listing showed the VM at all."""
    h1, h2 = hosts
    alive(store, "h1", "h2")
    history = Recorder(store)
    uuid = built(h1, "web1")
    history.step()
    moved_by_redefinition(store, history, h1, h2, uuid, "evac-1")
    assert history.home(uuid) == "h2"
    assert [vm["state"] for vm in listed(store, uuid)] == ["migrating"]

    call(h1, "destroy_vms", vms=[{"uuid": uuid}])      # the source's copy cleaned up
    history.step()
    assert [(vm["host"], vm["state"]) for vm in listed(store, uuid)] == [("h2", "migrating")]

    call(h1, "unlock_vms", owner="evac-1", vms=[{"uuid": uuid, "drop_record": "h1"}])
    history.step()
    assert [(vm["host"], vm["state"]) for vm in listed(store, uuid)] == [("h2", "running")]


def test_a_move_reverted_after_its_vm_arrived_carries_the_record_back(store, hosts):
    h1, h2 = hosts
    alive(store, "h1", "h2")
    history = Recorder(store)
    uuid = built(h1, "db1")
    moved_by_redefinition(store, history, h1, h2, uuid, "mig-1")
    call(h2, "destroy", uuid=uuid)                      # the destination's copy goes
    history.step()
    assert history.home(uuid) == "h2"                   # kept for the unlock to settle
    call(h1, "unlock_vm", uuid=uuid, owner="mig-1")
    history.step()
    assert history.home(uuid) == "h1"
    assert [(vm["host"], vm["state"]) for vm in listed(store, uuid)] == [("h1", "running")]


def test_an_ha_restart_elsewhere_carries_the_record_in_the_build(store, hosts):
    """Findings 1 and 2: a recovery's build wrote a second record, and the
    dead host's outlived the move or restart that left it."""
    h1, h2 = hosts
    history = Recorder(store)
    uuid = built(h1, "ha1", ha="restart")
    history.step()
    # h1 is dead (no hosts/h1): the recovery takes the VM, then builds on h2
    assert call(h2, "ha_lock", uuid=uuid, host="h1", owner="rec-1")["locked"]
    call(h2, "build", uuid=uuid, name="ha1", **BUILD, ha="restart",
         recovered={"from": "h1", "time": 1.0})
    history.step()
    assert history.home(uuid) == "h2"
    call(h2, "disown", uuid=uuid, host="h1", keep=True, automation="rec-1")
    history.step()
    call(h2, "unlock_vm", uuid=uuid, owner="rec-1", drop_record="h1")
    history.step()
    (vm,) = listed(store, uuid)
    assert vm["host"] == "h2" and vm["recovered"]["from"] == "h1"


def test_a_failed_restart_build_leaves_the_record_where_the_vm_was(store, hosts):
    h1, h2 = hosts
    history = Recorder(store)
    uuid = built(h1, "ha2", ha="restart")
    assert call(h2, "ha_lock", uuid=uuid, host="h1", owner="rec-2")["locked"]
    call(h2, "build", uuid=uuid, name="ha2", **BUILD, ha="restart",
         recovered={"from": "h1", "time": 1.0})
    call(h2, "destroy", uuid=uuid)          # the recovery gave that copy up
    call(h2, "unlock_vm", uuid=uuid, owner="rec-2")
    history.step()
    assert history.home(uuid) == "h1"       # listed unknown there; tried again later


def test_a_boot_that_falls_back_to_another_host_leaves_no_second_record(store, hosts):
    """Finding 1: a build lost with its host, then the boot's alternate:
    the first host's record stayed beside the second's."""
    h1, h2 = hosts
    history = Recorder(store)
    uuid = built(h1, "app1")            # written before the reply that was lost
    history.step()
    call(h2, "disown", uuid=uuid, host="h1", automation="boot-1", reason="lost")
    history.step(gone=[uuid])           # not yet reported running: it may go
    call(h2, "build", uuid=uuid, name="app1", **BUILD)
    history.step()
    assert history.home(uuid) == "h2"


def test_a_resent_unlock_of_an_earlier_move_deletes_nothing(store, hosts):
    """The first move's unlock, re-sent after its initiator died, came after
    a second move had brought the VM back: it deleted the VM's only record."""
    h1, h2 = hosts
    history = Recorder(store)
    uuid = built(h1, "cache1")
    moved_by_redefinition(store, history, h1, h2, uuid, "mig-a")
    call(h1, "destroy", uuid=uuid)
    call(h1, "unlock_vm", uuid=uuid, owner="mig-a", drop_record="h1")
    moved_by_redefinition(store, history, h2, h1, uuid, "mig-b")
    call(h2, "destroy", uuid=uuid)
    call(h1, "unlock_vm", uuid=uuid, owner="mig-b", drop_record="h2")
    history.step()
    assert history.home(uuid) == "h1"
    call(h1, "unlock_vm", uuid=uuid, owner="mig-a", drop_record="h1")    # re-sent
    history.step()
    assert history.home(uuid) == "h1"


def test_the_reconciler_keeps_the_only_record_of_a_vm_whose_claim_moved(store, hosts):
    """An HA restart moves the VM's allocation before its record: the
    reconciler took the dead host's record for a ghost and deleted the VM's
    only one."""
    h1, h2 = hosts
    placement = open_placement("etcd", store)
    try:
        for name in ("h1", "h2"):
            make_provider(placement, name, {"VCPU": 8, "MEMORY_MB": 8192})
        history = Recorder(store)
        uuid = built(h1, "ha3", ha="restart")
        history.step()
        rp2 = placement.provider("h2")["uuid"]
        placement.claim(uuid, {rp2: {"VCPU": 1, "MEMORY_MB": 64}}, project="peerctl",
                        user="peerctl", consumer_type="INSTANCE")
        for _ in range(3):
            reconcile_once(store, placement, set())
        history.step()
        assert history.home(uuid) == "h1"
    finally:
        placement.close()


def test_a_vm_restarted_back_onto_a_host_that_once_disowned_it_survives_its_sweep(
        store, hosts):
    """Found by the soak: an HA restart moved the VM off h1 (a live host,
    disowned there, the mark left for h1's sweep); a later restart brought
    it back to h1; h1's peer restarted and its ghost sweep kept the running
    VM's disks aside and deleted its only record."""
    h1, h2 = hosts
    alive(store, "h1", "h2")
    history = Recorder(store)
    uuid = built(h1, "ha4", ha="restart")
    for owner, source, dest in (("restart-1", h1, h2), ("restart-2", h2, h1)):
        call(dest, "lock_vm", uuid=uuid, host=source.host, owner=owner, kind="recover",
             why="being restarted")
        call(dest, "build", uuid=uuid, name="ha4", **BUILD, ha="restart",
             recovered={"from": source.host, "time": 1.0})
        call(dest, "disown", uuid=uuid, host=source.host, keep=True, automation=owner)
        call(dest, "unlock_vm", uuid=uuid, owner=owner, drop_record=source.host)
        history.step()
    assert history.home(uuid) == "h1"
    sweep_ghosts(store, h1)
    history.step()
    assert history.home(uuid) == "h1"
    assert [(vm["host"], vm["state"]) for vm in listed(store, uuid)] == [("h1", "running")]


def test_a_build_that_ran_late_on_a_host_its_boot_gave_up_makes_no_second_record(
        store, hosts):
    """h1's peer froze during its build (SIGSTOP past its lease): the boot
    heard nothing, disowned h1 and built on h2; thawed, h1 finished its
    build, and its record was the VM's second."""
    h1, h2 = hosts
    history = Recorder(store)
    uuid = str(uuidlib.uuid4())
    call(h2, "disown", uuid=uuid, host="h1", automation="boot-2", reason="lost")
    call(h2, "build", uuid=uuid, name="app2", **BUILD)
    history.step()
    with pytest.raises(RequestError, match="disowned on h1"):
        call(h1, "build", uuid=uuid, name="app2", **BUILD)      # the late one
    history.step()
    assert history.home(uuid) == "h2"
