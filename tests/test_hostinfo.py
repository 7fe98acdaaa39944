"""host_facts: the host record's numbers, from libvirt and psutil; and
Publication: when a measured record is worth writing again."""
from __future__ import annotations

import platform
import uuid as uuidlib

import libvirt

from engine.hypervisor.host.hostinfo import (DRIFT_EVERY, MOVED_EVERY, Publication, host_facts,
                                       hypervisor_version)
from tests.support.handlers import TEST_URI, call, host  # noqa: F401  (host: a fixture)

KEYS = {"vcpus": int, "cpu_usage": float, "memory_mb": int, "free_memory_mb": int,
        "disk_gb": float, "free_disk_gb": float, "net_rx_bytes": int, "net_tx_bytes": int,
        "vms": int, "domains": int, "foreign_vms": int, "foreign_vcpus": int,
        "foreign_memory_mb": int, "foreign_disk_gb": int, "hypervisor": str, "libvirt": str,
        "kernel": str, "cpu_model": str}


def test_host_facts_have_every_hostlist_and_hoststats_column(tmp_path):
    conn = libvirt.open(TEST_URI)
    facts = host_facts(conn, str(tmp_path / "not-yet-created"))
    assert set(facts) == set(KEYS)
    for key, kind in KEYS.items():
        assert isinstance(facts[key], kind), (key, facts[key])
    _arch, memory_mb, cpus, *_ = conn.getInfo()
    assert (facts["vcpus"], facts["memory_mb"]) == (cpus, memory_mb)   # the hypervisor's
    assert 0 <= facts["free_memory_mb"] <= facts["memory_mb"]
    assert 0 < facts["free_disk_gb"] <= facts["disk_gb"]
    assert 0.0 <= facts["cpu_usage"] <= 100.0
    assert facts["hypervisor"] == hypervisor_version(conn)
    assert facts["hypervisor"].split()[0] == conn.getType()
    assert facts["kernel"] == platform.release()
    assert facts["cpu_model"]


def test_vms_counts_this_hosts_peerctl_domains_and_their_memory(host):
    before = host_facts(host.conn, host.state_dir, host.host)
    assert before["vms"] == 0
    assert before["domains"] >= 1          # the test driver's own "test" domain
    assert before["foreign_vms"] >= 1      # ... which peerctl did not make
    assert before["foreign_memory_mb"] >= 2048 and before["foreign_vcpus"] >= 2
    assert before["free_memory_mb"] <= before["memory_mb"] - before["foreign_memory_mb"]
    args = {"uuid": str(uuidlib.uuid4()), "name": "f-" + uuidlib.uuid4().hex[:8],
            "vcpus": 1, "memory_mb": 512, "disk_gb": 0, "image": None}
    call(host, "build", **args)
    after = host_facts(host.conn, host.state_dir, host.host)
    assert after["vms"] == 1
    assert after["domains"] == before["domains"] + 1
    assert after["foreign_vms"] == before["foreign_vms"]
    assert after["free_memory_mb"] <= before["free_memory_mb"] - 512 + 64  # psutil moves too
    call(host, "destroy", uuid=args["uuid"])


def test_one_scan_serves_the_record_and_the_accounting_reading_each_domain_once(
        host, store, monkeypatch):
    """The peer's stats tick reads every domain's metadata once
    (``foreign.scan``), and the host record and placement's reserved are
    made from that scan: the same figures as from fresh reads, and no
    second read of any domain."""
    from engine.hypervisor.host import accounting, foreign
    from engine.placement import open_placement
    args = {"uuid": str(uuidlib.uuid4()), "name": "f-" + uuidlib.uuid4().hex[:8],
            "vcpus": 1, "memory_mb": 512, "disk_gb": 0, "image": None}
    call(host, "build", **args)
    placement = open_placement("etcd", store)
    try:
        fresh_facts = host_facts(host.conn, host.state_dir, host.host)
        fresh_reserved = accounting.reserved_for(host, placement)
        reads = []
        real = foreign.read_metadata
        monkeypatch.setattr(foreign, "read_metadata", lambda dom: reads.append(dom) or real(dom))
        scanned = foreign.scan(host.conn)
        assert len(reads) == len(scanned) == fresh_facts["domains"]
        facts = host_facts(host.conn, host.state_dir, host.host, scanned)
        reserved = accounting.reserved_for(host, placement, scanned=scanned)
        assert len(reads) == len(scanned), "a domain's metadata was read again"
        steady = {k: v for k, v in facts.items() if k not in ("cpu_usage", "free_memory_mb",
                                                              "free_disk_gb", "net_rx_bytes",
                                                              "net_tx_bytes")}
        assert steady == {k: fresh_facts[k] for k in steady}
        assert (facts["vms"], facts["foreign_vms"]) == (1, fresh_facts["foreign_vms"])
        assert reserved == fresh_reserved
    finally:
        placement.close()
        call(host, "destroy", uuid=args["uuid"])


