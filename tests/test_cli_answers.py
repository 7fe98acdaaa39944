"""What the command line answers where the real run would fail or where a
user needs to know more (issue 48, item 9), through the real command line
on real peers (libvirt's test driver) and a real etcd:

- ``migrate --dry-run`` and ``boot --dry-run`` name each VM's planned host
  or why none, and fail (exit 1) where the real run would, in the user's
  words (``network default``, never the trait ``CUSTOM_NET_DEFAULT``);
- ``start`` of a VM whose host is down, or that its host lost, is refused
  at once, one line saying what to do;
- ``vmlist --all`` counts a foreign domain's memory as placement does;
- a paused guest is listed with libvirt's reason (``paused: user``), and
  ``boot --wait-ip`` says so instead of waiting for an address that cannot
  come.
"""
from __future__ import annotations

import pytest

import subprocess
import sys

from engine.core import api
from tests.support import PEERCTL, ROOT, wait_for
from tests.support.cluster import boot_vms, refused, start_peers, task_ids
from tests.support.vms import reconcile_every

SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
NO_NETWORK = {"PEERCTL_NETWORKS": "none"}


def hosts_one_without_networks(cluster, store) -> None:
    """host1 offers the network ``default``, host2 none."""
    start_peers(cluster, store, ["host1"])
    start_peers(cluster, store, ["host2"], env=NO_NETWORK)
    wait_for(lambda: {"host1", "host2"} <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what="both hosts' providers")


def boot_bare(cluster, name: str, on: str) -> dict:
    """VM ``name`` booted on ``on`` without a network interface: by name."""
    doc = cluster.cli_json("boot", name, "--resources", SPEC, "--on", on, "--network", "none")
    assert doc["state"] == "done", doc
    return {vm["name"]: vm for vm in doc["vms"]}


def test_migrate_dry_run_names_each_destination_or_why_none(cluster, store):
    hosts_one_without_networks(cluster, store)
    booted = boot_vms(cluster, "wired")
    booted.update(boot_bare(cluster, "bare", "host1"))
    before = task_ids(cluster)

    plan = cluster.cli_json("migrate", "wired", "bare", "--dry-run", expect_rc=1)
    assert plan["state"] == "dry-run" and plan["automation"] is None
    rows = {row["name"]: row for row in plan["vms"]}
    assert rows["bare"] == {"name": "bare", "uuid": booted["bare"]["uuid"], "from": "host1",
                            "host": "host2", "state": "running"}
    assert rows["wired"]["host"] is None
    assert rows["wired"]["error"] == "no host can take it: host2 lacks network default"

    done = cluster.cli("migrate", "wired", "bare", "--dry-run", input="")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["Name", "From", "To", "State", "Why", "not"]
    assert lines[-1] == "migrate would move 1 of 2 VMs to any other host"
    assert done.stderr.splitlines() == [
        "peerctl: migrate would fail: wired: no host can take it: host2 lacks network default"]
    # the one that can move: planned, exit 0; the real move goes there
    assert cluster.cli_json("migrate", "bare", "--dry-run")["vms"][0]["host"] == "host2"
    assert task_ids(cluster) == before
    moved = cluster.cli_json("migrate", "bare")
    assert moved["vms"][0]["host"] == "host2", moved


def test_boot_dry_run_of_a_vm_no_host_can_take_fails_as_the_boot_would(cluster, store):
    hosts_one_without_networks(cluster, store)
    before = task_ids(cluster)
    done = cluster.cli("boot", "x1", "--resources", SPEC, "--on", "host2", "--dry-run",
                       input="")
    assert done.returncode == 1, done.stdout
    assert done.stdout.splitlines()[-1] == "boot would place 0 of 1 VM"
    assert done.stderr.splitlines() == [
        "peerctl: boot would fail: x1: no host can take it: host2 lacks network default"]
    assert task_ids(cluster) == before

    # the real boot fails the same way, in the same words
    real = cluster.cli("boot", "x1", "--resources", SPEC, "--on", "host2", input="")
    assert real.returncode == 1
    assert "no host has network default" in real.stderr.splitlines()[-1], real.stderr
    assert "CUSTOM_NET" not in real.stdout + real.stderr


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_start_on_a_down_host_or_of_a_lost_vm_is_refused_at_once(cluster, store):
    hosts_one_without_networks(cluster, store)
    boot_bare(cluster, "db1", "host2")
    cluster.kill("host2")
    wait_for(lambda: "host2" not in api.live_hosts(store), timeout=20, what="host2 dead")
    before = task_ids(cluster)
    refused(cluster, ["start", "db1"], 1,
            "cannot start VM 'db1': it is on host2, which is down: it can be started once "
            "its host is back")
    assert task_ids(cluster) == before
    # every command that needs the host says so in its own words, nothing started
    for command, then in ((["backup", "db1"], "it can be backed up"),
                          (["ha", "db1", "restart"], "its HA policy can change"),
                          (["replicate", "db1", "--every", "1m"], "it can be replicated")):
        refused(cluster, command, 1,
                f"VM 'db1' is on host2, which is down: {then} once its host is back")
    assert task_ids(cluster) == before
    assert cluster.cli_json("start", "db1", expect_rc=1) == {"automation": None,
                                                           "state": "failed", "vms": []}

    # back, without the domain (the test driver lives in the peer's process)
    cluster.start_peer("host2", env=NO_NETWORK)
    wait_for(lambda: cluster.cli_json("vmlist", "db1")[0]["state"] == "missing", timeout=60,
             what="db1 listed missing")
    refused(cluster, ["start", "db1"], 1,
            "cannot start VM 'db1': it is missing: host2 no longer has its domain; destroy "
            "it, or restore it from a backup ('backup list db1', then 'restore ID --as NAME')")
    assert task_ids(cluster) == before


