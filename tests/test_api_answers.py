"""What the API answers where users found it wrong (issue 48, item 8): a
body nested too deeply, names that do not exist, a base URL with its
trailing slash, a confirmation that must name its targets, errors in the
request's own terms, one VM by its name, requests aiohttp cannot read, and
a Prometheus scrape configured as docs/metrics.md says.  Each through a
real peer's ``--api`` on a real etcd."""
from __future__ import annotations

import os
import re
import socket

import pytest
import requests

from tests.support import ROOT
from tests.support.api_client import serving_api
from tests.support.cluster import SMALL_VM, boot_vms

WRITES = ("auto/", "tasks/", "vms/", "drained/", "leases/", "backups/")


@pytest.fixture
def api(cluster, store):
    """host1 serving the API; an operator's client of it."""
    return serving_api(cluster, store)


def written(store) -> dict:
    return {kv.key: kv.mod_revision for prefix in WRITES for kv in store.range(prefix)[0]}


def one_line(status, doc, expected_status):
    assert status == expected_status, doc
    assert isinstance(doc, dict) and "\n" not in doc["error"], doc
    return doc["error"]


def test_a_body_nested_too_deeply_is_one_line_400(cluster, store, api):
    before = written(store)
    for raw in (b"[" * 100_000 + b"]" * 100_000,
                b'{"names": ["a"], "resources": "VCPU:1", "image": ' + b"[" * 5000
                + b"]" * 5000 + b"}"):
        status, doc, headers = api.call("POST", "/v1/vms", raw=raw,
                                        headers={"Content-Type": "application/json"})
        said = one_line(status, doc, 400)
        assert "nested too deeply" in said and headers["Content-Type"].startswith(
            "application/json")
    assert written(store) == before
    assert api.get("/v1/hosts")[0] == 200         # the server goes on


def test_a_name_or_id_that_names_nothing_is_404(cluster, api):
    boot_vms(cluster, "web1")
    unknown = "20990101-000000-abcdef"
    for method, path, body, said in (
            ("GET", "/v1/leases/nolease", None, "no lease 'nolease'"),
            ("POST", "/v1/leases/nolease/extend", {"end": "+3h"}, "no lease 'nolease'"),
            ("DELETE", "/v1/leases/nolease", None, "no lease 'nolease'"),
            ("DELETE", "/v1/leases/nolease?dry_run=true", None, "no lease 'nolease'"),
            ("DELETE", f"/v1/backups/{unknown}", None, f"no backup '{unknown}'"),
            ("POST", "/v1/restores", {"backup": unknown}, f"no backup '{unknown}'"),
            ("DELETE", "/v1/backups/schedules/nosched", None, "no backup schedule 'nosched'"),
            ("GET", f"/v1/automations/{unknown}", None, "no automation"),
            ("DELETE", f"/v1/automations/{unknown}", None, "no automation"),
            ("GET", "/v1/groups/nogroup", None, "no group"),
            ("GET", "/v1/vms/nosuchvm", None, "nosuchvm"),
            ("POST", "/v1/vms/stop", {"patterns": ["nosuchvm"]}, "nosuchvm"),
            ("POST", "/v1/hosts/nohost/drain", {}, "nohost")):
        status, doc, _ = api.call(method, path, body)
        assert (status, said in str(doc)) == (404, True), (method, path, status, doc)
    # the command line still exits 1 for each
    done = cluster.cli("lease", "show", "nolease")
    assert done.returncode == 1 and "no lease 'nolease'" in done.stderr


def test_a_base_url_with_its_trailing_slash_still_reaches_the_routes(cluster, api):
    boot_vms(cluster, "web1")
    listed = api.get("/v1/vms")[1]
    base = api.url + "/"           # as `up` used to print it: ${api}/v1/vms
    for path in ("/v1/vms", "/v1/vms/", "//v1/vms", "/v1//vms"):
        response = api.session.get(base.rstrip("/") + path, timeout=10)
        assert response.status_code == 200 and response.json() == listed, path
    response = api.session.get(base + "/v1/vms?pattern=web*", timeout=10)
    assert response.status_code == 200 and response.json() == listed
    response = api.session.post(base + "/v1/vms/stop/", json={"patterns": ["web1"],
                                                              "dry_run": True}, timeout=10)
    assert response.status_code == 200 and response.json()["state"] == "dry-run"
    status, doc, _ = api.get("//v1/nowhere")
    assert status == 404 and "no such path" in doc["error"]


def test_a_confirmation_names_what_it_would_act_on(cluster, store, api):
    boot_vms(cluster, "web1", "web2")
    before = written(store)
    status, doc, _ = api.post("/v1/vms/destroy", {"patterns": ["web*"]})
    said = one_line(status, doc, 409)
    assert "2 VMs (host1/web1, host1/web2)" in said and '"yes": true' in said, said
    assert [(t["host"], t["name"]) for t in doc["targets"]] == [("host1", "web1"),
                                                                 ("host1", "web2")]
    assert written(store) == before


