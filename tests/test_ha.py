"""HA restart on libvirt's test driver: real etcd, real peers, the real
command line.  Each peer's ``test:///`` hypervisor lives in its process, so
a SIGKILLed peer takes its domains with it (no fence is needed here; the
QEMU tier, tests/test_ha_qemu.py, proves the guard)."""
import collections
import signal
import time

import pytest

from engine.core import api, failpoints, keys
from engine.hypervisor.host.aside import keep_aside, delete_aside
from engine.hypervisor.storage import images
from engine.placement import open_placement
from tests.support import TEST_AUTOMATIONS, wait_for
from tests.support.cluster import finished
from tests.support.ha_hosts import MARGIN, SMALL, boot, start_hosts, vmlist
from tests.support.handlers import call, new_host
from tests.support.vms import allocations, inventory

def running_copies(store, hosts):
    """uuid -> the hosts whose hypervisor runs it."""
    where = collections.defaultdict(list)
    for host, held in inventory(store, hosts).items():
        for domain in held["domains"]:
            if domain["name"] != "test" and domain["state"] == "running":
                where[domain["uuid"]].append(host)
    return dict(where)


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_dead_hosts_ha_vms_run_elsewhere_and_the_others_are_unknown(
        cluster, store, tmp_path, monkeypatch):
    """SIGKILL the peer of host h1, which holds 10 HA VMs and 5 without HA.
    The recovery's initiator is SIGKILLed too, at its first placement step.
    The 10 run elsewhere, once each, rebuilt and marked recovered; the 5
    are listed unknown on h1; placement holds each VM where it is listed.
    When both peers come back, nothing runs twice."""
    armed = tmp_path / "failpoints"
    armed.write_text("")
    env = {failpoints.ENV: str(armed)}
    hosts = ["h1", "h2", "h3", "h4"]
    start_hosts(cluster, store, tmp_path, hosts, env=env)
    ha = boot(cluster, [f"ha{i}" for i in range(10)], "h1", "--ha", "restart")
    plain = boot(cluster, [f"plain{i}" for i in range(5)], "h1")
    listed = vmlist(cluster)
    assert {listed[name]["ha"] for name in ha} == {"restart"}
    assert {listed[name]["ha"] for name in plain} == {"none"}
    failpoints.arm(str(armed), ["append claim_move"])

    killed_at = time.monotonic()
    cluster.kill("h1")

    def recovered():
        vms = vmlist(cluster)
        return vms if all(vms[n]["host"] != "h1" and vms[n]["state"] == "running"
                          for n in ha) else None
    vms = wait_for(recovered, timeout=60, what="the 10 HA VMs running on other hosts")
    took = time.monotonic() - killed_at
    assert (armed.parent / "failpoints.fired").read_text().startswith("append claim_move"), \
        "the recovery's initiator was not killed"
    for name, uuid in ha.items():
        assert vms[name]["uuid"] == uuid            # the same VM: same uuid, so same MACs
        assert vms[name]["recovered"]["from"] == "h1"
        assert vms[name]["ha"] == "restart"
    for name in plain:
        assert (vms[name]["host"], vms[name]["state"]) == ("h1", "unknown")

    recovery = store.get(keys.recovery("h1")).value
    task = finished(store, recovery["automation"])
    assert task["state"] == "done", task["error"]
    assert sorted(r["state"] for r in task["result"]["vms"]) == ["restarted"] * 10
    print(f"10 HA VMs running elsewhere {took:.1f} s after SIGKILL (TTL 2, margin {MARGIN})")

    placement = open_placement("etcd", store)
    names = {p["uuid"]: p["name"] for p in placement.providers()}
    held = allocations(store)
    assert set(held) == set(ha.values()) | set(plain.values()), "orphan or lost allocations"
    for name, uuid in {**ha, **plain}.items():
        assert [names[rp] for rp in held[uuid]["allocations"]] == [vms[name]["host"]]
    assert store.range(keys.lock("vm/"))[0] == []

    # Both dead peers come back (the initiator's host died at its failpoint).
    dead = [h for h in hosts if h not in api.live_hosts(store)]
    for name in dead:
        cluster.start_peer(name, libvirt=f"test://{tmp_path / f'{name}.xml'}",
                           extra_args=["--ha-margin", str(MARGIN)],
                           env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS})
    wait_for(lambda: set(hosts) <= set(api.live_hosts(store)), what="all hosts back")
    copies = running_copies(store, hosts)
    for uuid in ha.values():
        assert len(copies.get(uuid, [])) == 1, (uuid, copies.get(uuid))
    assert all(len(where) == 1 for where in copies.values()), copies