def test_vmlist_all_counts_a_foreign_domains_memory_as_placement_does(cluster, store):
    start_peers(cluster, store, ["host1"])
    host = wait_for(lambda: [h for h in cluster.cli_json("hostlist")
                             if h.get("foreign_vms")], what="host1's foreign domain counted")[0]
    foreign = wait_for(lambda: [vm for vm in cluster.cli_json("vmlist", "--all")
                                if not vm["managed"]], what="the foreign domain listed")
    assert [vm["name"] for vm in foreign] == ["test"]
    assert foreign[0]["memory_mb"] == host["foreign_memory_mb"] == 2048


# -- a paused guest says why -------------------------------------------------------------

def link_local_host(path) -> str:
    """A test-driver host whose network ``default`` hands out link-local
    addresses only: a VM on it never gets an address peerctl lists."""
    path.write_text(
        "<node><cpu><nodes>1</nodes><sockets>1</sockets><cores>8</cores><threads>1</threads>"
        "<active>8</active><mhz>2000</mhz><model>i686</model></cpu>"
        "<memory>8388608</memory>"
        "<network><name>default</name><bridge name='virbr0'/>"
        "<ip address='169.254.10.1' netmask='255.255.0.0'><dhcp>"
        "<range start='169.254.10.2' end='169.254.10.254'/></dhcp></ip></network></node>")
    return f"test://{path}"


def test_a_paused_guest_is_listed_with_its_reason_and_wait_ip_says_so(cluster, store,
                                                                         tmp_path):
    cluster.start_peer("host1", libvirt=link_local_host(tmp_path / "host1.xml"),
                       env=reconcile_every(0.5))
    wait_for(lambda: "host1" in {p["name"] for p in cluster.cli_json("placement", "providers")},
             what="host1's provider")
    booting = subprocess.Popen(
        [sys.executable, PEERCTL, "boot", "w1", "--resources", SPEC, "--wait-ip",
         "--ip-timeout", "60"], env=cluster.env, cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: [vm for vm in cluster.cli_json("vmlist")
                          if vm["name"] == "w1" and vm["state"] == "running"],
                 timeout=30, what="w1 running, waiting for an address")
        assert cluster.cli_json("suspend", "w1")["state"] == "done"
        out, err = booting.communicate(timeout=30)     # well before --ip-timeout
    finally:
        if booting.poll() is None:
            booting.kill()
            booting.wait()
    assert booting.returncode == 1, (out, err)
    assert "w1: paused (user): it will get no address; not waiting for it" in err, err
    assert err.splitlines()[-1] == "peerctl: no address for w1: paused (user)", err

    [vm] = cluster.cli_json("vmlist", "w1")
    assert (vm["state"], vm["state_reason"], vm["qemu_log"]) == ("paused", "user", None)
    table = cluster.cli("vmlist", "w1", "-o", "name,state", "--no-headers")
    assert table.stdout.split() == ["w1", "paused:", "user"]
    assert "(1 paused)" in cluster.cli("vmlist").stdout
    assert cluster.cli_json("resume", "w1")["state"] == "done"
    wait_for(lambda: cluster.cli_json("vmlist", "w1")[0]["state_reason"] is None,
             what="the reason gone once w1 runs")


def test_the_qemu_log_named_is_where_each_kind_of_libvirtd_has_qemu_write_it():
    """What a paused QEMU guest's record points to (no QEMU needed to say where)."""
    from engine.hypervisor.domain.guest_log import qemu_log_path
    assert qemu_log_path("qemu:///system", "web1") == "/var/log/libvirt/qemu/web1.log"
    assert qemu_log_path("qemu+ssh://root@h1/system", "web1") == \
        "/var/log/libvirt/qemu/web1.log"
    private = "qemu+unix:///system?socket=/srv/peerctl/h1/run/libvirt-sock"
    assert qemu_log_path(private, "web1") == "/srv/peerctl/h1/log/qemu/web1.log"
    assert qemu_log_path("qemu:///session", "web1").endswith(
        "/.cache/libvirt/qemu/log/web1.log")
    assert qemu_log_path("test:///default", "web1") is None
