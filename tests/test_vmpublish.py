"""VmPublisher: the records of vms/<host>/ follow libvirt, by reconcile and
by events, and a publisher never makes a VM exist nor forgets one
(test:///default in this process, a real etcd)."""
from __future__ import annotations

import uuid as uuidlib

import pytest

from engine.core import keys
from engine.errors import StoreUnavailable
from engine.hypervisor.host.vmpublish import VmPublisher, publish_domain
from tests.support import last_write, wait_for
from tests.support.handlers import build, call, host, new_host  # noqa: F401  (host: a fixture)


def published(store, host):
    kvs, _ = store.range(f"vms/{host.host}/")
    return {kv.key.rsplit("/", 1)[1]: kv.value for kv in kvs}


def recorded(store, host, args, **fields):
    """The record ``build`` writes before it replies, put by hand for a host
    whose handlers write to no etcd (the publisher alone then writes)."""
    record = {"host": host.host, "name": args["name"], "uuid": args["uuid"],
              "state": "running", "vcpus": args["vcpus"], "memory_mb": args["memory_mb"],
              "disk_gb": args["disk_gb"], "ha": "none", "want": "running", **fields}
    store.put(keys.vm(host.host, args["uuid"]), record)
    return record


def test_a_publisher_whose_lease_is_gone_writes_nothing(store, host):
    """A peer thawed after a hang (or back from a partition) has threads that
    run on before it notices that its lease expired, and its host may have
    been recovered meanwhile: its publisher writes only while
    ``hosts/<host>`` holds the peer's lease."""
    lease = store.grant(30)
    store.put(keys.host(host.host), {"host": host.host}, lease)
    vm = build(host)
    recorded(store, host, vm, state="building")
    publisher = VmPublisher(store, host.host, host.conn, lease=lease)
    assert publisher.reconcile() == 1
    store.revoke(lease)                 # the lease expired: hosts/<host> went with it
    call(host, "suspend", uuid=vm["uuid"])
    with pytest.raises(StoreUnavailable, match="no longer holds this peer's lease"):
        publisher.reconcile()
    publisher.named(vm["uuid"])         # as a lifecycle event names it
    with pytest.raises(StoreUnavailable, match="no longer holds this peer's lease"):
        publisher.publish_events()
    assert published(store, host)[vm["uuid"]]["state"] == "running"
    # The next session registers the host under its own lease: still not this publisher's.
    store.put(keys.host(host.host), {"host": host.host}, store.grant(30))
    with pytest.raises(StoreUnavailable):
        publisher.reconcile()
    assert published(store, host)[vm["uuid"]]["state"] == "running"
    call(host, "destroy", uuid=vm["uuid"])


def test_reconcile_brings_records_up_to_date_and_never_makes_or_forgets_a_vm(store, host):
    """A record follows its domain; a domain without a record is nobody's VM
    yet (a build writes it) and stays unlisted; a record whose domain is
    gone stays, ``missing``, with what it was; another host's is not ours."""
    a = build(host, vcpus=2, memory_mb=128, disk_gb=3)
    b = build(host)
    recorded(store, host, a, state="building", vcpus=1)
    gone = {"uuid": str(uuidlib.uuid4()), "name": "gone", "vcpus": 1, "memory_mb": 64,
            "disk_gb": 1}
    recorded(store, host, gone, restarts={"x": 1.0})
    store.put("vms/other-host/x", {"state": "running"})                       # not ours
    publisher = VmPublisher(store, host.host, host.conn)

    assert publisher.reconcile() == 2
    records = published(store, host)
    assert set(records) == {a["uuid"], gone["uuid"]}
    assert records[a["uuid"]] == {
        "host": host.host, "name": a["name"], "uuid": a["uuid"], "state": "running",
        "vcpus": 2, "memory_mb": 128, "disk_gb": 3, "ha": "none", "want": "running"}
    assert records[gone["uuid"]]["state"] == "missing"
    assert records[gone["uuid"]]["restarts"] == {"x": 1.0}      # what it was, kept
    assert records[gone["uuid"]]["missing_since"] > 0
    assert store.get("vms/other-host/x") is not None

    before = last_write(store)
    assert publisher.reconcile() == 0
    assert last_write(store) == before           # nothing rewritten

    call(host, "suspend", uuid=a["uuid"])
    dom = host.conn.lookupByUUIDString(a["uuid"])
    dom.destroy()                                # behind peerctl's back
    assert publisher.reconcile() == 1
    assert published(store, host)[a["uuid"]]["state"] == "shutoff"
    assert published(store, host)[a["uuid"]]["crashed"] is True
    assert store.get(keys.restart(a["uuid"])) is None       # not an HA VM
    for vm in (a, b):
        call(host, "destroy", uuid=vm["uuid"])