@pytest.mark.slow       # a long scenario: an HA window run to its end
def test_a_host_back_within_the_margin_keeps_its_vms(cluster, store, tmp_path):
    """Flapping: h1's peer is frozen until its lease has expired, then
    thawed within the margin.  Nothing is recovered: its HA VMs stay its
    own, running once."""
    start_hosts(cluster, store, tmp_path, ["h1", "h2"], margin=8)
    ha = boot(cluster, ["web1", "web2"], "h1", "--ha", "restart")
    cluster.kill("h1", signal.SIGSTOP)
    wait_for(lambda: "h1" not in api.live_hosts(store), timeout=20, what="h1's lease to expire")
    cluster.kill("h1", signal.SIGCONT)
    wait_for(lambda: "h1" in api.live_hosts(store), timeout=20, what="h1 back")
    # The margin (8 s) passes with h1 alive: the recoverer must start nothing.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert store.get(keys.recovery("h1")) is None, "a flapping host was recovered"
        time.sleep(0.5)
    vms = vmlist(cluster)
    assert {(vms[n]["host"], vms[n]["state"], vms[n]["recovered"]) for n in ha} == \
        {("h1", "running", None)}
    assert running_copies(store, ["h1", "h2"]) == {uuid: ["h1"] for uuid in ha.values()}


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_ha_policy_is_set_listed_and_refused_for_a_dead_host(cluster, store, tmp_path):
    start_hosts(cluster, store, tmp_path, ["h1", "h2"])
    boot(cluster, ["db1", "db2"], "h1")
    assert {vm["ha"] for vm in vmlist(cluster).values()} == {"none"}
    doc = cluster.cli_json("ha", "h1/db*", "restart")
    assert doc["state"] == "done"
    assert sorted((vm["name"], vm["ha"]) for vm in doc["vms"]) == [("db1", "restart"),
                                                                  ("db2", "restart")]
    # The record, the domain's metadata (what a guard reads) and the definition.
    assert {vm["ha"] for vm in vmlist(cluster).values()} == {"restart"}
    table = cluster.cli("vmlist", "-o", "name,ha")
    assert table.returncode == 0 and "restart" in table.stdout
    uuid = vmlist(cluster)["db1"]["uuid"]
    assert store.get(keys.vm_definition(uuid)).value["build"]["name"] == "db1"
    assert cluster.cli_json("ha", "db2", "none")["vms"][0]["ha"] == "none"

    bad = cluster.cli("ha", "db1", "sometimes")
    assert bad.returncode == 2 and "restart" in bad.stderr
    bad = cluster.cli("boot", "x", "--resources", SMALL, "--ha", "maybe")
    assert bad.returncode == 2
    missing = cluster.cli("ha", "nosuch*", "restart")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1

    cluster.kill("h1")
    wait_for(lambda: "h1" not in api.live_hosts(store), timeout=20, what="h1 dead")
    before = store.revision()
    refused = cluster.cli("ha", "db2", "restart")
    assert refused.returncode == 1, refused
    assert "down" in refused.stderr and refused.stderr.count("\n") == 1
    assert "Traceback" not in refused.stderr
    assert not [kv for kv in store.range("auto/")[0] if kv.mod_revision > before]


