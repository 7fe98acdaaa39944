"""``host remove NAME`` (issue 51, item 5) on a real etcd and real peers on
libvirt's test driver: a stopped host goes from every listing; a host with
VMs is refused unless ``--evacuate`` moves them first; a dry run writes
nothing; a backup stored there is kept, marked lost; a live peer is fenced
(it exits 2 and never registers again); a removal killed half-way is
finished by running it again; on a TLS etcd, the host's etcd user goes."""
from __future__ import annotations

import json
import sys

import pytest

from engine.core import api, keys, removed
from engine.core.failpoints import arm, fired
from engine.core.values import readable
from engine.placement import open_placement
from tests.support import PEERCTL, wait_for
from tests.support.cluster import boot_vms, finished, listed_vms, ready_hosts, refused
from tests.support.terminal import Terminal


def _hosts(cluster) -> set[str]:
    return {h["host"] for h in cluster.cli_json("hostlist")}


def _providers(cluster) -> set[str]:
    return {p["name"] for p in cluster.cli_json("placement", "providers")}


def _stop(cluster, host) -> None:
    """Stop ``host``'s peer as systemctl would, and wait until it is down."""
    cluster.peers[host].terminate()
    assert cluster.peers[host].wait(30) == 0
    wait_for(lambda: host not in api.live_hosts(cluster.store), what=f"{host} down")


def _left_with(store, host) -> list[str]:
    """Every key still named after ``host`` (its tombstone aside)."""
    prefixes = [keys.host(host), keys.host_config(host), keys.drained(host),
                keys.vm(host), keys.member(host), keys.inbox(host), keys.disowned(host)]
    return [kv.key for prefix in prefixes for kv in store.range(prefix, keys_only=True)[0]
            if kv.key == prefix or prefix.endswith("/")]


def _gone_everywhere(cluster, store, host) -> None:
    assert host not in _hosts(cluster)
    assert host not in _providers(cluster)
    assert all(vm["host"] != host for vm in cluster.cli_json("vmlist"))
    verify = cluster.cli("cluster", "verify")
    assert host not in verify.stdout + verify.stderr, verify
    assert _left_with(store, host) == []


def _peer_refused_at_start(cluster, host) -> None:
    """A peer of a removed host started again exits 2 with one line."""
    process = cluster.start_peer(host)
    assert process.wait(60) == 2
    assert f"host {host} was removed from the cluster" in cluster.log(host)
    assert host not in api.live_hosts(cluster.store)


def test_a_stopped_host_with_no_vms_is_removed_from_every_listing(cluster, store):
    ready_hosts(cluster, store, ["host1", "host2"])
    _stop(cluster, "host2")
    refused(cluster, ["host", "remove", "nosuch", "--yes"], 1, "no host 'nosuch'")
    # no terminal to ask on, no --yes: the list, exit 2, nothing written
    asked = refused(cluster, ["host", "remove", "host2"], 2, "add --yes")
    assert "hostcfg/host2" in asked.stderr
    assert store.get(keys.removed("host2")) is None and "host2" in _providers(cluster)
    # on a terminal: the list, the question; anything but yes changes nothing
    terminal = Terminal([sys.executable, PEERCTL, "host", "remove", "host2"], cluster.env)
    terminal.wait_for_text(r"Remove host host2 from the cluster for good\? \[y/N\]")
    assert "would remove hostcfg/host2" in terminal.text()
    terminal.type(b"n\n")
    assert terminal.finish() == 1 and "peerctl: nothing done" in terminal.text()
    assert store.get(keys.removed("host2")) is None and store.get(keys.drained("host2")) is None

    doc = cluster.cli_json("host", "remove", "host2", "--yes")
    assert (doc["host"], doc["state"], doc["automation"], doc["moved"], doc["kept"]) == \
        ("host2", "done", None, [], [])
    assert {"hostcfg/host2", "drained/host2"} <= set(doc["removed"])
    assert any(r.startswith("placement/provider/host2 ") for r in doc["removed"])
    _gone_everywhere(cluster, store, "host2")
    assert "host1" in _hosts(cluster)

    again = cluster.cli_json("host", "remove", "host2", "--yes")
    assert (again["state"], again["removed"]) == ("done", [])
    _peer_refused_at_start(cluster, "host2")


