"""The soak's history checker (bench/soak_history.py), scenario by
scenario: a few transactions of a cluster's etcd history in, the verdict
out.  No etcd, no peer: each history is written by hand, one transaction
(one revision) per ``story.txn``."""
from __future__ import annotations

from bench.soak_history import Event, check, vm_history
from engine.placement.model import DISABLED_TRAIT

VM, OTHER = "1111aaaa-0000-5000-8000-000000000001", "2222bbbb-0000-5000-8000-000000000002"
RP = "9999cccc-0000-5000-8000-00000000000f"


class Story:
    """A cluster's history, written one transaction at a time; the clock
    (what the records' ``time`` fields say) moves ``after`` seconds first."""

    def __init__(self):
        self.events: list[Event] = []
        self.revision = 0
        self.clock = 1000.0

    def txn(self, *writes, after: float = 0.1) -> int:
        self.revision += 1
        self.clock += after
        for kind, key, value in writes:
            if isinstance(value, dict):
                value = {**value, "time": self.clock}
            self.events.append(Event(self.revision, kind, key, value))
        return self.revision

    def verdict(self, **options) -> list[tuple[int, str, int]]:
        return [(v.rule, v.subject, v.revision) for v in check(self.events, **options)]


def put(key, value):
    return ("put", key, value)


def delete(key):
    return ("delete", key, None)


def record(host, uuid=VM, name="web1", state="running", ha="none"):
    return put(f"vms/{host}/{uuid}", {"uuid": uuid, "name": name, "host": host,
                                       "state": state, "ha": ha})


def started(automation, kind, vms=()):
    return put(f"auto/{automation}/spec", {"id": automation, "kind": kind,
                                           "args": {"vms": list(vms)}})


def ended(automation, rows=(), state="done"):
    return put(f"auto/{automation}/status", {"state": state, "result": {"vms": list(rows)}})


def running(uuid=VM, name="web1", host="h1"):
    return {"uuid": uuid, "name": name, "host": host, "state": "running"}


def host_up(host):
    return put(f"hosts/{host}", {"host": host, "updated": 0})


def booted(story, host="h1", uuid=VM, name="web1", ha="none"):
    """A boot that built the VM on ``host`` and said so."""
    story.txn(host_up(host), started("boot1", "boot"))
    story.txn(record(host, uuid, name, ha=ha))
    story.txn(ended("boot1", [running(uuid, name, host)]))


def provider(reserved=0, traits=()):
    return put(f"placement/rp/{RP}", {
        "uuid": RP, "name": "h1", "generation": 1, "traits": list(traits),
        "inventories": {"MEMORY_MB": {"total": 1024, "reserved": reserved,
                                      "allocation_ratio": 1.0}}})


def allocation(consumer, amount):
    return put(f"placement/consumer/{consumer}",
               {"consumer": consumer, "allocations": {RP: {"MEMORY_MB": amount}}})


# -- rule 1: one record ----------------------------------------------------

def test_a_vm_moved_with_its_record_in_one_revision_holds():
    story = Story()
    booted(story)
    story.txn(host_up("h2"))
    story.txn(record("h2"), delete(f"vms/h1/{VM}"))
    assert story.verdict() == []


def test_a_vm_with_two_records_at_one_revision_breaks_rule_1_naming_it():
    story = Story()
    booted(story)
    story.txn(host_up("h2"))
    doubled = story.txn(record("h2"))
    story.txn(delete(f"vms/h1/{VM}"))
    assert story.verdict() == [(1, VM, doubled)]
    assert "web1" in str(check(story.events)[0])


# -- rule 2: no vanishing --------------------------------------------------

def test_a_vm_that_vanishes_without_a_destroy_breaks_rule_2():
    story = Story()
    booted(story)
    gone = story.txn(delete(f"vms/h1/{VM}"))
    assert story.verdict() == [(2, VM, gone)]


def test_a_destroyed_vm_that_vanishes_holds():
    story = Story()
    booted(story)
    story.txn(started("destroy1", "destroy", [{"uuid": VM, "name": "web1", "host": "h1"}]))
    story.txn(delete(f"vms/h1/{VM}"))
    story.txn(ended("destroy1", [{**running(), "state": "destroyed"}]))
    assert story.verdict() == []


def test_a_vm_never_reported_running_may_vanish():
    story = Story()
    story.txn(started("boot1", "boot"))
    story.txn(record("h1"))
    story.txn(delete(f"vms/h1/{VM}"))
    story.txn(ended("boot1", [{**running(), "state": "error"}], state="failed"))
    assert story.verdict() == []


def test_an_ha_vm_restarted_on_a_live_host_within_the_bound_holds():
    story = Story()
    booted(story, ha="restart")
    story.txn(host_up("h2"))
    story.txn(delete("hosts/h1"))
    story.txn(record("h2", ha="restart"), delete(f"vms/h1/{VM}"), after=10)
    assert story.verdict(recovery_bound=60) == []