def test_a_stale_copy_is_kept_aside_and_deleted_only_on_purpose(store, tmp_path):
    """What a returning host does with its copy of a VM restarted elsewhere
    (a disowned mark with ``keep``): the domain is stopped and undefined,
    its volumes renamed and listed; deleting them is a request of its own."""
    from engine.hypervisor.host.reconciler import sweep_ghosts
    host = new_host(tmp_path / "state", store)
    args = {"uuid": "5d6a4c0e-1f53-4b6c-9a53-3f0a1d9e6b21", "name": "db1", "vcpus": 1,
            "memory_mb": 64, "disk_gb": 1, "ha": "restart"}
    call(host, "build", **args)
    pool = images.ensure_pool(host)
    volumes = sorted(vol.name() for vol in images.volumes_of(pool, args["uuid"]))
    assert volumes
    from engine.hypervisor.host.vm import disown
    disown(host, {"uuid": args["uuid"], "host": host.host, "keep": True,
                  "automation": "recover-1", "reason": "restarted on h2"})
    sweep_ghosts(store, host)
    assert host.conn.listAllDomains(0) == [] or all(
        d.UUIDString() != args["uuid"] for d in host.conn.listAllDomains(0))
    assert images.volumes_of(pool, args["uuid"]) == []
    [kv] = store.range(keys.aside(host.host))[0]
    record = kv.value
    assert (record["name"], record["uuid"], record["reason"]) == ("db1", args["uuid"],
                                                                 "restarted on h2")
    kept = sorted(vol.name() for vol in pool.listAllVolumes(0)
                  if vol.name().startswith("aside-"))
    assert kept == sorted(v["name"] for v in record["volumes"])
    assert [name[len(f"aside-{args['uuid']}-") + 10:] for name in kept] == \
        [name[len(args["uuid"]):] for name in volumes]
    # Building the VM here again (it may come back) does not touch them.
    call(host, "build", **args)
    call(host, "destroy", uuid=args["uuid"])
    assert sorted(vol.name() for vol in pool.listAllVolumes(0)
                  if vol.name().startswith("aside-")) == kept
    # A second sweep (after a crash) changes nothing.
    sweep_ghosts(store, host)
    assert [kv.value for kv in store.range(keys.aside())[0]] == [record]

    gone = delete_aside(host, {"id": record["id"]})
    assert sorted(gone["deleted"]) == kept
    assert not [v for v in pool.listAllVolumes(0) if v.name().startswith("aside-")]
    assert store.range(keys.aside())[0] == []
    assert keep_aside(host, args["uuid"], {"time": 1}) is None     # nothing left to keep


def test_a_definition_outlives_its_vm_by_two_reconciler_passes(store):
    """vmdef/ of a VM that is gone (no record, no allocation, no running
    automation) goes on the second pass; a listed VM's stays."""
    from engine.hypervisor.host.reconciler import reconcile_once
    gone, listed = "0f6a1f44-7f0e-4d0a-8d6e-4f3b1c2a9e01", "6c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"
    for uuid in (gone, listed):
        store.put(keys.vm_definition(uuid), {"uuid": uuid, "name": uuid[:4], "build": {}})
    store.put(keys.vm("h9", listed), {"host": "h9", "name": "kept", "uuid": listed,
                                      "state": "running"})
    placement = open_placement("etcd", store)
    suspects = set()
    reconcile_once(store, placement, suspects)
    assert store.get(keys.vm_definition(gone)) is not None      # seen once: not yet
    reconcile_once(store, placement, suspects)
    assert store.get(keys.vm_definition(gone)) is None
    assert store.get(keys.vm_definition(listed)) is not None


def test_a_vm_restarted_elsewhere_is_not_recovered_again_from_a_record_its_dead_host_republished(
        store, tmp_path):
    """A hung peer, thawed, can publish its stale copy's record once more
    before it notices that its lease is gone.  That VM was disowned there by
    the recovery that restarted it elsewhere: the recoverer does not pick it
    again, and ``ha_lock`` refuses it, taking no lock.  An HA VM of the same
    dead host that was not restarted yet is still recovered."""
    from engine.hypervisor.ha.recoverer import ha_vms
    moved, waiting = "3b0e7c1a-5d2f-4e8b-9c6a-1f2e3d4c5b6a", "8d9c0b1a-2e3f-4a5b-8c7d-6e5f4a3b2c1d"
    for uuid, name in ((moved, "moved"), (waiting, "waiting")):
        store.put(keys.vm("h1", uuid), {"host": "h1", "name": name, "uuid": uuid,
                                        "state": "shutoff", "ha": "restart"})
    store.put(keys.disowned("h1", moved), {"uuid": moved, "host": "h1", "keep": True,
                                           "automation": "recover-1",
                                           "reason": "restarted on h2"})
    assert [vm["name"] for vm in ha_vms(store, "h1")] == ["waiting"]

    host = new_host(tmp_path / "state", store)
    refused = call(host, "ha_lock", uuid=moved, host="h1", owner="recover-2", name="moved")
    assert refused == {"uuid": moved, "locked": False,
                       "why": "disowned on h1: it runs elsewhere already"}
    assert store.get(keys.lock(f"vm/{moved}")) is None
    assert call(host, "ha_lock", uuid=waiting, host="h1", owner="recover-2")["locked"]
