"""Domains peerctl did not make are counted in hostlist and kept back in
placement: a host's provider reserves what its foreign domains hold, plus
the operator's ``reserved`` setting, and follows them as they change."""
from __future__ import annotations

import math
import uuid as uuidlib

import pytest

from engine.hypervisor.host import accounting, foreign
from engine.hypervisor.host.hostctx import HostContext
from engine.placement import open_placement
from engine.placement.host import drain
from engine.placement.model import capacity
from tests.support import wait_until
from tests.support.cluster import refused
from tests.support.foreign_hosts import Foreign, fake_host, reserved_of

GiB = 1024        # in MiB, as memory_mb counts
# A 4 GiB host whose two foreign domains use 80 % of its memory (3277 MiB).
LEGACY = [Foreign("legacy-db", "6f0c6b5e-1d1a-4e59-9a3c-000000000001", 1, 1638),
          Foreign("legacy-web", "6f0c6b5e-1d1a-4e59-9a3c-000000000002", 1, 1639)]
HELD_MB = sum(d.memory_mb for d in LEGACY)
# ~30 % of that host: more than the 819 MiB its foreign domains leave.
BIG_VM = f"VCPU:1,MEMORY_MB:{round(0.3 * 4 * GiB)},DISK_GB:1"


def providers(cluster) -> dict:
    return {p["name"]: p for p in cluster.cli_json("placement", "providers")}


def start_on(cluster, host, uri, *extra, env=None) -> dict:
    """Start ``host``'s peer on ``uri``; its provider once registered."""
    cluster.start_peer(host, libvirt=uri, extra_args=list(extra), env=env)
    return wait_until(lambda: providers(cluster).get(host),
                      lambda p: p is not None and p["inventories"], timeout=30,
                      what=f"{host} registered")


def test_a_boot_goes_where_foreign_domains_leave_room(cluster, tmp_path):
    crowded = fake_host(tmp_path / "crowded.xml", 4 * GiB, cpus=4, foreign=LEGACY)
    spare = fake_host(tmp_path / "spare.xml", 4 * GiB, cpus=4)
    start_on(cluster, "host1", crowded)
    start_on(cluster, "host2", spare)

    # 2 foreign vCPUs over the VCPU allocation ratio 4, rounded up: 1 CPU
    assert reserved_of(providers(cluster)["host1"]) == {"VCPU": 1, "MEMORY_MB": HELD_MB,
                                                        "DISK_GB": 0}
    assert reserved_of(providers(cluster)["host2"]) == {"VCPU": 0, "MEMORY_MB": 0, "DISK_GB": 0}
    hosts = {h["host"]: h for h in wait_until(
        lambda: cluster.cli_json("hostlist"),
        lambda rows: all(h.get("foreign_vms") is not None for h in rows),
        what="host records with their foreign domains")}
    assert {k: hosts["host1"][k] for k in ("vms", "foreign_vms", "foreign_vcpus",
                                           "foreign_memory_mb", "foreign_disk_gb")} == \
        {"vms": 0, "foreign_vms": 2, "foreign_vcpus": 2, "foreign_memory_mb": HELD_MB,
         "foreign_disk_gb": 0}
    assert hosts["host2"]["foreign_vms"] == 0
    table = cluster.cli("hostlist", "-o", "host,vms,foreign_vms").stdout.splitlines()
    assert table[0].split() == ["Host", "VMs", "Foreign"]
    assert table[1].split() == ["host1", "0", "2"]

    fits = cluster.cli_json("placement", "candidates", BIG_VM)
    assert [c["host"] for c in fits] == ["host2"]
    refused(cluster, ["boot", "vm1", "--resources", BIG_VM, "--on", "host1"], 1, "host1")
    doc = cluster.cli_json("boot", "vm1", "--resources", BIG_VM)
    assert doc["state"] == "done", doc
    assert [vm["host"] for vm in doc["vms"]] == ["host2"]


def test_the_reserved_setting_adds_on_top(cluster, tmp_path):
    by_flag = start_on(cluster, "host1", fake_host(tmp_path / "h1.xml", 4 * GiB, foreign=LEGACY),
                       "--reserved", "MEMORY_MB:256")
    assert reserved_of(by_flag) == {"VCPU": 1, "MEMORY_MB": HELD_MB + 256, "DISK_GB": 0}
    by_env = start_on(cluster, "host2", fake_host(tmp_path / "h2.xml", 4 * GiB, foreign=LEGACY),
                      env={"PEERCTL_RESERVED": "VCPU:1,DISK_GB:2"})
    assert reserved_of(by_env) == {"VCPU": 1 + 1, "MEMORY_MB": HELD_MB, "DISK_GB": 2}


@pytest.mark.parametrize("value, said", [
    ("GPU:1", "bad reserved 'GPU:1' in --reserved"),
    ("MEMORY_MB:-256", "the amount of MEMORY_MB must be a whole number"),
    ("VCPU:1.5", "the amount of VCPU must be a whole number"),
    ("VCPU", "want CLASS:AMOUNT")])
