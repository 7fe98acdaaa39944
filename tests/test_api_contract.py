"""The HTTP API answers what the command line prints: each read and write is
called both ways, on real peers serving ``--api``, and the JSON compared."""
from __future__ import annotations

import re

import pytest

from engine.core import keys
from engine.hypervisor.host.hostinfo import GAUGES
from engine.operations.moves import DEFAULT_MAX_DOWNTIME_MS
from tests.support import wait_for
from tests.support.api_client import ApiClient, serving_pair
from tests.support.cluster import SMALL_VM, boot_vms, finished

# what moves between two reads a second apart on a live host
VOLATILE = set(GAUGES)     # measured; published when they move, maybe between two reads


@pytest.fixture
def served(cluster, store):
    """host1 and host2, each serving the API; an operator's client of host1's."""
    return serving_pair(cluster, store)


def steady(rows):
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]


READS = [("/v1/vms", ["vmlist"]), ("/v1/vms?pattern=host1/*", ["vmlist", "host1/*"]),
         ("/v1/vms?all=true", ["vmlist", "--all"]),
         ("/v1/hosts", ["hostlist"]), ("/v1/hosts?pattern=host2", ["hostlist", "host2"]),
         ("/v1/hoststats", ["hoststats"]), ("/v1/tasks?all=true", ["tasks", "--all"]),
         ("/v1/leases", ["lease", "list"]), ("/v1/backups", ["backup", "list"]),
         ("/v1/placement/providers", ["placement", "providers"]),
         ("/v1/placement/allocations", ["placement", "allocations"]),
         ("/v1/placement/candidates?resources=VCPU:1,MEMORY_MB:64,DISK_GB:1",
          ["placement", "candidates", "VCPU:1,MEMORY_MB:64,DISK_GB:1"])]


def test_every_read_answers_what_the_command_line_prints(cluster, served):
    client, _ = served
    boot_vms(cluster, "web1", "web2", on="host1")
    cluster.cli_json("lease", "create", "l1", "--start", "+1h", "--end", "+2h",
                     "--hosts", "1")
    for path, command in READS:
        status, doc, _ = client.get(path)
        assert status == 200, (path, doc)
        printed = cluster.cli_json(*command)
        assert steady(doc) == steady(printed), path
    assert [vm["name"] for vm in client.get("/v1/vms")[1]] == ["web1", "web2"]


def test_a_boot_answers_202_with_the_automation_to_wait_for(cluster, served):
    client, ports = served
    status, doc, headers = client.post("/v1/vms", {"names": ["api1", "api2"],
                                                   "resources": SMALL_VM, "on": "host2"})
    assert status == 202 and set(doc) == {"automation"}
    assert headers["Location"] == f"/v1/automations/{doc['automation']}"
    status, task, _ = client.get(headers["Location"] + "/wait?timeout=60")
    assert status == 200 and task["state"] == "done"
    assert task == cluster.cli_json("wait", doc["automation"])
    assert client.get(headers["Location"])[1] == cluster.cli_json("task", doc["automation"])
    # the other peer answers the same
    other = ApiClient(f"http://127.0.0.1:{ports['host2']}",
                      client.session.headers["Authorization"].split()[1])
    assert steady(other.get("/v1/vms")[1]) == steady(cluster.cli_json("vmlist"))
    assert {vm["name"]: vm["host"] for vm in other.get("/v1/vms")[1]} == {
        "api1": "host2", "api2": "host2"}
    # the command line's --detach prints the same document as the 202
    detached = cluster.cli_json("boot", "cli1", "--resources", SMALL_VM, "--detach")
    assert set(detached) == set(doc)


