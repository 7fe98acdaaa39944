"""A guest people can reach, on two KVM hosts on this machine (QEMU tier).

The ``kvm`` fixture's peers run on two private libvirtd inside a network
namespace of the test's own, sharing the guest network ``default``: a
bridge with libvirt's DHCP server and no forwarding, so no packet leaves
the namespace.  The guest is the tier's busybox Linux; it runs udhcpc on
its virtio NIC, pings its router, reads a NoCloud seed CD-ROM and runs a
shell on its serial console.
"""
from __future__ import annotations

import ipaddress
import json
import os
import select
import signal
import subprocess
import sys
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
import pytest

from engine.core import api, keys
from engine.hypervisor.domain import seed
from engine.hypervisor.local.localnet import DEFAULT_SUBNET
from engine.hypervisor.domain.networks import mac_for
from engine.placement import open_placement
from tests.support import PEERCTL, ROOT, qemu_guest, wait_for, wait_until
from tests.support.kvm import kvm  # noqa: F401  (a fixture)
from tests.support.libvirtd_pair import libvirtd_pair  # noqa: F401  (a fixture)
from tests.support.qemu_guest import guest_dir  # noqa: F401  (a fixture: skips saying why)

pytestmark = pytest.mark.qemu      # the real-QEMU tier: `python -m pytest -q tests -m qemu`

MARKER = "user-data-ran-7f3a"


def a_public_key(path) -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(serialization.Encoding.OpenSSH,
                            serialization.PublicFormat.OpenSSH).decode() + " tester@peerctl"
    path.write_text(line + "\n")
    return line


def listed(kvm, name) -> dict:
    (vm,) = [vm for vm in kvm.cluster.cli_json("vmlist") if vm["name"] == name]
    return vm


def console_says(kvm, name, typed: str, *expect: str, timeout: float = 60.0) -> str:
    """Type ``typed`` into the guest's console through ``console --no-tty``
    and read until every one of ``expect`` shows (or the deadline); then
    leave the console (SIGINT: a session on pipes outlives its stdin)."""
    console = subprocess.Popen(
        [sys.executable, PEERCTL, "console", name, "--no-tty", "--timeout", str(int(timeout))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=kvm.cluster.env, cwd=ROOT)
    seen = bytearray()
    try:
        console.stdin.write(typed.encode())
        console.stdin.close()
        deadline = time.monotonic() + timeout
        fd = console.stdout.fileno()
        while not all(e.encode() in seen for e in expect):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen += chunk
        out = seen.decode(errors="replace")
        if console.poll() is None:
            console.send_signal(signal.SIGINT)
        console.wait(30)
        assert all(e in out for e in expect), \
            (expect, console.returncode, out[-2000:], console.stderr.read().decode()[-2000:])
        return out
    finally:
        if console.poll() is None:
            console.kill()
            console.wait()
        console.stdout.close()
        console.stderr.close()


def test_a_guest_gets_an_address_reads_its_seed_and_keeps_both_across_a_migration(
        kvm, tmp_path):
    key = a_public_key(tmp_path / "key.pub")
    user_data = tmp_path / "user-data"
    user_data.write_text(f"#!/bin/sh\necho {MARKER}\n")

    vm = kvm.boot("reach", "--user-data", str(user_data), "--ssh-key", str(tmp_path / "key.pub"),
                  "--hostname", "reach-me", "--wait-ip", "--ip-timeout", "240")
    subnet = ipaddress.ip_network(DEFAULT_SUBNET)
    assert vm["ip"] and ipaddress.ip_address(vm["ip"]) in subnet, vm

    record = listed(kvm, "reach")
    assert record["ip"] == vm["ip"]
    assert [a["mac"] for a in record["addresses"]] == [mac_for(vm["uuid"], 0)]
    with open(kvm.console("host1", vm["uuid"]), errors="replace") as f:
        boot_log = f.read()
    assert f"PEERCTL-GUEST-IP {vm['ip']}" in boot_log

    # The seed, read back through the console: the guest prints it again.
    console_says(kvm, "reach", "peerctl-seed\n", f"sha256-hex={seed.fingerprint_hex(key)}",
                 f"instance-id={vm['uuid']}", "hostname=reach-me", MARKER)

    # Live to host2: the same MAC, the same address, the seed came along.
    moved = kvm.cluster.cli_json("migrate", "reach", "--to", "host2", "--yes", timeout=300)
    assert moved["state"] == "done" and moved["vms"][0]["mode"] == "live", moved
    seen = []
    try:
        after = wait_until(lambda: seen.append(listed(kvm, "reach")) or seen[-1],
                           lambda r: r["host"] == "host2" and r["ip"], timeout=60, interval=1,
                           what="reach's address on host2")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; vmlist said last: {seen[-1] if seen else None}") from None
    assert after["ip"] == vm["ip"]
    assert [a["mac"] for a in after["addresses"]] == [mac_for(vm["uuid"], 0)]
    assert list(kvm.volumes(vm["uuid"])) == ["host2"]
    assert sorted(kvm.volumes(vm["uuid"])["host2"]) == [f"{vm['uuid']}-seed.iso",
                                                          f"{vm['uuid']}.qcow2"]
    console_says(kvm, "reach", "peerctl-seed\n", f"instance-id={vm['uuid']}", MARKER)

    kvm.cluster.cli_json("destroy", "reach")
    assert kvm.volumes(vm["uuid"]) == {}
    assert not os.path.exists(kvm.console("host2", vm["uuid"]))


def test_a_peer_killed_after_making_the_seed_leaves_no_volume_behind(kvm, tmp_path):
    """host1's peer dies right after the seed volume is made, before the
    domain exists.  The boot (only host1 allowed) ends in error with its
    claim released; host1's peer, back, sweeps the VM's volumes, seed too."""
    failpoints = tmp_path / "failpoints"
    failpoints.write_text("build seeded\n")
    killed = kvm.store.get(keys.host("host1")).lease
    kvm.cluster.kill("host1")
    kvm.cluster.start_peer("host1", libvirt=kvm.uri["host1"],
                           env={"PEERCTL_QEMU_ACCEL": qemu_guest.LINUX_ACCEL,
                                "PEERCTL_FAILPOINTS": str(failpoints)},
                           extra_args=["--state-dir", kvm.state["host1"]])
    # back: alive in a session of its own, not the killed one's until it expires
    wait_for(lambda: "host1" in api.live_hosts(kvm.store)
             and kvm.store.get(keys.host("host1")).lease != killed, timeout=60,
             what="host1 back in a new session")
    done = kvm.cluster.cli("--format", "json", "boot", "crashy", "--on", "host1",
                           "--resources", "VCPU:1,MEMORY_MB:128,DISK_GB:1",
                           "--image", f"file://{kvm.image}", "--hostname", "crashy",
                           timeout=300)
    assert done.returncode == 1, (done.stdout, done.stderr)
    (vm,) = json.loads(done.stdout)["vms"]
    assert vm["state"] == "error" and failpoints.read_text() == "", (vm, done.stderr)
    uuid = vm["uuid"]
    kvm.start_peer("host1")                 # back, without the crash point
    wait_for(lambda: kvm.volumes(uuid) == {}, timeout=60, interval=0.5,
             what=f"the volumes of {uuid} swept (have {kvm.volumes(uuid)})")
    assert kvm.where(uuid) == {}
    placement = open_placement("etcd", kvm.store)
    assert [a for a in placement.all_allocations() if a["consumer"] == uuid
            and a["allocations"]] == []