def test_a_bad_reserved_value_is_one_line_and_writes_nothing(cluster, store, value, said):
    refused(cluster, ["peer", "--host", "host1", "--libvirt", "test:///default",
                      "--reserved", value], 2, said)
    assert store.range("")[0] == []


def test_a_bad_reserved_environment_is_blamed_on_it(cluster, store):
    done = cluster.cli("peer", "--host", "host1", "--libvirt", "test:///default",
                       env={"PEERCTL_RESERVED": "VCPU:x"}, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        "peerctl: bad reserved 'VCPU:x' from $PEERCTL_RESERVED (the amount of VCPU must be "
        "a whole number, 0 or more)"]
    assert store.range("")[0] == []


def test_foreign_vcpus_are_overcommitted_as_peerctl_ones_are(store, tmp_path):
    """Eight foreign vCPUs on a 4-CPU host take 8 of its 16 VCPU (ratio 4):
    reserved is 2 CPUs, and the host still has room."""
    busy = [Foreign(f"busy{i}", f"6f0c6b5e-1d1a-4e59-9a3c-00000000001{i}", 2, 64)
            for i in range(4)]
    host = HostContext("acct" + uuidlib.uuid4().hex[:6],
                       fake_host(tmp_path / "busy.xml", 4 * GiB, cpus=4, foreign=busy),
                       store, str(tmp_path))
    provider = accounting.refresh(host, open_placement("etcd", store))
    assert reserved_of(provider)["VCPU"] == 2
    assert capacity(provider["inventories"]["VCPU"]) == 8


# In this process: test:///default's built-in domain `test` (2 vCPUs, 2048 MiB
# current) is foreign, and this process can start and stop it.

@pytest.fixture
def default_host(store, tmp_path):
    """A host of this test's own on test:///default, keeping 100 MiB back by
    setting; the built-in domain `test` running, and running again after."""
    host = HostContext("acct" + uuidlib.uuid4().hex[:6], "test:///default", store,
                       str(tmp_path), reserved={"MEMORY_MB": 100})
    builtin = host.conn.lookupByName("test")
    yield host, builtin
    if not builtin.isActive():
        builtin.create()


def expected(host) -> dict:
    """The setting plus what foreign.usage says the foreign domains hold,
    their vCPUs over the default VCPU allocation ratio (4), rounded up."""
    held = foreign.usage(host.conn, host.state_dir)
    held["VCPU"] = math.ceil(held["VCPU"] / 4)
    return {rc: held[rc] + host.reserved.get(rc, 0) for rc in accounting.CLASSES}


def test_reserved_follows_the_foreign_domains_as_they_stop_and_start(store, default_host):
    host, builtin = default_host
    placement = open_placement("etcd", store)
    running = reserved_of(accounting.refresh(host, placement))
    assert running == expected(host)
    assert running["MEMORY_MB"] >= 2048 + 100 and running["VCPU"] >= 1

    builtin.destroy()
    stopped = reserved_of(accounting.refresh(host, placement))
    assert stopped == expected(host)
    assert stopped["MEMORY_MB"] == running["MEMORY_MB"] - 2048
    unchanged = placement.provider(host.host)["generation"]
    accounting.refresh(host, placement)                 # nothing changed: nothing written
    assert placement.provider(host.host)["generation"] == unchanged

    builtin.create()
    assert reserved_of(accounting.refresh(host, placement)) == running


def test_a_foreign_domain_holding_an_allocation_is_left_out(store, default_host):
    host, builtin = default_host
    placement = open_placement("etcd", store)
    running = reserved_of(accounting.refresh(host, placement))
    builtin.destroy()                       # what the others hold, without `test`
    without = expected(host)
    builtin.create()
    assert without["MEMORY_MB"] == running["MEMORY_MB"] - 2048
    assert reserved_of(accounting.refresh(host, placement, excluded={builtin.UUIDString()})) \
        == without
    with accounting.lock(host.host):        # as adopt does: lower reserved, then claim
        provider = accounting.refresh(host, placement, excluded={builtin.UUIDString()})
        placement.claim(builtin.UUIDString(),
                        {provider["uuid"]: {"VCPU": 2, "MEMORY_MB": 2048}},
                        project="p", user="u")
    assert reserved_of(accounting.refresh(host, placement)) == without
    placement.release(builtin.UUIDString())             # let go: foreign and unaccounted
    assert reserved_of(accounting.refresh(host, placement)) == running


def test_a_drained_host_stays_drained_across_refreshes(store, default_host):
    host, builtin = default_host
    placement = open_placement("etcd", store)
    accounting.refresh(host, placement)
    drain(placement, host.host)
    builtin.destroy()
    provider = accounting.refresh(host, placement)
    assert all(inv["reserved"] == inv["total"] for inv in provider["inventories"].values())