def test_a_group_boots_plans_and_reads_as_on_the_command_line(cluster, served):
    client, _ = served
    body = {"names": ["g1", "g2"], "resources": SMALL_VM, "group": "web", "rule": "spread"}
    status, plan, _ = client.post("/v1/vms", {**body, "dry_run": True})
    assert status == 200 and plan["state"] == "dry-run"
    assert sorted(row["host"] for row in plan["vms"]) == ["host1", "host2"]
    status, doc, headers = client.post("/v1/vms", body)
    assert status == 202
    assert client.get(headers["Location"] + "/wait?timeout=60")[1]["state"] == "done"
    for path, command in (("/v1/groups", ["group", "list"]),
                          ("/v1/groups/web", ["group", "show", "web"])):
        status, doc, _ = client.get(path)
        assert status == 200 and doc == cluster.cli_json(*command), path
    assert client.get("/v1/groups/nope")[0] == 404
    status, doc, _ = client.post("/v1/balance", {"dry_run": True})
    assert status == 200 and doc == cluster.cli_json("balance", "--dry-run")
    status, doc, _ = client.post("/v1/vms", {**body, "names": ["g3"]})
    assert status == 409 and "group 'web' (spread) rules out host1, host2" in doc["error"]


def test_actions_confirm_like_the_command_line(cluster, store, served):
    client, _ = served
    boot_vms(cluster, "db1", "db2", on="host1")
    status, doc, _ = client.post("/v1/vms/stop", {"patterns": ["db*"]})
    assert status == 409 and "yes" in doc["error"]
    status, plan, _ = client.post("/v1/vms/stop", {"patterns": ["db*"], "dry_run": True})
    assert status == 200
    assert plan == cluster.cli_json("stop", "db*", "--dry-run")
    status, doc, headers = client.post("/v1/vms/stop", {"patterns": ["db*"], "yes": True})
    assert status == 202
    assert finished(store, doc["automation"])["state"] == "done"
    assert {vm["name"]: vm["state"] for vm in cluster.cli_json("vmlist")} == {
        "db1": "shutoff", "db2": "shutoff"}
    status, doc, _ = client.post("/v1/vms/start", {"patterns": ["db1"]})
    assert status == 202        # one VM: nothing to confirm
    assert finished(store, doc["automation"])["state"] == "done"


def test_an_adopt_is_refused_as_the_command_line_refuses_it(cluster, served):
    client, _ = served
    # test:///default's built-in domain is foreign, its disk in no storage pool
    status, doc, _ = client.post("/v1/adopt", {"patterns": ["host1/test"]})
    said = cluster.cli("adopt", "host1/test").stderr.strip()
    assert status == 409 and f"peerctl: {doc['error']}" == said, (status, doc, said)
    assert "in no libvirt storage pool" in said
    status, doc, _ = client.post("/v1/adopt", {"patterns": ["test"]})
    assert status == 400 and "HOSTGLOB/VMGLOB" in doc["error"], doc


def test_a_migrate_passes_its_maximum_downtime_as_the_command_line_does(cluster, store, served):
    client, _ = served
    boot_vms(cluster, "web1", on="host1")
    for body, expected in (({"max_downtime_ms": 40}, 40), ({}, DEFAULT_MAX_DOWNTIME_MS)):
        status, doc, headers = client.post("/v1/migrate", {"patterns": ["web1"], **body})
        assert status == 202, doc
        assert client.get(headers["Location"] + "/wait?timeout=60")[1]["state"] == "done"
        assert store.get(keys.spec(doc["automation"])).value["args"]["max_downtime_ms"] == expected


def test_drain_and_undrain_answer_as_the_command_line(cluster, served):
    client, _ = served
    status, doc, _ = client.post("/v1/hosts/host2/drain", {})
    assert status == 200 and doc == {"hosts": [{"host": "host2", "drained": True}]}
    assert {h["host"]: h["drained"] for h in cluster.cli_json("hostlist")}["host2"] is True
    status, doc, _ = client.post("/v1/hosts/host2/undrain", {})
    assert doc == cluster.cli_json("undrain", "host2")
    status, doc, _ = client.post("/v1/hosts/host*/drain", {})
    assert status == 409            # two hosts: confirm first
    assert not any(h["drained"] for h in cluster.cli_json("hostlist"))