def test_a_vm_an_automation_holds_is_not_marked_missing(store, host):
    """A move away undefines the source's domain before the automation drops
    the source's record: meanwhile the VM is not missing."""
    vm = {"uuid": str(uuidlib.uuid4()), "name": "leaving", "vcpus": 1, "memory_mb": 64,
          "disk_gb": 1}
    recorded(store, host, vm)
    store.put(keys.status("t1"), {"state": "running"})
    store.put(keys.lock(f"vm/{vm['uuid']}"), {"owner": "t1", "kind": "migrate"})
    publisher = VmPublisher(store, host.host, host.conn)
    assert publisher.reconcile() == 0
    assert published(store, host)[vm["uuid"]]["state"] == "running"
    store.put(keys.status("t1"), {"state": "done"})     # its owner ended
    assert publisher.reconcile() == 1
    assert published(store, host)[vm["uuid"]]["state"] == "missing"


def test_an_ha_vm_down_or_missing_asks_a_restart_once(store, host):
    """What the ``recoverer`` acts on: ``restart/<uuid>``, written once
    (create if absent) for an HA VM whose domain crashed or vanished."""
    crashed = build(host, ha="restart")
    recorded(store, host, crashed, ha="restart")
    host.conn.lookupByUUIDString(crashed["uuid"]).destroy()
    vanished = {"uuid": str(uuidlib.uuid4()), "name": "vanished", "vcpus": 1,
                "memory_mb": 64, "disk_gb": 1}
    recorded(store, host, vanished, ha="restart")
    stopped = build(host, ha="restart")
    recorded(store, host, stopped, ha="restart", want="shutoff")
    host.conn.lookupByUUIDString(stopped["uuid"]).destroy()       # stopped on purpose
    publisher = VmPublisher(store, host.host, host.conn)
    publisher.reconcile()
    asked = {kv.value["uuid"]: kv.value["why"] for kv in store.range(keys.restart())[0]}
    assert asked == {crashed["uuid"]: "crashed", vanished["uuid"]: "missing"}
    before = last_write(store)
    publisher.reconcile()
    assert last_write(store) == before           # asked once
    for vm in (crashed, stopped):
        call(host, "destroy", uuid=vm["uuid"])


def test_lifecycle_events_reach_etcd_without_waiting_for_the_period(store, host):
    publisher = VmPublisher(store, host.host, lambda: host.conn, interval=300).start()
    try:
        wait_for(lambda: publisher.reconciles >= 1)
        args = build(host)
        recorded(store, host, args, state="building")
        call(host, "suspend", uuid=args["uuid"])
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "paused")
        call(host, "stop", uuid=args["uuid"])
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "shutoff")
        call(host, "destroy", uuid=args["uuid"])      # its handler writes no etcd here
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "missing")
    finally:
        publisher.stop()


def test_the_period_repairs_what_events_cannot_see(store, host):
    publisher = VmPublisher(store, host.host, host.conn, interval=0.2, heard_interval=0.2).start()
    try:
        args = build(host)
        recorded(store, host, args, state="paused")     # wrong behind our back
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "running")
    finally:
        publisher.stop()
        call(host, "destroy", uuid=args["uuid"])


