"""The API over HTTPS on a cluster whose etcd checks roles: a client
certificate of the cluster's CA says who asks, and requests reach etcd as
their role, so etcd itself refuses a viewer's writes."""
from __future__ import annotations

import pytest
import requests

from engine.core.store import Put
from engine.errors import PermissionDenied
from engine.web.app import Api
from engine.web.server import ApiServer, role_credentials
from tests.support.secured_etcd import SecuredEtcd


@pytest.fixture
def https_api(tmp_path):
    secured = SecuredEtcd(tmp_path)
    files = secured.files("root")
    api = Api(secured.server.url, secured.name, secured.store("root").credentials,
              {"backend": "etcd"}, role_credentials(secured.tls, files["cacert"]), tls=True)
    server = ApiServer(api, "127.0.0.1:0", tls={"cert": f"{secured.tls}/etcd.pem",
                                                "key": f"{secured.tls}/etcd-key.pem",
                                                "cacert": files["cacert"]}).start()
    yield secured, api, server
    server.stop()
    secured.close()


def as_(secured, user: str) -> requests.Session:
    session = requests.Session()
    session.trust_env = False       # $REQUESTS_CA_BUNDLE would win over verify
    session.verify = secured.files(user)["cacert"]
    files = secured.files(user)
    session.cert = (files["cert"], files["key"])
    return session


def test_a_client_certificate_names_the_role(https_api):
    secured, api, server = https_api
    viewer = as_(secured, "viewer")
    assert viewer.get(server.url + "/v1/vms").json() == []
    assert viewer.get(server.url + "/v1/session").json() == {
        "user": "viewer", "role": "viewer", "how": "certificate"}
    refused = viewer.post(server.url + "/v1/ping", json={})
    assert refused.status_code == 403 and "role viewer" in refused.json()["error"]
    operator = as_(secured, "operator")
    answer = operator.post(server.url + "/v1/ping", json={})
    assert answer.status_code == 409 and "no live" in answer.json()["error"]   # no peers here
    from_a_page = operator.post(server.url + "/v1/ping", json={},
                                headers={"Origin": "https://elsewhere.example"})
    assert from_a_page.status_code == 403 and "CSRF" in from_a_page.json()["error"]


def test_without_a_certificate_or_token_nothing_answers(https_api):
    secured, _, server = https_api
    anonymous = requests.Session()
    anonymous.trust_env = False
    anonymous.verify = secured.files("root")["cacert"]
    assert anonymous.get(server.url + "/v1/vms").status_code == 401
    with pytest.raises(requests.ConnectionError):
        requests.get(server.url.replace("https", "http") + "/v1/vms", timeout=5)


def test_requests_reach_etcd_as_their_role(https_api):
    _, api, _ = https_api
    with pytest.raises(PermissionDenied, match="role viewer"):
        api.context("viewer").store().txn([], [Put("tasks/x", {"id": "x"})])
    api.context("operator").store().txn([], [Put("tasks/x", {"id": "x"})])


def test_another_hosts_graphs_asked_with_a_certificate_name_the_peer_to_ask(https_api):
    """A client certificate's key stays with its holder: the server cannot
    ask host9's peer as that client, and says where to ask instead."""
    from engine.core import keys
    secured, _, server = https_api
    store = secured.store("root")
    lease = store.grant(60)
    store.txn([], [Put(keys.host_config("host9"), {"host": "host9"}),
                   Put(keys.host("host9"), {"host": "host9", "api": "https://host9:8080"},
                       lease)])
    answer = as_(secured, "viewer").get(server.url + "/v1/hosts/host9/graphs")
    assert answer.status_code == 421
    assert answer.json() == {"api": "https://host9:8080", "error": (
        "the graphs of host host9 are kept by its peer, at https://host9:8080: a client "
        "certificate cannot be passed on to it, ask it there")}
