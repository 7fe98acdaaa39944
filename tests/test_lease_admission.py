"""Admission against the calendar (``engine/leases/admission.py``): what
fits, what is refused and why, and that racing grants never double-book.

The fit rules are exercised as pure functions; the grants run against a
real etcd and placement, the races from 8 real processes at once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from engine.core import keys
from engine.core.values import readable
from engine.errors import Refused, UsageError
from engine.leases import admission, records
from engine.leases.admission import WEEK, fit_capacity, fit_hosts
from engine.placement import open_placement
from tests.support import ROOT, wait_for
from tests.support.placement import make_provider

NOW = 1_800_000_000.0
HOUR = 3600.0
INVENTORY = {"VCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 40}
SLOT = {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 5}
CONSUMER = "0b9a3e8e-7f5e-4a8c-9d61-3f2b8c1a4d5e"      # a capacity lease's reservation


# -- pure fit rules -----------------------------------------------------------------

def provider(name, usages=None, traits=()):
    return {"name": name, "parent": None, "traits": list(traits), "usages": usages or {},
            "inventories": {rc: {"total": n, "reserved": 0, "allocation_ratio": 1.0}
                            for rc, n in INVENTORY.items()}}


def hosts_lease(count, **extra):
    return {"lease": "new", "kind": "hosts", "count": count, **extra}


def cap_lease(amount, **extra):
    return {"lease": "new", "kind": "capacity", "resources": SLOT, "amount": amount, **extra}


def test_a_host_lease_prefers_empty_hosts_then_the_least_used():
    hosts = {"h1": provider("h1", {"VCPU": 2}), "h2": provider("h2"),
             "h3": provider("h3", {"VCPU": 1}), "h4": provider("h4")}
    chosen, held = fit_hosts(hosts_lease(3), hosts, [])
    assert chosen == ["h2", "h4", "h3"] and held == {}


def test_hosts_held_by_an_overlapping_lease_are_not_free():
    hosts = {h: provider(h) for h in ("h1", "h2", "h3")}
    others = [{"lease": "a", "kind": "hosts", "hosts": ["h1"]},
              {"lease": "b", "kind": "capacity", "slots": {"h2": 1}, "resources": SLOT}]
    chosen, held = fit_hosts(hosts_lease(3), hosts, others)
    assert chosen == ["h3"] and held == {"h1": "a", "h2": "b"}


def test_capacity_counts_usage_overlapping_slots_and_never_active_slots_twice():
    hosts = {"h1": provider("h1", {"VCPU": 3, "MEMORY_MB": 1024, "DISK_GB": 10})}
    # h1: 4 VCPU; 3 used, of which 2 are an active lease's slots (placement holds them).
    active = [{"lease": "a", "slots": {"h1": 2}, "resources": SLOT}]
    others = [{"lease": "a", "kind": "capacity", "slots": {"h1": 2}, "resources": SLOT}]
    assert fit_capacity(cap_lease(5), hosts, others, active) == {"h1": 1}
    # Outside a's window only the VM's 1 VCPU counts.
    assert fit_capacity(cap_lease(5), hosts, [], active) == {"h1": 3}


def test_capacity_skips_hosts_of_host_leases_and_packs_the_freest_first():
    hosts = {"h1": provider("h1"), "h2": provider("h2", {"VCPU": 3}), "h3": provider("h3")}
    others = [{"lease": "a", "kind": "hosts", "hosts": ["h3"]}]
    assert fit_capacity(cap_lease(5), hosts, others, []) == {"h1": 4, "h2": 1}


# -- grants on a real etcd ---------------------------------------------------------------

@pytest.fixture
def cluster3(store):
    """Three live hosts: providers, and host records bound to a lease as
    their peers hold them (a record without one is no live host)."""
    placement = open_placement(None, store)
    alive = store.grant(60)
    for name in ("host1", "host2", "host3"):
        make_provider(placement, name, INVENTORY)
        store.put(keys.host(name), {"host": name}, lease=alive)
    yield placement
    store.revoke(alive)
    placement.close()


def grant(store, placement, name, start, end, **what):
    kind = "hosts" if "count" in what else "capacity"
    lease = {"lease": name, "kind": kind, "start": start, "end": end, **what}
    if kind == "capacity":
        lease.setdefault("resources", SLOT)
    return admission.grant(store, placement, lease, now=NOW)


def test_back_to_back_leases_share_a_host_and_overlapping_ones_do_not(store, cluster3):
    grant(store, cluster3, "a", NOW, NOW + HOUR, count=3)
    b = grant(store, cluster3, "b", NOW + HOUR, NOW + 2 * HOUR, count=3)
    assert b["hosts"] == ["host1", "host2", "host3"]
    with pytest.raises(Refused) as refused:
        grant(store, cluster3, "c", NOW + 30 * 60, NOW + 90 * 60, count=1)
    said = str(refused.value)
    assert said.startswith("lease c: needs 1 host over ")
    assert "0 are free (host1, host2, host3 held by leases a, b)" in said
    assert said.endswith("it would fit from 2027-01-15T10:00:00Z")
    assert readable(store.get(keys.lease("c"))) is None


def test_a_refusal_writes_nothing(store, cluster3):
    grant(store, cluster3, "a", NOW, NOW + HOUR, amount=12)
    before = {kv.key: kv.mod_revision for kv in store.range("")[0]}
    with pytest.raises(Refused, match=r"needs 1 slots of DISK_GB:5,MEMORY_MB:512,VCPU:1 .*; 0 fit"):
        grant(store, cluster3, "b", NOW, NOW + HOUR, amount=1)
    with pytest.raises(UsageError, match="lease a exists"):
        grant(store, cluster3, "a", NOW + 5 * HOUR, NOW + 6 * HOUR, amount=1)
    with pytest.raises(UsageError, match="starts in the past"):
        grant(store, cluster3, "old", NOW - HOUR, NOW + HOUR, count=1)
    assert {kv.key: kv.mod_revision for kv in store.range("")[0]} == before


def test_calendar_entries_cover_every_week_of_the_window(store, cluster3):
    record = grant(store, cluster3, "long", NOW, NOW + 3 * WEEK, count=1)
    weeks = sorted(kv.key.split("/")[1] for kv in store.range(keys.lease_calendar())[0])
    assert len(weeks) in (3, 4) and weeks == sorted(set(weeks))
    assert [e["lease"] for e in admission.overlapping(store, NOW + 2 * WEEK, NOW + 2 * WEEK + 1)] \
        == ["long"]
    admission.reschedule(store, cluster3, "long", NOW + WEEK / 2, now=NOW)
    assert len(store.range(keys.lease_calendar())[0]) in (1, 2)
    assert admission.overlapping(store, NOW + 2 * WEEK, NOW + 2 * WEEK + 1) == []
    assert record["hosts"] == ["host1"]


def test_extending_into_another_lease_is_refused_and_changes_nothing(store, cluster3):
    grant(store, cluster3, "x", NOW, NOW + HOUR, count=3)
    grant(store, cluster3, "y", NOW + 2 * HOUR, NOW + 3 * HOUR, count=1)
    before = {kv.key: kv.mod_revision for kv in store.range("")[0]}
    with pytest.raises(Refused, match="lease x cannot run to .*: host1 is held by lease y"):
        admission.reschedule(store, cluster3, "x", NOW + 2.5 * HOUR, now=NOW)
    assert {kv.key: kv.mod_revision for kv in store.range("")[0]} == before
    moved = admission.reschedule(store, cluster3, "x", NOW + 2 * HOUR, now=NOW)
    assert moved["end"] == NOW + 2 * HOUR


def held(store, placement, record: dict) -> dict:
    """``record`` active: its slots held in placement, as ``lease_start`` holds them."""
    assert records.hold(store, placement, record) == {}
    return record


@pytest.mark.parametrize("state", ["pending", "active"])
def test_extending_a_capacity_lease_counts_its_own_slots_once(store, cluster3, state):
    # 3 slots of 1 VCPU on host1 (4 VCPU): counted twice, they would not fit.
    mine = grant(store, cluster3, "mine", NOW, NOW + HOUR, amount=3, consumer=CONSUMER)
    assert mine["slots"] == {"host1": 3}
    if state == "active":
        held(store, cluster3, mine)
        assert cluster3.provider("host1")["usages"]["VCPU"] == 3
    moved = admission.reschedule(store, cluster3, "mine", NOW + 3 * HOUR, now=NOW)
    assert moved["end"] == NOW + 3 * HOUR
    entries = [readable(kv) for kv in store.range(keys.lease_calendar())[0]]
    assert {e["end"] for e in entries} == {NOW + 3 * HOUR}


def test_an_extension_is_refused_by_what_really_holds_its_hosts_and_only_that(store, cluster3):
    mine = held(store, cluster3, grant(store, cluster3, "mine", NOW, NOW + HOUR, amount=3,
                                       consumer=CONSUMER))
    # After mine: 2 slots of "next" on host1, and a host lease elsewhere.
    after = grant(store, cluster3, "next", NOW + HOUR, NOW + 2 * HOUR, amount=2)
    elsewhere = grant(store, cluster3, "elsewhere", NOW + HOUR, NOW + 2 * HOUR, count=1)
    assert after["slots"] == {"host1": 2} and elsewhere["hosts"] != ["host1"]
    before = {kv.key: kv.mod_revision for kv in store.range("")[0]}
    with pytest.raises(Refused) as refused:
        admission.reschedule(store, cluster3, "mine", NOW + 1.5 * HOUR, now=NOW)
    said = str(refused.value)
    assert said.startswith("lease mine cannot run to ")
    assert said.endswith("its slots on host1 are taken then (held by lease next)"), said
    assert {kv.key: kv.mod_revision for kv in store.range("")[0]} == before
    # next was all that was in the way: without it, the same extension fits.
    store.txn([], admission.release_ops(after))
    assert admission.reschedule(store, cluster3, "mine", NOW + 1.5 * HOUR,
                                now=NOW)["end"] == NOW + 1.5 * HOUR
    assert mine["slots"] == {"host1": 3}


def test_an_extension_refused_by_vms_outside_leases_says_so(store, cluster3):
    mine = grant(store, cluster3, "mine", NOW, NOW + HOUR, amount=3, consumer=CONSUMER)
    rp = cluster3.provider("host1")["uuid"]
    cluster3.claim("6f1c1c36-3c1e-4a4e-9b5e-0a0c4c1d2e3f", {rp: {"VCPU": 2}},
                   project="peerctl", user="someone")
    with pytest.raises(Refused, match=r"its slots on host1 are taken then "
                                      r"\(used now by VMs outside leases\)$"):
        admission.reschedule(store, cluster3, "mine", NOW + 2 * HOUR, now=NOW)
    assert mine["end"] == readable(store.get(keys.lease("mine")))["end"]


def test_a_dead_host_is_replaced_by_a_free_one_or_not_at_all(store, cluster3):
    grant(store, cluster3, "one", NOW, NOW + HOUR, count=1)
    grant(store, cluster3, "two", NOW, NOW + HOUR, count=1)
    store.delete(keys.host("host1"))        # host1 died: "one" loses it
    assert admission.replace_host(store, cluster3, "one", "host1", now=NOW) == "host3"
    assert readable(store.get(keys.lease("one")))["hosts"] == ["host3"]
    store.delete(keys.host("host2"))        # and host2: no free host is left for "two"
    assert admission.replace_host(store, cluster3, "two", "host2", now=NOW) is None
    assert readable(store.get(keys.lease("two")))["hosts"] == ["host2"]


# -- racing grants, from 8 processes at once ------------------------------------------------

RACER = """
import json, sys, time
sys.path.insert(0, {root!r})
from engine.core.store import Store
from engine.errors import PeerctlError
from engine.leases import admission, records
from engine.placement import open_placement
store = Store({url!r}, {cluster!r})
placement = open_placement(None, store)
lease = json.loads(sys.argv[1])
while time.time() < {go}:
    time.sleep(0.001)