def test_while_events_are_heard_the_period_is_long_and_a_closed_connection_ends_it(store, host):
    publisher = VmPublisher(store, host.host, host.conn, interval=0.2, heard_interval=3600).start()
    try:
        args = build(host)
        wait_for(lambda: publisher.memo.armed and publisher.reconciles >= 1,
                 what="a first reconcile while events are heard")
        assert publisher.period == 3600
        recorded(store, host, args, state="paused")     # wrong behind our back

        publisher._connection_closed()                  # as libvirt calls it: events may be lost
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "running",
                 what="the whole host reconciled at once")
        assert publisher.period == 0.2, "events unheard, yet the long period"
    finally:
        publisher.stop()
        call(host, "destroy", uuid=args["uuid"])


def test_build_publishes_before_replying_and_an_older_view_never_overwrites_it(
        store, tmp_path):
    """The build handler writes the VM's record itself (once: a second build
    rewrites nothing), and a reconcile that listed libvirt before a newer
    write is refused by its fence and reads again instead of writing its
    stale view over it."""
    host = new_host(tmp_path / "state", store)
    args = build(host)
    key = f"vms/{host.host}/{args['uuid']}"
    assert store.get(key).value["state"] == "running"
    assert store.get(key).value["want"] == "running"
    before = last_write(store)
    call(host, "build", **args)
    assert last_write(store) == before                  # idempotent: nothing rewritten

    publisher = VmPublisher(store, host.host, host.conn)
    listed = publisher.records

    def stale_listing(*scanned):
        seen = listed(*scanned)                          # running
        if seen[args["uuid"]]["state"] == "running":
            call(host, "suspend", uuid=args["uuid"])     # paused, written after our read
        return seen
    publisher.records = stale_listing
    publisher.reconcile()
    assert store.get(key).value["state"] == "paused"
    call(host, "destroy", uuid=args["uuid"])
    assert store.get(key) is None                       # destroy forgets it


def test_an_event_publishes_the_domain_it_names_not_the_whole_host(store, host):
    """Between periodic reconciles an event re-reads only its own domain: a
    stale key of another VM stays until the period (a host booting many VMs
    does not compare them all on each event), while the VM evented is
    published and, once undefined, marked missing."""
    publisher = VmPublisher(store, host.host, lambda: host.conn, interval=300).start()
    try:
        wait_for(lambda: publisher.reconciles >= 1)
        stale = f"vms/{host.host}/{uuidlib.uuid4()}"
        store.put(stale, {"host": host.host, "name": "stale", "uuid": "x", "state": "running"})
        args = build(host)
        recorded(store, host, args, state="building")
        call(host, "suspend", uuid=args["uuid"])
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "paused")
        call(host, "destroy", uuid=args["uuid"])
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "missing")
        assert store.get(stale).value["state"] == "running"
        assert publisher.reconciles == 1
    finally:
        publisher.stop()


def test_a_first_build_writes_definition_and_record_in_one_transaction(store, tmp_path):
    host = new_host(tmp_path / "state", store)
    args = build(host)
    definition = store.get(f"vmdef/{args['uuid']}")
    record = store.get(f"vms/{host.host}/{args['uuid']}")
    assert definition.mod_revision == record.mod_revision
    assert definition.value["build"]["name"] == args["name"]
    assert record.value["state"] == "running"
    call(host, "destroy", uuid=args["uuid"])

    # Built again (an HA restart, a retry): the definition is there, the
    # record written the usual way, read and compared first.
    store.delete(f"vms/{host.host}/{args['uuid']}")
    revision = store.revision()
    build(host, uuid=args["uuid"], name=args["name"])
    assert store.get(f"vmdef/{args['uuid']}").mod_revision <= revision    # unchanged
    assert store.get(f"vms/{host.host}/{args['uuid']}").value["state"] == "running"
    call(host, "destroy", uuid=args["uuid"])


def foreign_published(store, host):
    kvs, _ = store.range(keys.foreign(host.host))
    return {kv.key.rsplit("/", 1)[1]: kv.value for kv in kvs}


BUILT_IN = "6695eb01-f6a4-8304-79aa-97f2502e193f"     # test:///default's own domain


