"""A client of peerctl's HTTP API for tests: JSON calls with a token, and a
reader of ``/v1/events`` that yields each server-sent event."""
from __future__ import annotations

import json

import requests

from engine.core.etcd_server import free_port


__all__ = ["ApiClient", "SseEvent", "free_port", "api_peer_args"]


def api_peer_args(port: int) -> list[str]:
    return ["--api", f"127.0.0.1:{port}"]


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

    def events(self, last_event_id: int | None = None, timeout: float = 30):
        """Each event of ``/v1/events`` (heartbeats skipped) until the
        stream ends; a non-200 answer raises ``requests.HTTPError``."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        response = self.session.get(self.url + "/v1/events", headers=headers, stream=True,
                                    timeout=(5, timeout))
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
