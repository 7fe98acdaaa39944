"""HA restart of a real guest between two KVM hosts (QEMU/KVM tier).

host1 and host2 run on the two private libvirtd of ``libvirtd_pair``;
members m1 and m2 (test driver, drained: they lead automations but take no
VM) make sure the recovery outlives its initiator, which a failpoint
SIGKILLs once per scenario.  The guest boots from a disk image; when its
host's peer is taken away (SIGKILL, a partition, a hang) its guard powers
it off before the lease can expire, host2 starts it again from its image,
and host1's peer, back, keeps the stale disk aside.  At the end exactly one
copy runs.
"""
from __future__ import annotations

import signal
import time

import pytest

from engine.core import api, failpoints, keys
from tests.support import qemu_guest, wait_for
from tests.support.cluster import finished
from tests.support.kvm import BOOT_TIMEOUT
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)
from tests.support.ha_kvm import ha_kvm, start_member  # noqa: F401  (ha_kvm: a fixture)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

def restart_the_killed(kvm, store):
    """Start again whichever of host2, m1, m2 the failpoint SIGKILLed.

    The failpoint notes itself before the kill lands, so the process is
    found by the pid it noted and waited for: polling it could still find
    it running, and its lease outlives it for a TTL."""
    (point, pid, _), = failpoints.fired(str(kvm.armed))
    (name, process), = [(n, p) for n, p in kvm.cluster.peers.items() if p.pid == pid]
    assert name in ("host2", "m1", "m2"), (point, name)
    assert process.wait(30) == -signal.SIGKILL, (name, process.returncode)
    if name == "host2":
        kvm.start_peer(name)
    else:
        start_member(kvm, name)
    restarted = kvm.cluster.peers[name].pid
    wait_for(lambda: api.live_hosts(store).get(name, {}).get("pid") == restarted, timeout=30,
             what=f"{name} back under its new pid")


def recovery_story(kvm, store) -> str:
    """What a failed wait needs to be understood: host1's recovery, its
    task and steps, and the peers' warnings."""
    record = store.get(keys.recovery("host1"))
    lines = [f"recovery/host1: {record.value if record else None}"]
    if record is not None:
        task = api.get_task(store, record.value["automation"])
        lines.append(f"task: {task['state']} {task.get('error')}")
        lines += [f"  {step}" for step in task["log"][-30:]]
    for host, process in kvm.cluster.peers.items():
        noted = [line for line in kvm.cluster.log(host).splitlines()
                 if "[warning" in line or "[error" in line][-15:]
        lines += [f"{host} (exit {process.poll()}):", *[f"  {line}" for line in noted]]
    return "\n".join(lines)


def ha_scenario(kvm, store, name, take_away, bring_back):
    vm = kvm.boot(name, "--ha", "restart")
    uuid = vm["uuid"]
    failpoints.arm(str(kvm.armed), ["append claim_move"])
    take_away()
    fenced = expired = None
    deadline = time.monotonic() + 60
    while (fenced is None or expired is None) and time.monotonic() < deadline:
        # The lease first: a guest seen stopped in the same look counts as late.
        if expired is None and "host1" not in api.live_hosts(store):
            expired = time.monotonic()
        if fenced is None and kvm.where(uuid).get("host1") != "running":
            fenced = time.monotonic()
        time.sleep(0.02)
    assert fenced is not None and expired is not None, (fenced, expired)
    assert fenced < expired, f"the guest ran {fenced - expired:.2f} s past host1's lease"
    wait_for(lambda: kvm.where(uuid)["host1"] == "shutoff", timeout=20,
             what="the guest powered off, still defined")

    wait_for(lambda: failpoints.fired(str(kvm.armed)), timeout=60,
             what="the recovery's initiator to reach its failpoint")
    restart_the_killed(kvm, store)
    try:
        wait_for(lambda: kvm.where(uuid).get("host2") == "running", timeout=120, interval=0.5,
                 what="the guest running on host2")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{recovery_story(kvm, store)}") from None
    assert qemu_guest.wait_for_console(kvm.console("host2", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT), "the restarted guest did not boot"
    listed = [v for v in kvm.cluster.cli_json("vmlist") if v["name"] == name]
    assert [(v["host"], v["state"], (v["recovered"] or {}).get("from")) for v in listed] == \
        [("host2", "running", "host1")]

    bring_back()
    wait_for(lambda: "host1" in api.live_hosts(store), timeout=60, what="host1 back")
    wait_for(lambda: kvm.where(uuid) == {"host2": "running"}, timeout=60, interval=0.5,
             what="host1's stale copy undefined, one copy left")
    asides = kvm.cluster.cli_json("aside", "list", "host1")
    assert [(a["name"], a["uuid"]) for a in asides] == [(name, uuid)], asides
    assert asides[0]["volumes"] and asides[0]["bytes"] > 0
    assert kvm.volumes(uuid) == {"host2": kvm.volumes(uuid)["host2"]}
    task = finished(store, store.get(keys.recovery("host1")).value["automation"])
    assert any(r["state"] == "restarted" for r in task["result"]["vms"]), task
    assert kvm.cluster.cli_json("aside", "delete", "host1/*", "--yes")["state"] == "done"
    assert kvm.cluster.cli_json("aside", "list") == []
    kvm.cluster.cli_json("destroy", name, "--yes", timeout=120)


def test_sigkill_of_the_peer_fences_the_guest_and_it_restarts_on_host2(ha_kvm, store):
    ha_scenario(ha_kvm, store, "hakill", lambda: ha_kvm.cluster.kill("host1"),
                lambda: ha_kvm.start_peer("host1"))


def test_a_partitioned_peer_fences_itself_before_its_lease_expires(ha_kvm, store):
    ha_scenario(ha_kvm, store, "hapart", ha_kvm.proxy.cut, ha_kvm.proxy.heal)


def test_a_hung_peer_is_fenced_by_its_guard(ha_kvm, store):
    ha_scenario(ha_kvm, store, "hahang",
                lambda: ha_kvm.cluster.kill("host1", signal.SIGSTOP),
                lambda: ha_kvm.cluster.kill("host1", signal.SIGCONT))
