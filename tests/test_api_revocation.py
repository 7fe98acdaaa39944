"""A revoked token keeps nothing open: deleting it (``token delete``) or its
expiry passing ends every event stream and console websocket it opened, on
every peer's API, within a second; a stream of another token goes on."""
from __future__ import annotations

import time

import aiohttp
import pytest

from engine.core import api as engine_api
from engine.core import keys, tokens
from tests.support import wait_for
from tests.support.api_client import ApiClient, OpenStream, answers, api_peer_args, free_port
from tests.support.api_server import in_own_loop
from tests.support.silent_libvirt import silent_console_api

PROMISE = 1.0                   # seconds: what docs/api.md promises
DEADLINE = PROMISE + 0.5        # what the test allows, polling included


@pytest.fixture
def two_apis(cluster, store):
    """host1 and host2, each serving the API: ``{host: url}``."""
    ports = {"host1": free_port(), "host2": free_port()}
    for host, port in ports.items():
        cluster.start_peer(host, extra_args=api_peer_args(port))
    wait_for(lambda: {"host1", "host2"} <= set(engine_api.live_hosts(store)), what="two peers")
    urls = {host: f"http://127.0.0.1:{port}" for host, port in ports.items()}
    for url in urls.values():
        wait_for(lambda u=url: answers(ApiClient(u), 401), what=f"the API at {url}")
    return urls




def ended_by(streams, deadline: float) -> list[bool]:
    """Whether each stream ended, waiting until ``deadline`` (monotonic) at most."""
    for stream in streams:
        stream.ended.wait(max(0.0, deadline - time.monotonic()))
    return [stream.ended.is_set() for stream in streams]


def test_token_delete_ends_its_streams_on_every_peer_within_a_second(cluster, two_apis):
    revoked = cluster.cli_json("token", "create", "--role", "viewer")
    kept = cluster.cli_json("token", "create", "--role", "viewer")
    doomed = [OpenStream(ApiClient(url, revoked["secret"])) for url in two_apis.values()]
    others = [OpenStream(ApiClient(url, kept["secret"])) for url in two_apis.values()]

    cluster.cli_json("token", "delete", revoked["id"])
    deleted = time.monotonic()

    assert ended_by(doomed, deleted + DEADLINE) == [True, True]
    assert [stream.ended.is_set() for stream in others] == [False, False]
    for url in two_apis.values():
        assert ApiClient(url, revoked["secret"]).get("/v1/vms")[0] == 401


def test_a_token_whose_expiry_passes_ends_its_stream(cluster, store, two_apis):
    fleeting = tokens.create(store, "viewer", 3.0)
    stream = OpenStream(ApiClient(two_apis["host2"], fleeting["secret"]))
    expires = store.get(keys.token(fleeting["id"])).value["expires"]
    expires_at = time.monotonic() + (expires - time.time())

    assert ended_by([stream], expires_at + DEADLINE) == [True]
    assert stream.ended_at >= expires_at - 0.1          # its expiry, not something else


# -- the console ---------------------------------------------------------------------------

@pytest.fixture
def slow_console_api(store, etcd, cluster_name):
    """The API of a cluster whose VM ``run1``'s libvirt never answers."""
    with silent_console_api(store, etcd.url, cluster_name) as server:
        yield server


def test_token_delete_closes_its_console_websocket_saying_why(store, slow_console_api):
    operator = tokens.create(store, "operator")
    url = slow_console_api.url.rstrip("/") + "/v1/vms/run1/console"

    async def console():
        async with aiohttp.ClientSession() as client:
            async with client.ws_connect(url, headers={
                    "Authorization": f"Bearer {operator['secret']}"}) as socket_:
                tokens.delete(store, [operator["id"]])
                deleted = time.monotonic()
                said = await socket_.receive_json(timeout=DEADLINE)
                closing = await socket_.receive(timeout=DEADLINE)
                return said, closing.type, closing.data, time.monotonic() - deleted
    said, kind, code, took = in_own_loop(console())
    assert said == {"ended": "console closed: the token was deleted"}
    assert (kind, code) == (aiohttp.WSMsgType.CLOSE, 4401)
    assert took < DEADLINE