def test_a_host_with_vms_is_refused_and_evacuate_moves_them_then_removes_it(cluster, store):
    ready_hosts(cluster, store, ["host1", "host2"])
    booted = boot_vms(cluster, "web1", "web2", on="host2")
    refused(cluster, ["host", "remove", "host2", "--yes"], 1,
            "host host2 has 2 VMs (web1, web2): move them first, or remove it with --evacuate")
    assert store.get(keys.removed("host2")) is None and store.get(keys.drained("host2")) is None

    # a dry run lists what would move, be removed and be kept; writes nothing
    before = {kv.key: kv.mod_revision for kv in store.range("")[0]
              if not kv.key.startswith((keys.host(), "placement/"))}
    dry = cluster.cli_json("host", "remove", "host2", "--evacuate", "--dry-run")
    assert dry["state"] == "dry-run" and dry["automation"] is None
    assert {(m["name"], m["from"], m["host"]) for m in dry["moved"]} == \
        {("web1", "host2", "host1"), ("web2", "host2", "host1")}
    assert "hostcfg/host2" in dry["removed"]
    after = {kv.key: kv.mod_revision for kv in store.range("")[0]
             if not kv.key.startswith((keys.host(), "placement/"))}
    assert after == before
    assert "host2" in api.live_hosts(store) and "host2" in _providers(cluster)

    doc = cluster.cli_json("host", "remove", "host2", "--evacuate", "--yes")
    assert doc["state"] == "done" and doc["automation"]
    assert {(m["name"], m["host"]) for m in doc["moved"]} == {("web1", "host1"),
                                                              ("web2", "host1")}
    listed = listed_vms(cluster)
    assert {listed[n]["host"] for n in booted} == {"host1"}
    # the live peer was fenced: it stopped by itself, exit 2, one line
    assert cluster.peers["host2"].wait(30) == 2
    assert "host host2 was removed from the cluster" in cluster.log("host2")
    _gone_everywhere(cluster, store, "host2")


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_a_live_peer_is_fenced_and_never_registers_again(cluster, store):
    ready_hosts(cluster, store, ["host1", "host2"])
    # a host lease to come names it: refused until the lease goes
    cluster.cli_json("lease", "create", "maint", "--hosts", "1", "--on", "host2",
                     "--start", "+1h", "--end", "+2h")
    refused(cluster, ["host", "remove", "host2", "--yes"], 1,
            "host host2 is in host lease maint (pending or active): delete the lease first")
    assert store.get(keys.removed("host2")) is None
    cluster.cli_json("lease", "delete", "maint", "--yes")
    doc = cluster.cli_json("host", "remove", "host2", "--yes")
    assert doc["state"] == "done"
    assert cluster.peers["host2"].wait(30) == 2
    tombstone = readable(store.get(keys.removed("host2")))
    assert tombstone["state"] == "removed" and tombstone["by"]
    _gone_everywhere(cluster, store, "host2")
    _peer_refused_at_start(cluster, "host2")
    assert "host1" in api.live_hosts(store)
    # added again (host add clears the tombstone): it serves as a new host
    assert removed.clear(store, "host2") is True
    assert removed.clear(store, "host2") is False
    cluster.start_peer("host2")
    wait_for(lambda: "host2" in _providers(cluster) and "host2" in _hosts(cluster),
             what="host2 back")


