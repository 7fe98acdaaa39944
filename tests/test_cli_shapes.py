"""One behaviour for each shared shape of the command line (docs/cli.md,
issue 27), through the real command line on real peers: a pattern matching
nothing exits 1 naming it and still prints what matched; destructive work on
several things asks (no terminal here: refused, exit 2, nothing written);
--dry-run writes nothing; times are ISO 8601 UTC."""
from __future__ import annotations

import re

from tests.support import wait_until
from tests.support.cluster import refused

SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")






def boot(cluster, *names, extra=()):
    doc = cluster.cli_json("boot", *names, "--resources", SPEC, *extra)
    assert doc["state"] == "done", doc
    return doc


def test_a_pattern_matching_nothing_exits_1_and_still_prints_what_matched(cluster, two_hosts):
    boot(cluster, "web1")
    done = cluster.cli("vmlist", "web1", "nomatch")
    assert done.returncode == 1
    assert done.stdout.splitlines()[1].split()[1] == "web1"     # under the header
    assert done.stderr == "peerctl: no VM matches 'nomatch'\n"
    rows = cluster.cli_json("vmlist", "web1", "nomatch", expect_rc=1)
    assert [row["name"] for row in rows] == ["web1"]
    refused(cluster, ["lease", "list", "zz*"], 1, "no lease matches 'zz*'")
    refused(cluster, ["aside", "list", "hostZ*"], 1, "matches 'hostZ*'")
    assert cluster.cli_json("lease", "list", "zz*", expect_rc=1) == []


def test_draining_several_hosts_asks_and_a_dry_run_drains_nothing(cluster, two_hosts):
    refused(cluster, ["drain", "host*"], 2, "add --yes")
    dry = cluster.cli_json("drain", "host*", "--dry-run")
    assert dry["state"] == "dry-run"
    assert not any(h["drained"] for h in cluster.cli_json("hostlist"))
    assert cluster.cli_json("drain", "host1") == {"hosts": [{"host": "host1", "drained": True}]}


def test_evacuate_dry_run_lists_the_vms_and_drains_nothing(cluster, two_hosts):
    boot(cluster, "a1", "a2", extra=["--on", "host1"])
    before = {t["id"] for t in cluster.cli_json("tasks", "--all")}
    doc = cluster.cli_json("evacuate", "host1", "--dry-run")
    assert doc["state"] == "dry-run" and doc["automation"] is None
    assert sorted(vm["name"] for vm in doc["vms"]) == ["a1", "a2"]
    assert not any(h["drained"] for h in cluster.cli_json("hostlist"))
    assert {t["id"] for t in cluster.cli_json("tasks", "--all")} == before
    text = cluster.cli("evacuate", "host1", "--dry-run").stdout
    assert text.splitlines()[-1] == ("evacuate would move 2 VMs to any other host, "
                                     "after draining host1")


def test_deleting_a_lease_that_destroys_vms_asks_first(cluster, two_hosts):
    cluster.cli_json("lease", "create", "cap", "--start", "now", "--end", "+1h",
                     "--resources", SPEC, "--amount", "2")
    wait_until(lambda: cluster.cli_json("lease", "show", "cap"),
               lambda doc: doc["state"] == "active", what="lease cap active")
    boot(cluster, "in1", extra=["--reservation", "cap"])
    dry = cluster.cli_json("lease", "delete", "cap", "--dry-run")
    assert (dry["state"], dry["on_end"], dry["destroys"]) == ("dry-run", "destroy", True)
    assert [vm["name"] for vm in dry["vms"]] == ["in1"]
    done = refused(cluster, ["lease", "delete", "cap"], 2, "add --yes")
    assert "in1" in done.stderr
    assert cluster.cli_json("lease", "show", "cap")["state"] == "active"
    assert "in1" in {vm["name"] for vm in cluster.cli_json("vmlist")}
    assert cluster.cli_json("lease", "delete", "cap", "--yes")["state"] == "deleted"
    wait_until(lambda: cluster.cli_json("vmlist"),
               lambda rows: "in1" not in {vm["name"] for vm in rows}, what="in1 destroyed")


def test_times_are_iso_utc_and_a_dashed_time_is_a_value(cluster, two_hosts):
    boot(cluster, "t1")
    [task] = [t for t in cluster.cli_json("tasks", "--all") if t["kind"] == "boot"]
    assert ISO.match(task["created"]), task
    shown = cluster.cli_json("task", task["id"])
    assert ISO.match(shown["created"]) and all(ISO.match(e["time"]) for e in shown["log"])
    done = cluster.cli("lease", "create", "old", "--start", "-1h", "--end", "+1h",
                       "--hosts", "1")
    assert done.returncode == 2 and "expected one argument" not in done.stderr
    assert "-1h" in done.stderr, done.stderr


def test_boot_on_hosts_that_take_no_vms_is_refused_before_any_automation(cluster, two_hosts):
    before = {t["id"] for t in cluster.cli_json("tasks", "--all")}
    refused(cluster, ["boot", "x1", "--resources", SPEC, "--on", "nohost*"], 1,
            "no host matches --on 'nohost*'")
    cluster.cli_json("drain", "host2")
    refused(cluster, ["boot", "x1", "--resources", SPEC, "--on", "host2"], 1,
            "no host among --on 'host2' takes new VMs: host2 drained")
    assert {t["id"] for t in cluster.cli_json("tasks", "--all")} == before


def test_wait_ip_does_not_wait_for_a_vm_without_a_network(cluster, two_hosts):
    done = cluster.cli("boot", "n1", "--resources", SPEC, "--network", "none", "--wait-ip",
                       "--ip-timeout", "300", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "waiting up to" not in done.stderr
