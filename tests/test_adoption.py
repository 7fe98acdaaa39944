"""Brownfield on the test driver: domains peerctl did not make are listed,
adopted in place, destroyed or let go, and never touched while foreign.

host1 is a test-driver host file preloaded with foreign domains (as if
defined by hand); the other hosts run test:///default (whose own built-in
``test`` domain is foreign too)."""
from __future__ import annotations

import uuid as uuidlib

import pytest

from engine.core import api, failpoints, keys
from engine.core.registry import load_automations
from engine.core.values import readable
from tests.support import wait_for
from tests.support.cluster import finished, refused, start_peers
from tests.support.foreign_hosts import fake_host

NOVA = "http://openstack.org/xmlns/libvirt/nova/1.1"
FAST_SWEEPS = {"PEERCTL_RECONCILE_INTERVAL": "0.5", "PEERCTL_GHOST_INTERVAL": "0.5",
               "PEERCTL_PUBLISH_INTERVAL": "1"}


class Domain:
    """A domain as someone defined it by hand: running unless ``shutoff``."""

    def __init__(self, name: str, memory_mb: int = 128, vcpus: int = 1, metadata: str = ""):
        self.name, self.memory_mb, self.vcpus, self.metadata = name, memory_mb, vcpus, metadata
        self.uuid = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, name))

    def xml(self) -> str:
        return (f"<domain type='test'><name>{self.name}</name><uuid>{self.uuid}</uuid>"
                f"<memory unit='MiB'>{self.memory_mb}</memory><vcpu>{self.vcpus}</vcpu>"
                f"<metadata>{self.metadata}</metadata>"
                f"<os><type arch='i686'>hvm</type></os></domain>")


LEGACY = [Domain(f"legacy-{i:02d}") for i in range(1, 21)]
NOVA_VM = Domain("nova-vm", metadata=f"<nova:instance xmlns:nova='{NOVA}'/>")
CLASH = Domain("clash")


def start_brownfield(cluster, store, tmp_path, domains, others=("host2",), env=None):
    uri = fake_host(tmp_path / "host1.xml", memory_mb=16384, cpus=16, foreign=domains)
    cluster.start_peer("host1", libvirt=uri, env={**FAST_SWEEPS, **(env or {})})
    start_peers(cluster, store, list(others), env={**FAST_SWEEPS, **(env or {})})
    wait_for(lambda: {d.uuid for d in domains} <= foreign_uuids(store, "host1"),
             timeout=30, what="host1's foreign domains published")


def foreign_uuids(store, host: str) -> set[str]:
    prefix = keys.foreign(host)
    return {keys.suffix(kv.key, prefix) for kv in store.range(prefix, keys_only=True)[0]}


def managed(store, host: str) -> dict[str, dict]:
    """``vms/<host>/`` by uuid."""
    return {kv.value["uuid"]: kv.value for kv in store.range(keys.vm(host))[0]}


def reserved(cluster, host: str) -> dict:
    provider = {p["name"]: p for p in cluster.cli_json("placement", "providers")}[host]
    return {rc: inventory["reserved"] for rc, inventory in provider["inventories"].items()}


def allocated(cluster) -> set[str]:
    return {a["consumer"] for a in cluster.cli_json("placement", "allocations")}


def rows_by_name(cluster, *args) -> dict[str, dict]:
    return {row["name"]: row for row in cluster.cli_json("vmlist", "--all", *args)}


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_twenty_foreign_domains_are_adopted_then_one_destroyed_and_one_let_go(
        cluster, store, tmp_path):
    start_brownfield(cluster, store, tmp_path, [*LEGACY, NOVA_VM])
    rows = rows_by_name(cluster, "host1/*")
    assert {name for name, row in rows.items() if not row["managed"]} == \
        {d.name for d in [*LEGACY, NOVA_VM]}
    assert rows["nova-vm"]["manager"].startswith("Nova"), rows["nova-vm"]
    assert cluster.cli_json("vmlist") == []            # without --all: peerctl's VMs only
    table = cluster.cli("vmlist", "--all", "host1/legacy-01").stdout.splitlines()
    assert table[0].split()[-1] == "Managed" and table[1].split()[-1] == "no", table

    doc = cluster.cli_json("adopt", "host1/legacy-*", "--yes")
    assert doc["state"] == "done", doc
    assert sorted(vm["name"] for vm in doc["vms"]) == [d.name for d in LEGACY]
    assert {vm["state"] for vm in doc["vms"]} == {"running"}
    assert set(managed(store, "host1")) == {d.uuid for d in LEGACY}
    assert {d.uuid for d in LEGACY} <= allocated(cluster)
    assert foreign_uuids(store, "host1") == {NOVA_VM.uuid}
    listed = {vm["name"]: vm for vm in cluster.cli_json("vmlist")}
    assert listed["legacy-01"]["memory_mb"] == 128 and listed["legacy-01"]["host"] == "host1"
    assert store.get(keys.vm_definition(LEGACY[0].uuid)) is not None
    # what the adopted ones hold is claimed now, no longer reserved
    assert reserved(cluster, "host1")["MEMORY_MB"] == NOVA_VM.memory_mb

    gone, freed, kept = LEGACY[:3]
    assert cluster.cli_json("destroy", gone.name)["state"] == "done"
    assert gone.name not in rows_by_name(cluster)       # undefined, not foreign
    assert gone.uuid not in allocated(cluster)

    doc = cluster.cli_json("unmanage", freed.name)
    assert doc["state"] == "done" and doc["vms"][0]["state"] == "running", doc
    assert freed.uuid not in managed(store, "host1")
    assert freed.uuid not in allocated(cluster)
    assert store.get(keys.vm_definition(freed.uuid)) is None
    assert rows_by_name(cluster)[freed.name]["managed"] is False

    # The reconciler and the ghost sweeps run beside it, pass after pass.
    passes = set()
    wait_for(lambda: passes.add(readable(store.get(keys.RECONCILE_REPORT))["time"])
             or len(passes) >= 4, timeout=30, what="three more reconciler passes")
    row = rows_by_name(cluster)[freed.name]
    assert row["managed"] is False and row["state"] == "running", row
    assert freed.uuid not in allocated(cluster) and freed.uuid not in managed(store, "host1")
    assert kept.uuid in managed(store, "host1")
    wait_for(lambda: reserved(cluster, "host1")["MEMORY_MB"]
             == NOVA_VM.memory_mb + freed.memory_mb, timeout=30,
             what="the domain let go reserved again")


