"""The graphs of hosts and VMs through the API, on real peers serving
``--api``: a peer answers for its own host from the buffers it keeps, and
for another host (or a VM there) by asking that host's peer as the caller,
with the caller's token or session cookie; a host that is down, or whose
peer does not answer, is a 503 with one line."""
from __future__ import annotations

import pytest

import requests

from engine.core import api as engine_api
from engine.hypervisor.host.graphs import SERIES
from tests.support import wait_for
from tests.support.api_client import ApiClient, answers, api_peer_args, free_port
from tests.support.cluster import boot_vms


def served(cluster, store, *hosts):
    """``hosts`` each serving the API; an operator's client of each, by host."""
    ports = {host: free_port() for host in hosts}
    for host in hosts:
        cluster.start_peer(host, extra_args=api_peer_args(ports[host]))
    wait_for(lambda: set(hosts) <= set(engine_api.live_hosts(store)), what="peers alive")
    secret = cluster.cli_json("token", "create", "--role", "operator")["secret"]
    clients = {host: ApiClient(f"http://127.0.0.1:{port}", secret)
               for host, port in ports.items()}
    for host, client in clients.items():
        wait_for(lambda: answers(client), what=f"the API of {host}")
    return clients


def one_error_line(doc) -> str:
    """The answer is ``{"error": LINE}``, one line, no traceback."""
    assert set(doc) == {"error"}, doc
    assert doc["error"] and "\n" not in doc["error"] and "Traceback" not in doc["error"]
    return doc["error"]


def drawable(doc: dict, span: str = "hour"):
    """The answer's shape: every series as long as the span, on one time axis."""
    points, step = {"hour": (360, 10), "day": (288, 300)}[span]
    assert doc["span"] == span and doc["step_s"] == step
    assert doc["start"] % step == 0
    assert set(doc["series"]) == set(SERIES)
    assert all(len(values) == points for values in doc["series"].values())


def newest(doc: dict, name: str):
    """The newest point of ``name`` present (the newest step may not be sampled yet)."""
    present = [v for v in doc["series"][name] if v is not None]
    return present[-1] if present else None


def test_a_peer_answers_for_its_own_host_and_asks_the_other_peer_for_its_host(cluster, store):
    clients = served(cluster, store, "host1", "host2")
    status, own, _ = clients["host1"].get("/v1/hosts/host1/graphs")
    assert status == 200, own
    assert own["host"] == "host1"
    drawable(own)
    assert newest(own, "mem_bytes") > 0         # measured when the API started
    status, other, _ = clients["host1"].get("/v1/hosts/host2/graphs?span=day")
    assert status == 200, other
    assert other["host"] == "host2"             # host1 keeps no such buffer: host2 answered
    drawable(other, "day")
    assert newest(other, "mem_bytes") > 0
    status, asked_there, _ = clients["host2"].get("/v1/hosts/host2/graphs?span=day")
    assert (asked_there["start"], asked_there["step_s"]) == (other["start"], other["step_s"])


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_a_vm_on_another_host_is_drawn_from_its_hosts_peer(cluster, store):
    clients = served(cluster, store, "host1", "host2")
    vm = boot_vms(cluster, "web1", on="host2")["web1"]
    ask = lambda: clients["host1"].get("/v1/vms/web1/graphs")       # noqa: E731
    # the VM is read from the sample after its boot, at most a step later
    wait_for(lambda: newest(ask()[1], "mem_bytes") is not None, timeout=30,
             what="web1's memory in host2's graphs")
    status, doc, _ = ask()
    assert status == 200
    assert (doc["vm"], doc["host"]) == ("web1", "host2")
    drawable(doc)
    assert newest(doc, "mem_bytes") == vm.get("memory_mb", 64) * 1024 * 1024
    status, there, _ = clients["host2"].get("/v1/vms/web1/graphs?span=day")
    assert status == 200 and there["host"] == "host2"
    drawable(there, "day")


def test_a_session_cookie_is_passed_on_as_a_token_is(cluster, store):
    clients = served(cluster, store, "host1", "host2")
    url = clients["host1"].url
    viewer = cluster.cli_json("token", "create", "--role", "viewer")["secret"]
    browser = requests.Session()
    browser.get(url + "/")
    login = browser.post(url + "/v1/session", json={"token": viewer},
                         headers={"X-CSRF-Token": browser.cookies.get("peerctl_csrf")})
    assert login.status_code == 200, login.text
    answer = browser.get(url + "/v1/hosts/host2/graphs", timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["host"] == "host2"
    assert ApiClient(url).get("/v1/hosts/host2/graphs")[0] == 401


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_a_down_host_or_a_peer_that_does_not_answer_is_503_in_one_line(cluster, store):
    clients = served(cluster, store, "host1", "host2")
    cluster.start_peer("host3")                 # serves no API
    wait_for(lambda: "host3" in engine_api.live_hosts(store), what="host3 alive")
    status, doc, _ = clients["host1"].get("/v1/hosts/host3/graphs")
    assert status == 503 and "serves no API" in one_error_line(doc)
    cluster.kill("host2")
    status, doc, _ = clients["host1"].get("/v1/hosts/host2/graphs")
    assert status == 503, doc           # not answering, or already down
    one_error_line(doc)
    wait_for(lambda: "host2" not in engine_api.live_hosts(store), what="host2's record gone")
    status, doc, _ = clients["host1"].get("/v1/hosts/host2/graphs")
    assert (status, doc) == (503, {"error": "host host2 is down: its graphs were kept by "
                                            "its peer"})


def test_bad_requests_are_one_line(cluster, store):
    client = served(cluster, store, "host1")["host1"]
    status, doc, _ = client.get("/v1/hosts/host1/graphs?span=week")
    assert (status, doc) == (400, {"error": "bad span 'week' (want hour or day)"})
    for path, status in (("/v1/hosts/nohost/graphs", 404), ("/v1/vms/novm/graphs", 404),
                         ("/v1/hosts/host*/graphs", 400),
                         ("/v1/hosts/host1/graphs?colour=red", 400)):
        answer, doc, _ = client.get(path)
        assert answer == status, (path, doc)
        one_error_line(doc)
