"""Who may do what through the HTTP API, and what bad input gets: a token's
role decides (a viewer's write is 403 and writes nothing), an unknown,
deleted or expired token is 401, the page's cookie needs the CSRF token,
and every bad request is one line of JSON with nothing written."""
from __future__ import annotations

import pytest
import requests

from engine.core import api as engine_api
from engine.core import keys
from tests.support import wait_for
from tests.support.api_client import ApiClient, answers, api_peer_args, free_port
from tests.support.cluster import SMALL_VM, boot_vms, finished

WRITES = ("auto/", "tasks/", "vms/", "drained/", "leases/")


@pytest.fixture
def api_url(cluster, store):
    port = free_port()
    cluster.start_peer("host1", extra_args=api_peer_args(port))
    wait_for(lambda: "host1" in engine_api.live_hosts(store), what="host1 alive")
    wait_for(lambda: cluster.cli_json("placement", "providers"), what="host1's provider")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(ApiClient(url), 401), what="host1's API")
    return url




def token(cluster, role: str) -> dict:
    return cluster.cli_json("token", "create", "--role", role)


def written(store) -> dict:
    """What an API write could have changed: each key and its revision."""
    return {kv.key: kv.mod_revision for prefix in WRITES for kv in store.range(prefix)[0]}


BOOT = {"names": ["v1"], "resources": SMALL_VM}


def test_a_viewer_reads_and_cannot_boot_and_nothing_is_written(cluster, store, api_url):
    viewer = ApiClient(api_url, token(cluster, "viewer")["secret"])
    assert viewer.get("/v1/vms")[0] == 200
    before = written(store)
    status, doc, _ = viewer.post("/v1/vms", BOOT)
    assert status == 403
    assert doc == {"error": "permission denied for role viewer: a viewer may read, "
                            "not boot VMs"}
    for path, body in (("/v1/vms/stop", {"patterns": ["*"]}), ("/v1/hosts/host1/drain", {}),
                       ("/v1/ping", {})):
        assert viewer.post(path, body)[0] == 403, path
    assert written(store) == before


def test_an_operator_boots(cluster, store, api_url):
    operator = ApiClient(api_url, token(cluster, "operator")["secret"])
    status, doc, _ = operator.post("/v1/vms", BOOT)
    assert status == 202
    assert finished(store, doc["automation"])["state"] == "done"
    assert [vm["name"] for vm in cluster.cli_json("vmlist")] == ["v1"]


def test_no_unknown_deleted_or_expired_token_gets_in(cluster, store, api_url):
    assert ApiClient(api_url).get("/v1/vms")[0] == 401
    assert ApiClient(api_url, "pct_000000000000_" + "x" * 43).get("/v1/vms")[0] == 401
    status, doc, _ = ApiClient(api_url).get("/v1/vms", headers={"Authorization": "Basic eA=="})
    assert status == 401 and "error" in doc
    deleted = token(cluster, "operator")
    client = ApiClient(api_url, deleted["secret"])
    assert client.get("/v1/vms")[0] == 200
    cluster.cli_json("token", "delete", deleted["id"])
    assert client.get("/v1/vms")[0] == 401
    expired = token(cluster, "operator")
    record = store.get(keys.token(expired["id"])).value
    store.put(keys.token(expired["id"]), dict(record, expires=record["created"] - 1))
    before = written(store)
    assert ApiClient(api_url, expired["secret"]).post("/v1/vms", BOOT)[0] == 401
    assert written(store) == before


def test_the_page_session_needs_the_csrf_token_to_write(cluster, store, api_url):
    boot_vms(cluster, "web1")
    browser = requests.Session()
    page = browser.get(api_url + "/")
    assert page.status_code == 200
    csrf = browser.cookies.get("peerctl_csrf")
    assert csrf
    secret = token(cluster, "operator")["secret"]
    assert browser.post(api_url + "/v1/session", json={"token": secret}).status_code == 403
    login = browser.post(api_url + "/v1/session", json={"token": secret},
                         headers={"X-CSRF-Token": csrf})
    assert login.status_code == 200 and login.json()["role"] == "operator"
    assert browser.get(api_url + "/v1/session").json()["how"] == "session"
    before = written(store)
    forged = browser.post(api_url + "/v1/vms/stop", json={"patterns": ["web1"]},
                          headers={"Origin": api_url})
    assert forged.status_code == 403 and "CSRF" in forged.json()["error"]
    wrong = browser.post(api_url + "/v1/vms/stop", json={"patterns": ["web1"]},
                         headers={"X-CSRF-Token": csrf + "x"})
    assert wrong.status_code == 403
    assert written(store) == before
    done = browser.post(api_url + "/v1/vms/stop", json={"patterns": ["web1"]},
                        headers={"X-CSRF-Token": csrf})
    assert done.status_code == 202
    assert finished(store, done.json()["automation"])["state"] == "done"
    browser.delete(api_url + "/v1/session")
    assert browser.get(api_url + "/v1/vms").status_code == 401


