"""Refusals name their cause (issue 27): a boot no host can take says which
resource ran short, or which hosts are drained, reserved by a lease or
down; an ``https://`` endpoint at a plain etcd says it does not speak TLS;
a listing of a cluster no host ever joined warns of a mistyped --cluster.

The words of a refused claim first, from provider documents alone (no
etcd), then through the real command line on real peers (libvirt's test
driver) and a real etcd."""
from __future__ import annotations

import json
import re
import uuid

import pytest

from engine.placement.query import parse_query
from engine.placement.shortfall import explain
from tests.support import wait_until
from tests.support.cluster import start_peers

SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"


# -- the words, from provider documents ----------------------------------------------

def provider(name, totals, used=None, traits=()):
    return {"uuid": f"rp-{name}", "root": f"rp-{name}", "name": name, "parent": None,
            "inventories": {rc: {"total": n, "reserved": 0, "min_unit": 1, "max_unit": n,
                                 "step_size": 1, "allocation_ratio": 1.0}
                            for rc, n in totals.items()},
            "usages": dict(used or {}), "traits": list(traits), "aggregates": []}


def test_a_query_too_big_for_any_host_names_the_short_class_and_the_most_free():
    hosts = [provider("host1", {"VCPU": 4, "MEMORY_MB": 4096}, {"VCPU": 1}),
             provider("host2", {"VCPU": 2, "MEMORY_MB": 4096})]
    assert explain(hosts, parse_query("VCPU:64,MEMORY_MB:256")) == \
        "short of VCPU (most free on one host: 3 of 64)"


def test_drained_and_reserved_hosts_are_named_and_count_for_nothing():
    hosts = [provider("host1", {"VCPU": 4}, traits=["COMPUTE_STATUS_DISABLED"]),
             provider("host2", {"VCPU": 64}, traits=["CUSTOM_RESERVED"]),
             provider("host3", {"VCPU": 2})]
    said = explain(hosts, parse_query("VCPU:8", "!CUSTOM_RESERVED"),
                   held_by={"host2": "reserved by lease maint"}, down={"host3"})
    assert said == ("short of VCPU (most free on one host: 2 of 8) "
                    "(host1 drained, host2 reserved by lease maint, host3 down)")
    assert explain(hosts[:1], parse_query("VCPU:1")) == "no host takes new VMs (host1 drained)"


def test_missing_traits_tried_hosts_and_no_match_each_say_so():
    hosts = [provider("host1", {"VCPU": 4}), provider("host2", {"VCPU": 4})]
    assert explain(hosts, parse_query("VCPU:1", "CUSTOM_GPU")) == "no host has CUSTOM_GPU"
    assert explain(hosts, parse_query("VCPU:1"), skip={"host1": "tried", "host2": "tried"}) \
        == "no host is left to try (host1 tried, host2 tried)"
    assert explain(hosts, parse_query("VCPU:1"), pattern="web*") == "no host matches"


def test_a_long_list_of_hosts_is_cut():
    hosts = [provider(f"host{i}", {"VCPU": 4}, traits=["COMPUTE_STATUS_DISABLED"])
             for i in range(1, 11)]
    said = explain(hosts, parse_query("VCPU:1"))
    assert said.startswith("no host takes new VMs (host1 drained, host2 drained, ")
    assert said.endswith("host6 drained and 4 more)")


# -- boots through the command line ----------------------------------------------------



def refused_boot(cluster, name, resources=SPEC) -> str:
    """Boot ``name``, which must fail; the VM's error, also the last line said."""
    done = cluster.cli("--format", "json", "boot", name, "--resources", resources)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    (vm,) = json.loads(done.stdout)["vms"]
    assert vm["state"] == "error" and vm["host"] is None, vm
    assert vm["error"] in done.stderr.splitlines()[-1]
    return vm["error"]


def test_a_boot_no_host_fits_names_the_short_resource(cluster, two_hosts):
    said = refused_boot(cluster, "huge", "VCPU:4096,MEMORY_MB:64")
    # (the command line asks for the default network too, said in words)
    assert re.fullmatch(r"no host can fit VCPU:4096,MEMORY_MB:64 with network default: "
                        r"short of VCPU \(most free on one host: \d+ of 4096\)", said), said


def test_a_boot_when_every_host_is_drained_or_leased_says_so(cluster, store, two_hosts):
    assert cluster.cli_json("drain", "host*", "--yes")["hosts"] == [
        {"host": "host1", "drained": True}, {"host": "host2", "drained": True}]
    said = refused_boot(cluster, "nowhere")
    assert said == f"no host can fit {SPEC} with network default: no host takes new VMs " \
                   "(host1 drained, host2 drained)", said

    cluster.cli_json("undrain", "host1")
    cluster.cli_json("lease", "create", "maint", "--hosts", "1", "--on", "host1",
                     "--start", "now", "--end", "+1h")
    wait_until(lambda: cluster.cli_json("lease", "show", "maint"),
               lambda doc: doc["state"] == "active", timeout=40, what="lease maint active")
    said = refused_boot(cluster, "still-nowhere")
    assert said == f"no host can fit {SPEC} with network default: no host takes new VMs " \
                   "(host1 reserved by lease maint, host2 drained)", said


# -- the endpoint and the cluster name ---------------------------------------------------

def test_https_at_a_plain_etcd_says_it_does_not_speak_tls(cluster, etcd):
    https = etcd.url.replace("http://", "https://")
    done = cluster.cli("--etcd", https, "vmlist", input="")
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert lines == [f"peerctl: etcd at {https} does not speak TLS "
                     f"(a plain etcd is reached as {etcd.url})"], done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("command", ["hostlist", "hoststats"])
def test_a_listing_of_a_cluster_no_host_ever_joined_warns_of_a_mistyped_name(
        cluster, etcd, command):
    name = "typo" + uuid.uuid4().hex[:8]
    for args in ([command], ["--format", "json", command]):
        done = cluster.cli("--cluster", name, *args)
        assert done.returncode == 0, done.stderr
        assert done.stderr.splitlines() == [
            f"peerctl: warning: no host has ever joined cluster {name!r} at {etcd.url} "
            "(a mistyped --cluster?)"]
    assert "0 hosts responded" in cluster.cli("--cluster", name, command).stdout


def test_a_cluster_with_hosts_or_a_pattern_gets_no_such_warning(cluster, store):
    start_peers(cluster, store, ["host1"])
    done = cluster.cli("hostlist")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    done = cluster.cli("--cluster", "typo" + uuid.uuid4().hex[:8], "hostlist", "web*")
    assert "ever joined" not in done.stderr, done.stderr