# -- when a record is written again (Publication): records in, reasons out ------------

RECORD = {"host": "host1", "pid": 4242, "updated": 1000.0, "vcpus": 8, "memory_mb": 16384,
          "disk_gb": 500.0, "vms": 2, "networks": ["default"], "version": "1.0",
          "cpu_usage": 3.0, "free_memory_mb": 8000, "free_disk_gb": 250.0,
          "net_rx_bytes": 10_000, "net_tx_bytes": 20_000}


def published(at: float = 0.0) -> Publication:
    publication = Publication()
    publication.written(RECORD, at)
    return publication


def test_a_record_nobody_wrote_yet_is_due():
    assert Publication().due(RECORD, 0.0) == "changed"


def test_an_unchanged_record_is_never_written_again_whenever_it_was_measured():
    publication = published()
    for now in (5.0, MOVED_EVERY, DRIFT_EVERY, 24 * 3600.0):
        assert publication.due({**RECORD, "updated": 1000.0 + now}, now) is None


def test_what_the_host_is_or_holds_is_written_on_the_first_tick_that_sees_it_change():
    publication = published()
    assert publication.due({**RECORD, "vms": 3}, 5.0) == "changed"
    assert publication.due({**RECORD, "networks": []}, 5.0) == "changed"
    assert publication.due({**RECORD, "error": "libvirt is down"}, 5.0) == "changed"
    assert publication.due({k: v for k, v in RECORD.items() if k != "version"}, 5.0) \
        == "changed"


def test_a_gauge_past_its_step_waits_for_moved_every_after_the_last_write():
    publication = published()
    busy = {**RECORD, "cpu_usage": 3.0 + 10.0}
    assert publication.due(busy, MOVED_EVERY - 5) is None
    assert publication.due(busy, MOVED_EVERY) == "moved"
    # free memory: 5 % of memory_mb (819 MiB of 16 GiB)
    assert publication.due({**RECORD, "free_memory_mb": 8000 - 818}, MOVED_EVERY) is None
    assert publication.due({**RECORD, "free_memory_mb": 8000 + 820}, MOVED_EVERY) == "moved"
    publication.written(busy, MOVED_EVERY)
    assert publication.due({**busy, "cpu_usage": 90.0}, MOVED_EVERY + 5) is None


def test_a_drift_under_the_steps_is_written_every_drift_every():
    publication = published()
    drift = {**RECORD, "cpu_usage": 9.0, "free_memory_mb": 7900, "free_disk_gb": 249.0,
             "net_rx_bytes": 10**9, "net_tx_bytes": 10**9}
    for now in (5.0, MOVED_EVERY, DRIFT_EVERY - 5):
        assert publication.due(drift, now) is None
    assert publication.due(drift, DRIFT_EVERY) == "drifted"


def test_a_gauge_past_its_step_on_every_tick_is_written_once_a_minute():
    publication, writes = published(), 0
    for tick in range(1, 721):                  # an hour of 5 s ticks, 1 GiB less each
        now = tick * 5.0
        record = {**RECORD, "free_memory_mb": 16000 - tick * 1024 % 16000, "net_rx_bytes": tick}
        if publication.due(record, now):
            publication.written(record, now)
            writes += 1
    assert writes == 3600 / MOVED_EVERY


def test_the_record_says_what_the_pool_has_free_and_what_its_vms_disks_may_grow_into(host):
    assert "vm_disk_growth_gb" not in host_facts(host.conn, host.state_dir, host.host)  # no pool
    args = {"uuid": str(uuidlib.uuid4()), "name": "f-" + uuidlib.uuid4().hex[:8],
            "vcpus": 1, "memory_mb": 512, "disk_gb": 4, "image": None}
    call(host, "build", **args)
    facts = host_facts(host.conn, host.state_dir, host.host)
    pool = host.conn.storagePoolLookupByName("peerctl-" + host.host)
    (vol,) = pool.listAllVolumes(0)
    _kind, capacity, allocation = vol.info()
    assert facts["vm_disk_growth_gb"] == round((capacity - allocation) / 2 ** 30, 1) == 4.0
    assert facts["pool_free_gb"] == round(pool.info()[3] / 2 ** 30, 1)
    call(host, "destroy", uuid=args["uuid"])
    assert host_facts(host.conn, host.state_dir, host.host)["vm_disk_growth_gb"] == 0.0
