"""Each domain's peerctl metadata is remembered while libvirt's events say
it has not changed: a listening publisher's reconciles and the stats tick's
scan read a domain's metadata once, and again only after it changed,
whoever changed it (libvirt's metadata-change event, or this process's own
write at once); a memo that hears no events remembers nothing (the test
driver in this process, a real etcd)."""
from __future__ import annotations


import libvirt

from engine.core import keys
from engine.hypervisor.domain.domain_xml import NAMESPACE, read_metadata, write_metadata
from engine.hypervisor.domain.metadata_memo import MetadataMemo
from engine.hypervisor.host.foreign import scan
from engine.hypervisor.host.vmpublish import VmPublisher
from tests.support import wait_for
from tests.support.handlers import TEST_URI, build, call, host  # noqa: F401  (host: a fixture)


def published(store, host):
    return {kv.key.rsplit("/", 1)[1]: kv.value for kv in store.range(keys.vm(host.host))[0]}


def recorded(store, host, args):
    """The record ``build`` writes, put by hand: this host's handlers write
    to no etcd."""
    store.put(keys.vm(host.host, args["uuid"]),
              {"host": host.host, "name": args["name"], "uuid": args["uuid"],
               "state": "running", "vcpus": args["vcpus"], "memory_mb": args["memory_mb"],
               "disk_gb": args["disk_gb"], "ha": "none", "want": "running"})


def _set_behind_peerctls_back(uuid: str, **changes) -> None:
    """Change the domain's peerctl metadata through a connection of its own,
    as an operator's ``virsh metadata`` would: only libvirt's event tells."""
    conn = libvirt.open(TEST_URI)
    try:
        dom = conn.lookupByUUIDString(uuid)
        values = {**read_metadata(dom), **changes}
        xml = "<vm>" + "".join(f"<{k}>{v}</{k}>" for k, v in values.items()) + "</vm>"
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, "peerctl", NAMESPACE,
                        libvirt.VIR_DOMAIN_AFFECT_CONFIG | libvirt.VIR_DOMAIN_AFFECT_LIVE)
    finally:
        conn.close()


def test_a_listening_publisher_reads_metadata_once_and_again_when_it_changed(store, host):
    vm = build(host)
    recorded(store, host, vm)
    publisher = VmPublisher(store, host.host, lambda: host.conn, interval=0.2,
                            heard_interval=0.2).start()
    try:
        wait_for(lambda: publisher.reconciles >= 2 and publisher.memo.armed,
                 what="two reconciles of a listening publisher")
        reads, reconciles = publisher.memo.reads, publisher.reconciles
        scan(host.conn, publisher.memo)                 # the stats tick's scan
        wait_for(lambda: publisher.reconciles >= reconciles + 3, what="three more reconciles")
        assert publisher.memo.reads == reads, "unchanged domains were read again"

        _set_behind_peerctls_back(vm["uuid"], ha="restart")
        wait_for(lambda: published(store, host)[vm["uuid"]]["ha"] == "restart",
                 what="the record showing the metadata changed behind peerctl's back")
        assert publisher.memo.reads > reads
    finally:
        publisher.stop()
        call(host, "destroy", uuid=vm["uuid"])
    assert not publisher.memo.armed, "a stopped publisher's memo still answered"


def test_this_processs_own_metadata_write_is_seen_by_the_next_scan_at_once(host):
    vm = build(host)
    memo = MetadataMemo()
    memo.arm()          # as if events were heard: none are, so only the write can tell
    try:
        first = {d.UUIDString(): m for d, m in scan(host.conn, memo)}
        assert first[vm["uuid"]].get("ha") in (None, "none")
        write_metadata(host.conn.lookupByUUIDString(vm["uuid"]), {"ha": "restart"})
        again = {d.UUIDString(): m for d, m in scan(host.conn, memo)}
        assert again[vm["uuid"]]["ha"] == "restart"
    finally:
        call(host, "destroy", uuid=vm["uuid"])


def test_a_memo_that_hears_no_events_or_is_overtaken_by_one_keeps_nothing():
    memo = MetadataMemo()
    assert memo.read("u1", lambda: {"host": "h1"}) == {"host": "h1"}
    assert memo.read("u1", lambda: {"host": "h2"}) == {"host": "h2"}, "unarmed, yet kept"

    memo.arm()
    memo.read("u1", lambda: {"host": "h1"})
    assert memo.read("u1", lambda: {"host": "h2"}) == {"host": "h1"}
    memo.forget("u1")                                   # an event named it
    assert memo.read("u1", lambda: {"host": "h2"}) == {"host": "h2"}

    def overtaken():
        memo.forget("u2")                               # its event came during the read
        return {"host": "old"}
    memo.read("u2", overtaken)
    assert memo.read("u2", lambda: {"host": "new"}) == {"host": "new"}

    def overtaken_by_all():
        memo.forget()                                   # an event naming no domain
        return {"host": "old"}
    memo.read("u3", overtaken_by_all)
    assert memo.read("u3", lambda: {"host": "new"}) == {"host": "new"}

    memo.disarm()                                       # its event connection died
    assert memo.read("u2", lambda: {"host": "newer"}) == {"host": "newer"}
    assert memo.read("u2", lambda: {"host": "newest"}) == {"host": "newest"}


def test_a_domains_other_facts_are_kept_apart_and_forgotten_with_its_metadata():
    memo = MetadataMemo()
    memo.arm()
    assert memo.read("u1", lambda: 1048576, what="max_kib") == 1048576
    assert memo.read("u1", lambda: {"host": "h1"}) == {"host": "h1"}, "the facts were mixed up"
    assert memo.read("u1", lambda: 2097152, what="max_kib") == 1048576
    memo.forget("u1")                                   # it stopped, or was defined anew
    assert memo.read("u1", lambda: 2097152, what="max_kib") == 2097152
    assert memo.read("u1", lambda: {"host": "h2"}) == {"host": "h2"}