def test_backup_schedules_over_http_are_the_command_line_s(cluster, served):
    client, _ = served
    status, made, _ = client.post("/v1/backups/schedules", {"pattern": "db*", "every": "1h",
                                                            "keep_last": 3})
    assert status == 200 and made["state"] == "created" and made["keep"]["last"] == 3
    cluster.cli_json("backup", "schedule", "web*", "--every", "2h")
    assert client.get("/v1/backups/schedules")[1] == cluster.cli_json("backup", "schedule",
                                                                      "list")
    status, gone, _ = client.delete(f"/v1/backups/schedules/{made['schedule']}")
    assert status == 200 and [s["pattern"] for s in gone["schedules"]] == ["db*"]
    assert [s["pattern"] for s in cluster.cli_json("backup", "schedule", "list")] == ["web*"]
    status, doc, _ = client.post("/v1/backups/schedules", {"pattern": "x", "every": "soon"})
    assert status == 400 and "interval" in doc["error"]


def test_a_wait_that_times_out_answers_the_running_automation(cluster, served):
    client, _ = served
    status, doc, _ = client.post("/v1/ping", {"rounds": 2})
    assert status == 202
    status, task, _ = client.get(f"/v1/automations/{doc['automation']}/wait?timeout=30")
    assert status == 200 and task["state"] == "done"
    replies = task["result"]["replies"]
    assert {r["host"] for r in replies} == {"host1", "host2"} and len(replies) == 4
    assert client.get("/v1/automations/20990101-000000-abcdef")[0] == 404


def test_metrics_are_scraped_with_a_token_and_name_this_host_s_domains(cluster, served):
    from prometheus_client.parser import text_string_to_metric_families
    client, _ = served
    boot_vms(cluster, "web1", on="host1")
    assert ApiClient(client.url).get("/metrics")[0] == 401

    def scraped():
        response = client.session.get(client.url + "/metrics", timeout=10)
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return {f.name: f for f in text_string_to_metric_families(response.text)}
    wait_for(lambda: any(s.labels == {"kind": "boot", "state": "done"} and s.value >= 1
                         for s in scraped().get("peerctl_automations", _NONE).samples),
             what="the boot counted")
    families = scraped()
    for name in ("peerctl_automation_duration_seconds", "peerctl_placement_capacity",
                 "peerctl_ha_recoveries", "peerctl_etcd_up", "peerctl_hosts", "peerctl_vms",
                 "libvirt_domain_info_cpu_time_seconds", "libvirt_domain_info_virtual_cpus"):
        assert name in families, name
    domains = {s.labels["domain"] for s in families["libvirt_domain_info_virtual_cpus"].samples}
    assert domains == {"web1"}         # host1's own, not host2's
    assert [s.value for s in families["peerctl_etcd_up"].samples] == [1.0]


class _NONE:
    samples = ()


def test_the_openapi_document_lists_every_route(served):
    client, _ = served
    from engine.web.routes import ROUTES
    status, doc, _ = client.get("/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    shape = lambda path: re.sub(r"{\w+}", "{}", path)     # noqa: E731
    by_shape = {shape(path): operations for path, operations in doc["paths"].items()}
    assert len(by_shape) == len(doc["paths"]), "OpenAPI counts these as one path"
    for route in ROUTES:
        assert route.method.lower() in by_shape[shape(route.path)], route.path
    for path, operations in doc["paths"].items():
        for operation in operations.values():
            named = {p["name"] for p in operation.get("parameters", ()) if p["in"] == "path"}
            assert named == set(re.findall(r"{(\w+)}", path)), (path, named)
    assert doc["paths"]["/v1/vms"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["required"] == ["names", "resources"]


def test_ha_and_unmanage_answer_as_the_command_line(cluster, store, served):
    client, _ = served
    boot_vms(cluster, "keep1", on="host1")
    status, doc, _ = client.post("/v1/ha", {"patterns": ["keep1"], "policy": "restart"})
    assert status == 202
    assert finished(store, doc["automation"])["state"] == "done"
    assert cluster.cli_json("vmlist", "keep1")[0]["ha"] == "restart"
    status, doc, _ = client.post("/v1/ha", {"patterns": ["keep1"], "policy": "sometimes"})
    assert status == 400
    status, plan, _ = client.post("/v1/unmanage", {"patterns": ["keep1"], "dry_run": True})
    assert status == 200 and plan == cluster.cli_json("unmanage", "keep1", "--dry-run")
    assert [vm["name"] for vm in cluster.cli_json("vmlist")] == ["keep1"]