def test_a_backup_stored_on_the_removed_host_is_kept_and_listed_as_lost(cluster, store):
    ready_hosts(cluster, store, ["host1", "host2"])
    (vm,) = cluster.cli_json("boot", "db1", "--on", "host1", "--network", "none",
                             "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")["vms"]
    task = finished(store, api.start_automation(store, "backup", {
        "vms": [{"name": "db1", "uuid": vm["uuid"], "host": "host1", "state": "running"}]}))
    assert task["state"] == "done", task
    (row,) = task["result"]["vms"]
    assert row["target"] == "host2", row
    _stop(cluster, "host2")

    dry = cluster.cli_json("host", "remove", "host2", "--dry-run")
    lost = {"kind": "backup", "id": row["backup"], "vm": "db1", "uuid": vm["uuid"],
            "state": "lost"}
    assert [{k: r[k] for k in lost} for r in dry["kept"]] == [lost]
    text = cluster.cli("host", "remove", "host2", "--yes")
    assert text.returncode == 0, text.stderr
    assert f"kept backup {row['backup']} of db1: lost" in text.stdout
    record = readable(store.get(keys.backup(row["backup"])))
    assert record["lost"]["host"] == "host2"
    (listed,) = cluster.cli_json("backup", "list")
    assert (listed["id"], listed["lost"]["host"]) == (row["backup"], "host2")
    shown = cluster.cli("backup", "list", "-o", "id,lost", "--no-headers")
    assert shown.stdout.split() == [row["backup"], "with", "host2"]
    assert readable(store.get(keys.removed("host2")))["kept"][0]["id"] == row["backup"]
    _gone_everywhere(cluster, store, "host2")
    # its record goes once an operator says so; no host step (the data is gone)
    dry = cluster.cli_json("backup", "delete", row["backup"], "--dry-run")
    assert (dry["state"], dry["backups"][0]["id"]) == ("dry-run", row["backup"])
    assert store.get(keys.backup(row["backup"])) is not None
    gone = cluster.cli_json("backup", "delete", row["backup"])
    assert (gone["automation"], gone["state"], gone["backups"][0]["state"]) == \
        (None, "done", "deleted")
    assert store.get(keys.backup(row["backup"])) is None


@pytest.mark.slow      # a scenario of several seconds: the third tier
def test_a_replica_kept_on_the_removed_host_is_listed_lost(
        cluster, store, tmp_path):
    from engine.backups import replicas
    from tests.support.ha_hosts import boot, start_hosts
    start_hosts(cluster, store, tmp_path, ["h1", "h2", "h3"])
    uuid = boot(cluster, ["db1"], "h1")["db1"]
    cluster.cli_json("replicate", "db1", "--every", "10s", "--to", "h2")
    wait_for(lambda: ((replicas.read(store, uuid) or {}).get("replica") or {}).get("host")
             == "h2", timeout=60, what="a replica on h2")
    _stop(cluster, "h2")

    doc = cluster.cli_json("host", "remove", "h2", "--yes")
    assert [(r["kind"], r["id"], r["vm"], r["state"]) for r in doc["kept"]] == \
        [("replica", uuid, "db1", "lost")]
    record = replicas.read(store, uuid)
    assert record["lost"]["host"] == "h2" and (record["replica"] or {}).get("host") != "h2"
    _gone_everywhere(cluster, store, "h2")


@pytest.mark.slow      # a scenario of several seconds: the third tier
@pytest.mark.parametrize("point,live", [("host remove fenced", False),
                                        ("host remove fenced", True),
                                        ("host remove provider", False)])
def test_a_removal_killed_half_way_is_finished_by_running_it_again(cluster, store, tmp_path,
                                                                    point, live):
    ready_hosts(cluster, store, ["host1", "host2"])
    if not live:
        _stop(cluster, "host2")
    armed = str(tmp_path / "failpoints")
    arm(armed, [point])
    killed = cluster.cli("host", "remove", "host2", "--yes", env={"PEERCTL_FAILPOINTS": armed})
    assert killed.returncode == -9 and [p for p, *_ in fired(armed)] == [point]
    assert readable(store.get(keys.removed("host2")))["state"] == "removing"
    if live:        # fenced: it leaves by itself, though nobody waits for it
        assert cluster.peers["host2"].wait(30) == 2
    # nothing orphaned: the host is still listed (down) until the rerun ends it
    assert "host2" in _hosts(cluster)
    placement = open_placement("etcd", store)
    assert ("host2" in {p["name"] for p in placement.providers()}) == \
        (point == "host remove fenced")
    verify = cluster.cli("cluster", "verify")
    assert "host host2's removal did not finish: host remove host2 finishes it" in \
        verify.stdout, verify.stdout
    done = cluster.cli_json("host", "remove", "host2", "--yes")
    assert done["state"] == "done"
    assert readable(store.get(keys.removed("host2")))["state"] == "removed"
    _gone_everywhere(cluster, store, "host2")