try:
    record = admission.grant(store, placement, lease, now={now})
    print(json.dumps({{"granted": record.get("hosts") or record.get("slots")}}))
except PeerctlError as exc:
    print(json.dumps({{"refused": str(exc), "kind": type(exc).__name__}}))
"""


def race(etcd, store, leases):
    """Each lease granted by a process of its own, all released at one instant."""
    go = time.time() + 3.0
    script = RACER.format(root=ROOT, url=etcd.url, cluster=store.cluster, go=go, now=NOW)
    racers = [subprocess.Popen([sys.executable, "-c", script, json.dumps(lease)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for lease in leases]
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        assert racer.returncode == 0 and "Traceback" not in err, err
        outcomes.append(json.loads(out))
    return outcomes


def granted(store) -> list[dict]:
    return [r for r in (readable(kv) for kv in store.range(keys.lease())[0]) if r]


def at_every_instant(records, check):
    """``check(overlapping records)`` at every start time (where load peaks)."""
    for t in sorted({r["start"] for r in records}):
        check([r for r in records if r["start"] <= t < r["end"]])


def test_racing_host_leases_never_overlap_beyond_the_hosts(etcd, store, cluster3):
    leases = [{"lease": f"r{i}", "kind": "hosts", "count": 1 + i % 2,
               "start": NOW + (i % 3) * 600, "end": NOW + HOUR + (i % 3) * 600}
              for i in range(8)]
    outcomes = race(etcd, store, leases)
    refused = [o for o in outcomes if "refused" in o]
    assert all(o["kind"] == "Refused" and "needs" in o["refused"] for o in refused), refused
    records = granted(store)
    assert len(records) == len(outcomes) - len(refused) >= 1 and refused

    def no_double_booking(active):
        held = [h for r in active for h in r["hosts"]]
        assert len(held) == len(set(held)) <= 3, active
    at_every_instant(records, no_double_booking)


def test_racing_capacity_leases_never_exceed_a_host(etcd, store, cluster3):
    leases = [{"lease": f"c{i}", "kind": "capacity", "resources": SLOT, "amount": 2 + i % 3,
               "start": NOW + (i % 2) * 600, "end": NOW + HOUR} for i in range(8)]
    outcomes = race(etcd, store, leases)
    assert all(o.get("kind", "Refused") == "Refused" for o in outcomes), outcomes
    records = granted(store)
    assert records and len(records) < 8

    def within_capacity(active):
        for host in ("host1", "host2", "host3"):
            used = sum(r["slots"].get(host, 0) for r in active)
            assert used * SLOT["VCPU"] <= INVENTORY["VCPU"], (host, active)
    at_every_instant(records, within_capacity)
    assert sum(r["amount"] for r in records) <= 12