def test_an_ha_vm_left_on_a_dead_host_breaks_rule_2():
    story = Story()
    booted(story, ha="restart")
    story.txn(host_up("h2"))
    down = story.txn(delete("hosts/h1"))
    story.txn(host_up("h2"), after=90)
    verdict = story.verdict(recovery_bound=60)
    assert (2, VM, down) in verdict
    assert all(rule == 2 and subject == VM for rule, subject, _ in verdict)


def test_an_ha_vm_waiting_for_its_first_replica_is_not_late_until_it_may_start():
    """Replicated with no complete replica and no fallback to its image: HA
    refuses to restart it from its image (by design), so its bound runs
    only once its replication stops."""
    story = Story()
    booted(story, ha="restart")
    story.txn(host_up("h2"), put(f"replicas/{VM}", {"uuid": VM, "replica": None,
                                                   "fallback": None}))
    down = story.txn(delete("hosts/h1"))
    story.txn(host_up("h2"), after=90)
    stopped = story.txn(delete(f"replicas/{VM}"))
    story.txn(host_up("h2"), after=90)
    late = [revision for rule, _, revision in story.verdict(recovery_bound=60)
            if rule == 2]
    assert stopped in late and down not in late


def test_a_vm_without_ha_may_stay_missing_on_a_dead_host():
    story = Story()
    booted(story)
    story.txn(delete("hosts/h1"))
    story.txn(record("h1", state="missing"), after=90)
    assert story.verdict() == []


# -- rule 3: no overcommit -------------------------------------------------

def test_allocations_beyond_a_providers_capacity_break_rule_3():
    story = Story()
    story.txn(provider())
    story.txn(allocation(VM, 512))
    over = story.txn(allocation(OTHER, 768))
    assert story.verdict() == [(3, RP, over)]
    assert "MEMORY_MB allocated 1280 > capacity 1024" in str(check(story.events)[0])


def test_a_drained_provider_still_holding_its_vms_holds():
    story = Story()
    story.txn(provider(reserved=64))
    story.txn(allocation(VM, 512), allocation(OTHER, 256))
    story.txn(provider(reserved=1024, traits=[DISABLED_TRAIT]),
              put(f"placement/drained/{RP}", {"MEMORY_MB": 64}))
    assert story.verdict() == []


def test_a_drained_provider_is_held_to_what_it_had_before_the_drain():
    story = Story()
    story.txn(provider(reserved=1024, traits=[DISABLED_TRAIT]),
              put(f"placement/drained/{RP}", {"MEMORY_MB": 512}))
    over = story.txn(allocation(VM, 768))
    story.txn(provider(reserved=512), delete(f"placement/drained/{RP}"))
    assert story.verdict() == [(3, RP, over)]


# -- rule 4: every automation ends, no step answered twice ------------------

def test_an_automation_left_running_breaks_rule_4():
    story = Story()
    begun = story.txn(started("migrate1", "migrate"),
                      put("auto/migrate1/status", {"state": "running"}))
    assert story.verdict() == [(4, "migrate1", begun)]


def test_an_automation_that_ended_stuck_has_ended():
    story = Story()
    story.txn(started("migrate1", "migrate"))
    story.txn(ended("migrate1", state="stuck"))
    assert story.verdict() == []


def test_a_response_written_twice_with_different_values_breaks_rule_4():
    story = Story()
    story.txn(started("ping1", "ping"))
    story.txn(put("auto/ping1/resp/00000003", {"status": "ok", "executor": "h1"}))
    again = story.txn(put("auto/ping1/resp/00000003", {"status": "ok", "executor": "h2"}))
    story.txn(ended("ping1"))
    assert story.verdict() == [(4, "ping1", again)]


def test_a_response_written_again_with_the_same_value_holds():
    story = Story()
    story.txn(started("ping1", "ping"))
    answer = {"status": "ok", "executor": "h1", "time": 5.0}
    story.events.append(Event(story.txn(), "put", "auto/ping1/resp/00000003", answer))
    story.events.append(Event(story.txn(), "put", "auto/ping1/resp/00000003", dict(answer)))
    story.txn(ended("ping1"))
    assert story.verdict() == []


# -- a VM's story -----------------------------------------------------------

def test_a_vms_history_is_one_line_per_event_that_touches_it():
    story = Story()
    booted(story)
    story.txn(record("h1", OTHER, "db1"))
    story.txn(put(f"locks/vm/{VM}", {"owner": "migrate1", "why": "being moved"}))
    lines = vm_history(story.events, VM)
    assert [line.split()[:3] for line in lines] == [
        ["2", "put", f"vms/h1/{VM}"], ["3", "put", "auto/boot1/status"],
        ["5", "put", f"locks/vm/{VM}"]]