def test_refusals_are_one_line_and_change_nothing(cluster, store, tmp_path):
    start_brownfield(cluster, store, tmp_path, [LEGACY[0], NOVA_VM, CLASH])
    cluster.cli_json("boot", "clash", "--resources", "VCPU:1,MEMORY_MB:64", "--on", "host2")
    before = (allocated(cluster), set(managed(store, "host1")), foreign_uuids(store, "host1"))

    refused(cluster, ["adopt", "host1/nova-vm"], 1, "Nova")
    refused(cluster, ["adopt", "host1/clash"], 1, "a peerctl VM is named 'clash' already")
    refused(cluster, ["adopt", "host1/nothing-*"], 1, "no foreign domain matches")
    refused(cluster, ["adopt", "legacy-01"], 2, "adopt takes HOSTGLOB/VMGLOB")
    refused(cluster, ["adopt", "host1/*", "--yes"], 1, "cannot adopt 2 domains")
    assert (allocated(cluster), set(managed(store, "host1")),
            foreign_uuids(store, "host1")) == before

    cluster.kill("host2")
    wait_for(lambda: not foreign_uuids(store, "host2"), timeout=30,
             what="host2's foreign records gone with its lease")
    refused(cluster, ["adopt", "host2/*"], 1, "host2 is down")


@pytest.mark.parametrize("point", ["append adopt_survey", "append adopt_claim",
                                   "append adopt_take", "finish"])
def test_an_adopt_whose_initiator_dies_leaves_each_domain_adopted_or_foreign(
        cluster, store, tmp_path, point):
    armed = tmp_path / "failpoints"
    armed.write_text("")
    leaders = ["m1", "m2", "m3"]
    start_brownfield(cluster, store, tmp_path, LEGACY[:2], others=leaders,
                     env={failpoints.ENV: str(armed)})
    load_automations()
    failpoints.arm(str(armed), [point])
    vms = [{"host": "host1", "name": d.name, "uuid": d.uuid} for d in LEGACY[:2]]
    automation = api.start_automation(store, "adopt", {"vms": vms, "ha": "none"},
                                      prefer=leaders)
    wait_for(lambda: failpoints.fired(str(armed)), timeout=60, what="the initiator killed")
    task = finished(store, automation, timeout=90)
    assert task["state"] == "done", task
    claims = allocated(cluster)
    for domain in LEGACY[:2]:
        owned = domain.uuid in managed(store, "host1")
        foreign = domain.uuid in foreign_uuids(store, "host1")
        assert owned != foreign, (domain.name, owned, foreign)
        assert (domain.uuid in claims) == owned, (domain.name, claims)
    still_foreign = [d for d in LEGACY[:2] if d.uuid in foreign_uuids(store, "host1")]
    assert reserved(cluster, "host1")["MEMORY_MB"] == sum(d.memory_mb for d in still_foreign)


def test_unmanage_refuses_a_replicated_vm_and_keeps_its_backups(cluster, store, tmp_path):
    start_peers(cluster, store, ["host2", "host3"], env=FAST_SWEEPS)
    cluster.cli_json("boot", "db1", "db2", "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1",
                     "--on", "host2")
    cluster.cli_json("replicate", "db1", "--every", "1h")
    before = allocated(cluster)
    refused(cluster, ["unmanage", "db1"], 1, "it is replicated to")
    refused(cluster, ["unmanage", "nothing-*"], 1, "no VM matches")
    assert allocated(cluster) == before

    assert cluster.cli_json("backup", "db2")["state"] == "done"
    doc = cluster.cli_json("unmanage", "db2")
    assert doc["vms"][0]["backups_kept"] == 1, doc
    assert [b["vm"] for b in cluster.cli_json("backup", "list")] == ["db2"]
    assert rows_by_name(cluster)["db2"]["managed"] is False