def test_foreign_domains_are_published_apart_and_follow_libvirt(store, host):
    """A domain without peerctl metadata is published under ``foreign/``,
    never under ``vms/``; it follows define, undefine and adoption (peerctl
    metadata written into it)."""
    publisher = VmPublisher(store, host.host, host.conn)
    mine = build(host)
    recorded(store, host, mine)
    publisher.reconcile()
    assert set(foreign_published(store, host)) == {BUILT_IN}
    assert foreign_published(store, host)[BUILT_IN]["managed"] is False
    assert set(published(store, host)) == {mine["uuid"]}

    by_hand = str(uuidlib.uuid4())
    dom = host.conn.defineXML(
        f"<domain type='test'><name>hand-{by_hand[:8]}</name><uuid>{by_hand}</uuid>"
        "<memory unit='MiB'>64</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>")
    try:
        publisher.named(by_hand)                # as its define event names it
        publisher.publish_events()
        assert foreign_published(store, host)[by_hand]["state"] == "shutoff"
        from engine.hypervisor.domain.domain_xml import write_metadata
        write_metadata(dom, {"host": host.host})    # adopted: peerctl's from now on
        publisher.reconcile()
        assert by_hand not in foreign_published(store, host)
        assert by_hand not in published(store, host)   # no record: a publisher makes none
    finally:
        dom.undefine()
    publisher.reconcile()
    assert set(foreign_published(store, host)) == {BUILT_IN}
    call(host, "destroy", uuid=mine["uuid"])


def test_an_event_on_a_vm_this_process_just_recorded_reads_only_libvirt(
        store, tmp_path, monkeypatch):
    """The events of a build's define and start come once the build has
    recorded its VM: the publisher compares libvirt with the record it
    knows and reads no etcd.  A real change still reaches etcd; a record
    another writer changed behind its back waits for the next reconcile."""
    host = new_host(tmp_path / "state", store)
    publisher = VmPublisher(store, host.host, host.conn)
    args = build(host)
    key = keys.vm(host.host, args["uuid"])
    reads = []
    get = store.get
    monkeypatch.setattr(store, "get", lambda k, *a, **kw: reads.append(k) or get(k, *a, **kw))

    publisher.named(args["uuid"])               # its start event, come late
    assert publisher.publish_events() == 0
    assert reads == []

    host.conn.lookupByUUIDString(args["uuid"]).suspend()     # not through peerctl
    publisher.named(args["uuid"])
    assert publisher.publish_events() == 1
    assert store.get(key).value["state"] == "paused"

    store.put(key, {**store.get(key).value, "state": "running"})    # wrong behind its back
    publisher.named(args["uuid"])
    publisher.publish_events()
    assert store.get(key).value["state"] == "running"          # the event trusts its record
    assert publisher.reconcile() == 1
    assert store.get(key).value["state"] == "paused"           # the reconcile reads etcd
    call(host, "destroy", uuid=args["uuid"])


def test_an_ha_vm_missing_here_keeps_the_short_period_until_it_is_settled(store, host):
    """While events are heard the period is long, but a missing HA VM (its
    restart request may be served, refused or given up on, then gone) is
    looked at again every short period, and asked again if its request went."""
    vanished = {"uuid": str(uuidlib.uuid4()), "name": "ha1", "vcpus": 1, "memory_mb": 64,
                "disk_gb": 1}
    recorded(store, host, vanished, ha="restart")       # no domain: missing here
    publisher = VmPublisher(store, host.host, host.conn, interval=0.2,
                            heard_interval=3600).start()
    try:
        wait_for(lambda: store.get(keys.restart(vanished["uuid"])) is not None,
                 what="the restart asked")
        assert publisher.memo.armed and publisher.period == 0.2
        store.delete(keys.restart(vanished["uuid"]))     # served, and gone
        wait_for(lambda: store.get(keys.restart(vanished["uuid"])) is not None,
                 what="the restart asked again at the next short period")
        store.delete(keys.vm(host.host, vanished["uuid"]))
        wait_for(lambda: publisher.period == 3600, what="the long period, once settled")
    finally:
        publisher.stop()