def test_on_a_tls_etcd_the_hosts_etcd_user_goes_too(tmp_path):
    from tests.support.secured_etcd import SecuredEtcd
    secured = SecuredEtcd(tmp_path, peers=["host1", "host2"])
    try:
        for host in ("host1", "host2"):
            secured.cluster.start_peer(host, env=secured.env(f"peer-{host}"))
        root = secured.root
        wait_for(lambda: {"host1", "host2"} <= set(api.live_hosts(root)), timeout=30,
                 what="both peers serving")
        secured.cluster.peers["host2"].terminate()
        assert secured.cluster.peers["host2"].wait(30) == 0
        wait_for(lambda: "host2" not in api.live_hosts(root), what="host2 down")

        # an operator cannot delete an etcd user: refused, nothing written
        denied = secured.cli("operator", "host", "remove", "host2", "--yes")
        assert denied.returncode == 4 and "needs etcd's root" in denied.stderr, denied.stderr
        assert root.get(keys.removed("host2")) is None

        done = secured.cli("root", "--format", "json", "host", "remove", "host2", "--yes")
        assert done.returncode == 0, done.stderr
        assert "etcd user peer-host2" in json.loads(done.stdout)["removed"]
        assert root.auth_user_delete("peer-host2", dry_run=True) is False
        assert root.auth_user_delete("peer-host1", dry_run=True) is True
        # its certificate names no user now: it opens nothing
        from engine.errors import PermissionDenied
        former = secured.store("peer-host2")
        with pytest.raises(PermissionDenied):
            former.get(keys.host_config("host1"))
        former.close()
        restarted = secured.cluster.start_peer("host2", env=secured.env("peer-host2"))
        assert restarted.wait(60) != 0
        assert "host2" not in {h["host"] for h in json.loads(
            secured.cli("root", "--format", "json", "hostlist").stdout)}
    finally:
        secured.close()


def test_over_http_a_host_is_removed_as_the_command_line_removes_it(cluster, store):
    from tests.support.api_client import ApiClient, answers, api_peer_args, free_port
    port = free_port()
    cluster.start_peer("host1", extra_args=api_peer_args(port))
    ready_hosts(cluster, store, ["host2"])
    wait_for(lambda: {"host1", "host2"} <= _providers(cluster), what="providers")
    secret = cluster.cli_json("token", "create", "--role", "operator")["secret"]
    client = ApiClient(f"http://127.0.0.1:{port}", secret)
    wait_for(lambda: answers(client), what="the API of host1")
    boot_vms(cluster, "web1", on="host2")

    status, doc, _ = client.post("/v1/hosts/host2/remove", {"yes": True})
    assert status == 409 and "has 1 VM (web1)" in doc["error"], doc
    status, doc, _ = client.post("/v1/hosts/host2/evacuate", {"yes": True})
    assert status == 202, doc
    assert finished(store, doc["automation"])["state"] == "done"
    status, dry, _ = client.post("/v1/hosts/host2/remove", {"dry_run": True})
    assert status == 200 and dry["state"] == "dry-run" and "hostcfg/host2" in dry["removed"]
    status, doc, _ = client.post("/v1/hosts/host2/remove", {})
    assert status == 409 and "send" in doc["error"], doc
    assert store.get(keys.removed("host2")) is None
    status, doc, _ = client.post("/v1/hosts/host2/remove", {"yes": True})
    assert status == 200 and doc["state"] == "done", doc
    assert cluster.peers["host2"].wait(30) == 2
    _gone_everywhere(cluster, store, "host2")
    status, doc, _ = client.post("/v1/hosts/nosuch/remove", {"yes": True})
    assert status == 404, doc
