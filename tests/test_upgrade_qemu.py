"""The QEMU tier's rolling upgrade: a guest with ``--ha restart`` on a KVM
host whose peer is handed over to another release keeps running, never
fenced by the host's guard nor restarted: its uptime only grows, it booted
once, and its host's lease is the one it had."""
from __future__ import annotations

import pytest

from engine.core import keys
from engine.hypervisor.ha.guard import fenced
from tests.support.kvm import kvm  # noqa: F401  (a fixture)
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)
from tests.support.releases import build_release

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`


def uptime(kvm, uuid) -> float:
    printed = kvm.shell("host1", uuid, "cat /proc/uptime")
    return float(next(line.split()[0] for line in printed.splitlines()
                      if line.strip() and line.split()[0].replace(".", "", 1).isdigit()))


def test_an_ha_guest_keeps_running_through_its_hosts_upgrade(kvm, tmp_path):  # noqa: F811
    vm = kvm.boot("steady", "--ha", "restart")
    lease = kvm.store.get(keys.host("host1")).lease
    before = uptime(kvm, vm["uuid"])
    kvm.cluster.cli_json("code", "add", build_release(str(tmp_path), "0.2.0"))

    done = kvm.cluster.cli_json("upgrade", "--to", "0.2.0", "host1", "--yes", timeout=300)
    (row,) = done["hosts"]
    assert done["state"] == "done" and row["state"] == "upgraded", done
    assert 0 <= row["out_of_service_s"] < 4, row     # within the TTL less the guard's lead

    record = kvm.store.get(keys.host("host1"))
    assert record.value["release"] == "0.2.0" and record.value["guarded"] is True, record.value
    assert record.lease == lease, "the host's lease changed: it looked dead"
    after = uptime(kvm, vm["uuid"])
    assert after > before, f"the guest's uptime went from {before} to {after}: it restarted"
    assert kvm.boots_seen("host1", vm["uuid"]) == 1, "the guest booted again"
    assert kvm.where(vm["uuid"]) == {"host1": "running"}
    assert fenced(kvm.state["host1"]) == [], "the guard fenced a VM"
    assert kvm.store.get(keys.recovery("host1")) is None, "an HA recovery started"
