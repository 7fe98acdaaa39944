"""A client of peerctl's HTTP API for tests: JSON calls with a token, and a
reader of ``/v1/events`` that yields each server-sent event."""
from __future__ import annotations

import json
import threading
import time

import requests

from engine.core.etcd_server import free_port


__all__ = ["ApiClient", "SseEvent", "OpenStream", "free_port", "api_peer_args", "answers",
           "public_key", "serving_api", "serving_pair"]


def public_key(comment: str = "") -> str:
    """A new OpenSSH ed25519 public key line, for a VM's seed."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    line = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{line} {comment}".strip()


def api_peer_args(port: int) -> list[str]:
    return ["--api", f"127.0.0.1:{port}"]


def answers(client: "ApiClient", status: int = 200) -> bool:
    """Whether the API ``client`` calls answers ``GET /v1/hosts`` with ``status``
    yet (401 for a client without a token)."""
    try:
        return client.get("/v1/hosts", timeout=5)[0] == status
    except OSError:
        return False


def serving_api(cluster, store, host: str = "host1", role: str = "operator") -> "ApiClient":
    """Start ``host``'s peer serving the API; once it is alive, has its
    placement provider and answers, a client of it with a new ``role`` token."""
    from engine.core import api as engine_api
    from tests.support import wait_for
    port = free_port()
    cluster.start_peer(host, extra_args=api_peer_args(port))
    wait_for(lambda: host in engine_api.live_hosts(store), what=f"{host} alive")
    wait_for(lambda: host in {p["name"] for p in cluster.cli_json("placement", "providers")},
             what=f"{host}'s provider")
    client = ApiClient(f"http://127.0.0.1:{port}",
                       cluster.cli_json("token", "create", "--role", role)["secret"])
    wait_for(lambda: answers(client), what=f"{host}'s API")
    return client


def serving_pair(cluster, store) -> tuple["ApiClient", dict]:
    """host1 and host2, each serving the API; an operator's client of
    host1's, and ``{host: port}``."""
    from engine.core import api as engine_api
    from tests.support import wait_for
    ports = {}
    for host in ("host1", "host2"):
        ports[host] = free_port()
        cluster.start_peer(host, extra_args=api_peer_args(ports[host]))
    wait_for(lambda: {"host1", "host2"} <= set(engine_api.live_hosts(store)),
             what="peers alive")
    wait_for(lambda: len(cluster.cli_json("placement", "providers")) == 2,
             what="providers")
    secret = cluster.cli_json("token", "create", "--role", "operator")["secret"]
    client = ApiClient(f"http://127.0.0.1:{ports['host1']}", secret)
    wait_for(lambda: answers(client), what="the API of host1")
    return client, ports


class SseEvent:
    def __init__(self, id: str | None, event: str, data: str):
        self.id, self.event, self.data = id, event, data

    @property
    def revision(self) -> int:
        return int(self.id)

    @property
    def doc(self) -> dict:
        return json.loads(self.data)


class ApiClient:
    def __init__(self, url: str, secret: str | None = None, verify=True):
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.verify = verify
        if secret:
            self.session.headers["Authorization"] = f"Bearer {secret}"

    def call(self, method: str, path: str, body=None, raw: bytes | None = None,
             headers=None, timeout: float = 60) -> tuple[int, object, dict]:
        """``(status, JSON answer, headers)``."""
        response = self.session.request(method, self.url + path, timeout=timeout,
                                        json=body if raw is None else None,
                                        data=raw, headers=headers)
        try:
            doc = response.json()
        except ValueError:
            doc = response.text
        return response.status_code, doc, response.headers

    def get(self, path: str, **kw):
        return self.call("GET", path, **kw)

    def post(self, path: str, body=None, **kw):
        return self.call("POST", path, body, **kw)

    def delete(self, path: str, **kw):
        return self.call("DELETE", path, **kw)

    def events(self, last_event_id: int | None = None, timeout: float = 30,
               query: dict | None = None):
        """Each event of ``/v1/events`` (heartbeats skipped) until the
        stream ends; a non-200 answer raises ``requests.HTTPError``."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        response = self.session.get(self.url + "/v1/events", headers=headers, stream=True,
                                    params=query, timeout=(5, timeout))
        response.raise_for_status()
        fields: dict = {}
        try:
            for line in response.iter_lines(decode_unicode=True):
                if line:
                    if line.startswith(":"):
                        continue
                    name, _, value = line.partition(":")
                    fields[name] = value[1:] if value.startswith(" ") else value
                    continue
                if "data" in fields:
                    yield SseEvent(fields.get("id"), fields.get("event", "message"),
                                   fields["data"])
                fields = {}
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
            return
        finally:
            response.close()


class OpenStream:
    """``/v1/events`` of ``client`` read on a thread of its own: ``hello``
    is set once the stream is open, ``ended`` once it ends, ``ended_at``
    (``time.monotonic()``) says when."""

    def __init__(self, client: ApiClient):
        self.hello = threading.Event()
        self.ended = threading.Event()
        self.ended_at: float | None = None
        self.error: Exception | None = None
        threading.Thread(target=self._read, args=(client,), daemon=True).start()
        assert self.hello.wait(10), f"no hello from {client.url}/v1/events: {self.error}"

    def _read(self, client: ApiClient) -> None:
        try:
            for event in client.events(timeout=120):
                if event.event == "hello":
                    self.hello.set()
        except requests.RequestException as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.ended.set()
