"""The page's login is a session of its own (``POST /v1/session``): its
cookie is not the token's secret, etcd keeps only a hash of it, and it is
good on every server until logout, its token's deletion, its idle time or
its absolute lifetime ends it; then the cookie is refused everywhere and
the event streams it opened end."""
from __future__ import annotations

import contextlib
import hashlib
import time

import pytest
import requests

from engine.core import keys, tokens
from tests.support import wait_for
from tests.support.api_client import ApiClient, OpenStream
from tests.support.api_server import served_api
from tests.support.secured_etcd import SecuredEtcd

COOKIE = "peerctl_session"
DEADLINE = 1.5                  # the 1 s promise, with the polling's margin


@contextlib.contextmanager
def two_servers(etcd, cluster_name, **options):
    with served_api(etcd.url, cluster_name, **options) as a, \
            served_api(etcd.url, cluster_name, **options) as b:
        yield a.url.rstrip("/"), b.url.rstrip("/")


@pytest.fixture
def servers(etcd, cluster_name):
    with two_servers(etcd, cluster_name) as urls:
        yield urls


def log_in(url: str, secret: str) -> str:
    """The session cookie a browser gets by logging in at ``url``."""
    browser = requests.Session()
    browser.get(url + "/")
    login = browser.post(url + "/v1/session", json={"token": secret},
                         headers={"X-CSRF-Token": browser.cookies.get("peerctl_csrf")})
    assert login.status_code == 200, login.text
    return browser.cookies.get(COOKIE)


def with_cookie(url: str, cookie: str) -> ApiClient:
    client = ApiClient(url)
    client.session.cookies.set(COOKIE, cookie)
    return client


def reads(url: str, cookie: str) -> int:
    return with_cookie(url, cookie).get("/v1/hosts")[0]


def sessions_of(store, token_id: str) -> list:
    return store.range(keys.session(token_id))[0]


def test_the_cookie_is_a_session_kept_as_a_hash_and_never_the_token(store, servers):
    a, b = servers
    token = tokens.create(store, "viewer")
    cookie = log_in(a, token["secret"])
    assert cookie and cookie != token["secret"] and token["secret"] not in cookie
    (kv,) = sessions_of(store, token["id"])
    assert kv.key == keys.session(token["id"], hashlib.sha256(cookie.encode()).hexdigest())
    assert kv.value["token"] == token["id"]
    assert cookie not in repr([kv.value for kv in store.range("")[0]])
    assert [reads(a, cookie), reads(b, cookie)] == [200, 200]
    assert reads(a, token["secret"]) == 401          # a token's secret is no session
    assert with_cookie(a, cookie).get("/v1/session")[1]["how"] == "session"


def test_logout_makes_the_cookie_useless_on_every_server_and_ends_its_streams(
        store, servers):
    a, b = servers
    token = tokens.create(store, "viewer")
    cookie = log_in(a, token["secret"])
    stream = OpenStream(with_cookie(b, cookie))

    assert with_cookie(a, cookie).delete("/v1/session")[0] == 200
    out = time.monotonic()

    stream.ended.wait(DEADLINE - (time.monotonic() - out))
    assert stream.ended.is_set()
    assert [reads(a, cookie), reads(b, cookie)] == [401, 401]
    assert sessions_of(store, token["id"]) == []
    assert ApiClient(a, token["secret"]).get("/v1/hosts")[0] == 200    # the token lives on


def test_token_delete_ends_its_sessions_and_their_streams(cluster, store, servers):
    a, b = servers
    token = cluster.cli_json("token", "create", "--role", "operator")
    cookies = [log_in(a, token["secret"]), log_in(b, token["secret"])]
    streams = [OpenStream(with_cookie(url, cookie)) for url, cookie in zip(servers, cookies)]

    cluster.cli_json("token", "delete", token["id"])
    deleted = time.monotonic()

    for stream in streams:
        stream.ended.wait(max(0.0, DEADLINE - (time.monotonic() - deleted)))
    assert [stream.ended.is_set() for stream in streams] == [True, True]
    assert [reads(url, cookie) for url in servers for cookie in cookies] == [401] * 4
    wait_for(lambda: sessions_of(store, token["id"]) == [], timeout=DEADLINE,
             what="the token's sessions deleted")


def test_a_request_refreshes_the_idle_time_at_most_once_a_minute(store, servers):
    a, _ = servers
    token = tokens.create(store, "viewer")
    cookie = log_in(a, token["secret"])
    (before,) = sessions_of(store, token["id"])
    for _ in range(20):
        assert reads(a, cookie) == 200
    (after,) = sessions_of(store, token["id"])
    assert after.mod_revision == before.mod_revision          # nothing written
    assert before.value["idle"] == 12 * 3600 and \
        before.value["expires"] - before.value["created"] == pytest.approx(7 * 86400)


def test_a_session_ends_after_its_idle_time_unless_used(store, etcd, cluster_name):
    idle = 2.0
    with two_servers(etcd, cluster_name, session_idle=idle) as (a, b):
        token = tokens.create(store, "viewer")
        used = log_in(a, token["secret"])
        left = log_in(a, token["secret"])
        stream = OpenStream(with_cookie(b, left))
        logged_in = time.monotonic()
        while time.monotonic() < logged_in + 2 * idle:     # used every half idle time
            assert reads(b, used) == 200
            time.sleep(idle / 4)        # the pace of a person's clicks, not a wait for state
        assert stream.ended.wait(DEADLINE)
        assert stream.ended_at - logged_in >= idle - 0.1
        assert [reads(a, left), reads(b, left)] == [401, 401]
        assert reads(a, used) == 200


def test_a_session_ends_at_its_lifetime_however_used(store, etcd, cluster_name):
    lifetime = 3.0
    with two_servers(etcd, cluster_name, session_idle=60, session_lifetime=lifetime) as (a, b):
        token = tokens.create(store, "viewer")
        cookie = log_in(a, token["secret"])
        logged_in = time.monotonic()
        stream = OpenStream(with_cookie(b, cookie))
        assert stream.ended.wait(lifetime + DEADLINE)
        assert stream.ended_at - logged_in >= lifetime - 0.1
        assert [reads(a, cookie), reads(b, cookie)] == [401, 401]


def test_an_api_serving_as_the_operator_keeps_sessions_on_a_role_checking_etcd(tmp_path):
    """``serve --api`` runs as the operator's certificate: etcd lets that
    role write ``sessions/`` (and still not what only hosts write)."""
    from engine.web.app import Api
    from engine.web.server import ApiServer
    secured = SecuredEtcd(tmp_path)
    operator = secured.store("operator")
    server = ApiServer(Api(secured.server.url, secured.name, operator.credentials,
                           {"backend": "etcd"}), "127.0.0.1:0").start()
    try:
        url = server.url.rstrip("/")
        token = tokens.create(operator, "viewer")
        cookie = log_in(url, token["secret"])
        assert [kv.value["token"] for kv in operator.range(keys.session())[0]] == [token["id"]]
        assert reads(url, cookie) == 200
        assert with_cookie(url, cookie).delete("/v1/session")[0] == 200
        assert operator.range(keys.session())[0] == []
        assert reads(url, cookie) == 401
    finally:
        server.stop()
        operator.close()
        secured.close()