BAD = [
    ("POST", "/v1/vms", b"{not json", 400, "malformed JSON"),
    ("POST", "/v1/vms", b'{"names": ["a"], "resources": "VCPU:1", "colour": 1}', 400,
     'unknown field "colour"'),
    ("POST", "/v1/vms", b'{"names": "a", "resources": "VCPU:1"}', 400, "is not of type"),
    ("POST", "/v1/vms", b'{"names": ["a"]}', 400, '"resources" is a required field'),
    ("POST", "/v1/vms", b'{"names": ["a b"], "resources": "VCPU:1,MEMORY_MB:64,DISK_GB:1"}',
     400, "bad VM name"),
    ("POST", "/v1/vms", b'{"names": ["a"], "resources": "VCPU:lots"}', 400, "resource"),
    ("POST", "/v1/vms", b"[1, 2]", 400, 'is not of type "object"'),
    ("POST", "/v1/vms/stop", b'{"patterns": ["a/b/c"]}', 400, "bad VM pattern"),
    ("POST", "/v1/vms/explode", b'{"patterns": ["*"]}', 404, "no such VM action"),
    ("POST", "/v1/migrate", b'{"patterns": ["*"], "parallel": 0}', 400, "minimum"),
    ("POST", "/v1/migrate", b'{"patterns": ["*"], "max_downtime_ms": 0}', 400, "minimum"),
    ("POST", "/v1/migrate", b'{"patterns": ["*"], "max_downtime_ms": 10001}', 400, "maximum"),
    ("GET", "/v1/hosts?pattern=a/b", b"", 400, "bad host pattern"),
    ("GET", "/v1/vms?colour=red", b"", 400, "unknown query parameter"),
    ("GET", "/v1/tasks?all=maybe", b"", 400, "bad value"),
    ("GET", "/v1/nowhere", b"", 404, "no such path"),
    ("PUT", "/v1/vms", b"{}", 405, "not allowed"),
    ("DELETE", "/v1/automations/x", b"{}", 400, "takes no body"),
    ("GET", "/v1/automations/nope/wait?timeout=forever", b"", 404, "no automation"),
    ("GET", "/v1/placement/candidates", b"", 400, "resources is required"),
]


def test_bad_input_is_one_line_and_writes_nothing(cluster, store, api_url):
    client = ApiClient(api_url, token(cluster, "operator")["secret"])
    before = written(store)
    for method, path, raw, status, said in BAD:
        got, doc, headers = client.call(method, path, raw=raw,
                                        headers={"Content-Type": "application/json"})
        assert (got, said in str(doc)) == (status, True), (method, path, raw, doc)
        assert headers["Content-Type"].startswith("application/json"), path
        assert set(doc) == {"error"} and "\n" not in doc["error"], doc
        assert "Traceback" not in doc["error"]
    assert written(store) == before


def test_an_oversized_body_is_refused_unread(cluster, store, api_url):
    client = ApiClient(api_url, token(cluster, "operator")["secret"])
    body = b'{"names": ["a"], "resources": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    status, doc, _ = client.call("POST", "/v1/vms", raw=body,
                                 headers={"Content-Type": "application/json"})
    assert status == 413 and "over" in doc["error"]


def test_stuck_clients_block_neither_the_peer_nor_other_clients(cluster, store, api_url):
    """200 connections that never finish their request, and an event stream
    nobody reads: the peer still boots, and the API still answers."""
    import socket
    host, port = api_url.rsplit("/", 1)[1].split(":")
    stuck = []
    try:
        for _ in range(200):
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"GET /v1/vms HTTP/1.1\r\nHost: x\r\n")      # and never the rest
            stuck.append(sock)
        secret = token(cluster, "viewer")["secret"]
        unread = socket.create_connection((host, int(port)), timeout=5)
        unread.sendall(f"GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}"
                       "\r\n\r\n".encode())
        stuck.append(unread)
        boot_vms(cluster, "busy1", "busy2")
        answer = ApiClient(api_url, secret).get("/v1/vms")
        assert answer[0] == 200 and [vm["name"] for vm in answer[1]] == ["busy1", "busy2"]
    finally:
        for sock in stuck:
            sock.close()