def test_errors_name_the_body_s_fields_and_show_json_values(cluster, store, api):
    boot_vms(cluster, "web1")
    before = written(store)
    for path, body, says in (
            ("/v1/vms", {"names": ["a"], "resources": SMALL_VM, "on": "nohost"},
             'no host matches "on": "nohost"'),
            ("/v1/migrate", {"patterns": ["web1"], "to": "nohost"}, '"to": "nohost"'),
            ("/v1/backups", {"patterns": ["web1"], "to": "nohost"}, '"to": "nohost"'),
            ("/v1/leases", {"name": "l1", "start": "whenever", "end": "+2h", "hosts": 1},
             'bad "start" "whenever"'),
            ("/v1/leases", {"name": "l1", "start": "+1h", "end": "+2h"}, '"hosts" N'),
            ("/v1/leases", {"name": "l1", "start": "+1h", "end": "+2h", "hosts": 1,
                            "amount": 2}, '"amount" goes with "resources"'),
            ("/v1/vms", {"names": ["a"], "resources": SMALL_VM, "rule": "spread"},
             '"rule": "spread" needs "group"'),
            ("/v1/vms", b"null", 'bad body: null is not of type "object"'),
            ("/v1/vms", {"names": ["a"], "resources": {"VCPU": 1}},
             'bad "resources": {"VCPU": 1} is not of type "string"'),
            ("/v1/vms", {"names": [None], "resources": SMALL_VM},
             'bad "names"[0]: null is not of type "string"'),
            ("/v1/vms", {"names": ["a"], "resources": SMALL_VM, "ha": None},
             'bad "ha": null is not one of "restart", "none"'),
            ("/v1/vms", {"names": ["a"], "resources": SMALL_VM, "dry_run": "yes"},
             'bad "dry_run": "yes" is not of type "boolean"')):
        raw = body if isinstance(body, bytes) else None
        status, doc, _ = api.call("POST", path, None if raw else body, raw=raw,
                                  headers={"Content-Type": "application/json"})
        said = doc["error"]
        assert status in (400, 409) and says in said, (path, body, said)
        assert not re.search(r"--[a-z]|None|True|False|\{'", said), (path, body, said)
    assert written(store) == before
    # the command line still names its flags
    assert "no host matches --on 'nohost'" in cluster.cli(
        "boot", "a", "--resources", SMALL_VM, "--on", "nohost").stderr
    assert "bad --start 'whenever'" in cluster.cli(
        "lease", "create", "l1", "--start", "whenever", "--end", "+2h", "--hosts", "1").stderr


def test_one_vm_is_read_by_its_name(cluster, api):
    boot_vms(cluster, "web1", "web2")
    status, vm, _ = api.get("/v1/vms/web2")
    assert status == 200
    assert vm == [row for row in api.get("/v1/vms")[1] if row["name"] == "web2"][0]
    assert vm["host"] == "host1" and vm["state"] == "running"
    status, doc, _ = api.get("/v1/vms/web*")
    assert status == 400 and "bad VM name" in doc["error"]
    assert api.get("/v1/vms/web3")[0] == 404
    assert "get" in api.get("/v1/openapi.json")[1]["paths"]["/v1/vms/{name}"]


def _raw(url: str, request: bytes) -> tuple[int, dict, bytes]:
    """Send ``request`` as is; the status, headers and body of the answer."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_a_request_line_or_header_over_the_limit_is_one_json_line(api):
    import json
    for request in (b"GET /v1/vms?x=" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"GET /v1/vms HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"):
        status, headers, body = _raw(api.url, request)
        assert status == 400 and headers["content-type"].startswith("application/json")
        doc = json.loads(body)
        assert set(doc) == {"error"} and "\n" not in doc["error"]
        assert doc["error"] == "request line or header over 8190 bytes", doc
    assert api.get("/v1/hosts")[0] == 200


def _scrape_config() -> dict:
    import yaml
    text = open(os.path.join(ROOT, "docs", "metrics.md")).read()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    configs = [yaml.safe_load(block) for block in blocks]
    found = [c for c in configs if isinstance(c, dict) and "scrape_configs" in c]
    assert found, "docs/metrics.md shows no Prometheus scrape configuration"
    return found[0]["scrape_configs"][0]


def test_prometheus_scrapes_metrics_as_docs_metrics_md_configures_it(cluster, api, tmp_path):
    """Exactly what Prometheus sends for the documented job: the header its
    ``authorization`` makes from ``credentials_file`` (the secret, as
    ``token create`` printed it), its Accept, the job's path."""
    from prometheus_client.parser import text_string_to_metric_families
    job = _scrape_config()
    auth = job["authorization"]
    secret = cluster.cli_json("token", "create", "--role", "viewer")["secret"]
    credentials = tmp_path / os.path.basename(auth["credentials_file"])
    credentials.write_text(secret + "\n")
    header = f"{auth.get('type', 'Bearer')} {credentials.read_text().strip()}"
    url = f"{job.get('scheme', 'http')}://{api.url.split('//')[1]}" \
          f"{job.get('metrics_path', '/metrics')}"
    sent = {"Authorization": header, "User-Agent": "Prometheus/2.53.0",
            "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,"
                      "text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
            "X-Prometheus-Scrape-Timeout-Seconds": str(job.get("scrape_timeout", "10s"))}
    response = requests.get(url, headers=sent, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    names = {family.name for family in text_string_to_metric_families(response.text)}
    assert "peerctl_etcd_up" in names
    assert requests.get(url, timeout=10).status_code == 401     # without the token
