"""VmPublisher: vms/<host>/ follows libvirt, by reconcile and by events
(test:///default in this process, a real etcd)."""
from __future__ import annotations

import uuid as uuidlib

import pytest

from engine.core import keys
from engine.errors import StoreUnavailable
from engine.hypervisor.vmpublish import VmPublisher, publish_domain
from tests.support import wait_for
from tests.support.handlers import call, host, new_host  # noqa: F401  (host: a fixture)


def build(host, **overrides):
    args = {"uuid": str(uuidlib.uuid4()), "name": "vm-" + uuidlib.uuid4().hex[:8],
            "vcpus": 1, "memory_mb": 64, "disk_gb": 1, "image": None, **overrides}
    call(host, "build", **args)
    return args


def published(store, host):
    kvs, _ = store.range(f"vms/{host.host}/")
    return {kv.key.rsplit("/", 1)[1]: kv.value for kv in kvs}


def test_a_publisher_whose_lease_is_gone_writes_nothing(store, host):
    """A peer thawed after a hang (or back from a partition) has threads that
    run on before it notices that its lease expired, and its host may have
    been recovered meanwhile: its publisher writes only while
    ``hosts/<host>`` holds the peer's lease."""
    lease = store.grant(30)
    store.put(keys.host(host.host), {"host": host.host}, lease)
    vm = build(host)
    publisher = VmPublisher(store, host.host, host.conn, lease=lease)
    assert publisher.reconcile() == 1
    store.revoke(lease)                 # the lease expired: hosts/<host> went with it
    store.delete(keys.vm(host.host, vm["uuid"]))     # the recovery dropped the record
    call(host, "suspend", uuid=vm["uuid"])
    with pytest.raises(StoreUnavailable, match="no longer holds this peer's lease"):
        publisher.reconcile()
    publisher._events.add(vm["uuid"])   # as a lifecycle event names it
    with pytest.raises(StoreUnavailable, match="no longer holds this peer's lease"):
        publisher.publish_events()
    assert published(store, host) == {}
    # The next session registers the host under its own lease: still not this publisher's.
    store.put(keys.host(host.host), {"host": host.host}, store.grant(30))
    with pytest.raises(StoreUnavailable):
        publisher.reconcile()
    assert published(store, host) == {}
    call(host, "destroy", uuid=vm["uuid"])


def test_reconcile_publishes_exactly_this_hosts_vms(store, host):
    a = build(host, vcpus=2, memory_mb=128, disk_gb=3)
    b = build(host)
    store.put(f"vms/{host.host}/{uuidlib.uuid4()}", {"state": "running"})     # stale
    store.put("vms/other-host/x", {"state": "running"})                       # not ours
    publisher = VmPublisher(store, host.host, host.conn)

    assert publisher.reconcile() == 3
    records = published(store, host)
    assert records == {
        a["uuid"]: {"host": host.host, "name": a["name"], "uuid": a["uuid"],
                    "state": "running", "vcpus": 2, "memory_mb": 128, "disk_gb": 3, "ha": "none"},
        b["uuid"]: {"host": host.host, "name": b["name"], "uuid": b["uuid"],
                    "state": "running", "vcpus": 1, "memory_mb": 64, "disk_gb": 1, "ha": "none"}}
    assert store.get("vms/other-host/x") is not None

    revision = store.revision()
    assert publisher.reconcile() == 0
    assert store.revision() == revision          # nothing rewritten

    call(host, "suspend", uuid=a["uuid"])
    call(host, "destroy", uuid=b["uuid"])
    assert publisher.reconcile() == 2
    assert {u: r["state"] for u, r in published(store, host).items()} == {a["uuid"]: "paused"}
    call(host, "destroy", uuid=a["uuid"])


def test_lifecycle_events_reach_etcd_without_waiting_for_the_period(store, host):
    publisher = VmPublisher(store, host.host, lambda: host.conn, interval=300).start()
    try:
        wait_for(lambda: publisher.reconciles >= 1)
        args = build(host)
        wait_for(lambda: published(store, host).get(args["uuid"], {}).get("state") == "running")
        call(host, "suspend", uuid=args["uuid"])
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "paused")
        call(host, "stop", uuid=args["uuid"])
        wait_for(lambda: published(store, host)[args["uuid"]]["state"] == "shutoff")
        call(host, "destroy", uuid=args["uuid"])
        wait_for(lambda: published(store, host) == {})
    finally:
        publisher.stop()


def test_the_period_repairs_what_events_cannot_see(store, host):
    publisher = VmPublisher(store, host.host, host.conn, interval=0.2).start()
    try:
        args = build(host)
        wait_for(lambda: args["uuid"] in published(store, host))
        store.delete(f"vms/{host.host}/{args['uuid']}")        # lost behind our back
        wait_for(lambda: args["uuid"] in published(store, host))
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
    revision = store.revision()
    call(host, "build", **args)
    assert store.revision() == revision                 # idempotent: nothing rewritten

    store.delete(key)
    publisher = VmPublisher(store, host.host, host.conn)
    listed = publisher.records

    def stale_listing():
        seen = listed()                                  # running, key absent
        if seen[args["uuid"]]["state"] == "running":
            dom = host.conn.lookupByUUIDString(args["uuid"])
            call(host, "suspend", uuid=args["uuid"])
            publish_domain(store, host.host, dom)        # paused, written after our read
        return seen
    publisher.records = stale_listing
    publisher.reconcile()
    assert store.get(key).value["state"] == "paused"
    call(host, "destroy", uuid=args["uuid"])


def test_an_event_publishes_the_domain_it_names_not_the_whole_host(store, tmp_path):
    """Between periodic reconciles an event re-reads only its own domain: a
    stale key of another VM stays until the period (a host booting many VMs
    does not compare them all on each event), while the VM evented is
    published and, once undefined, unpublished."""
    host = new_host(tmp_path / "state", store)
    publisher = VmPublisher(store, host.host, lambda: host.conn, interval=300).start()
    try:
        wait_for(lambda: publisher.reconciles >= 1)
        stale = f"vms/{host.host}/{uuidlib.uuid4()}"
        store.put(stale, {"state": "running"})
        args = build(host)
        store.delete(f"vms/{host.host}/{args['uuid']}")        # only events can bring it back
        call(host, "suspend", uuid=args["uuid"])
        wait_for(lambda: published(store, host).get(args["uuid"], {}).get("state") == "paused")
        call(host, "destroy", uuid=args["uuid"])
        wait_for(lambda: args["uuid"] not in published(store, host))
        assert store.get(stale) is not None
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
