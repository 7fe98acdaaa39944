"""host_facts: the host record's numbers, from libvirt and psutil."""
from __future__ import annotations

import platform
import uuid as uuidlib

import libvirt

from engine.hypervisor.hostinfo import host_facts, hypervisor_version
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
