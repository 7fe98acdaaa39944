"""A guest whose QEMU dies under a live host (an OOM kill, a QEMU crash):
an HA guest is started again in place and boots; any other is listed
``shutoff``, ``crashed``, and left alone (QEMU/KVM tier).

The guest's QEMU process, which this test's private libvirtd started, is
found by the guest's uuid on its command line and SIGKILLed by PID.
"""
from __future__ import annotations

import os
import signal

import pytest

from tests.support import qemu_guest, wait_for, wait_until
from tests.support.kvm import BOOT_TIMEOUT, kvm  # noqa: F401  (a fixture)
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`


def qemu_pid(uuid: str) -> int | None:
    """The PID of the QEMU process running the guest ``uuid``, if any."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().split(b"\0")
        except OSError:
            continue
        if command and b"qemu-system" in command[0] and uuid.encode() in command:
            return int(entry)
    return None


def listed(kvm, name):
    [vm] = [v for v in kvm.cluster.cli_json("vmlist") if v["name"] == name]
    return vm


def test_an_ha_guest_whose_qemu_died_is_started_again_in_place(kvm):  # noqa: F811
    vm = kvm.boot("web1", "--ha", "restart")
    uuid = vm["uuid"]
    killed = qemu_pid(uuid)
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: qemu_pid(uuid) not in (None, killed), timeout=60, interval=0.2,
             what="a new QEMU process for the guest")
    # The console log starts anew with each start of the domain: this is the new boot.
    assert qemu_guest.wait_for_console(kvm.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT), "the restarted guest did not boot"
    assert kvm.where(uuid) == {"host1": "running"}
    wait_until(lambda: listed(kvm, "web1"),
               lambda v: v["state"] == "running" and v["restarts"] == 1 and not v["crashed"],
               timeout=30, what="web1 listed running, restarted once")
    assert listed(kvm, "web1")["host"] == "host1"
    kvm.assert_on(uuid, "host1")


def test_a_guest_without_ha_whose_qemu_died_is_listed_crashed_and_left(kvm):  # noqa: F811
    vm = kvm.boot("db1")
    uuid = vm["uuid"]
    killed = qemu_pid(uuid)
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: listed(kvm, "db1"),
               lambda v: (v["state"], v["crashed"]) == ("shutoff", True),
               timeout=30, what="db1 listed shutoff, crashed")
    assert kvm.where(uuid) == {"host1": "shutoff"}
    assert kvm.store.range("restart/")[0] == []
    table = kvm.cluster.cli("vmlist", "-o", "name,state,crashed")
    assert "yes" in table.stdout, table.stdout
    kvm.assert_on(uuid, "host1", "shutoff")
    # An operator's start brings it back; it is no longer crashed.
    started = kvm.cluster.cli_json("start", "db1")
    assert started["vms"][0]["state"] == "running", started
    wait_for(lambda: not listed(kvm, "db1")["crashed"], timeout=30, what="db1 not crashed")
    assert qemu_pid(uuid) not in (None, killed)
    assert qemu_guest.wait_for_console(kvm.console("host1", uuid), qemu_guest.READY_MARKER,
                                       BOOT_TIMEOUT)
