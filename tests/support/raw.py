"""Bytes written into etcd as they are, past peerctl's encoding: what an
operator's ``etcdctl put`` or a bad disk can leave under any key."""
from __future__ import annotations

import base64
import json
import urllib.request

__all__ = ["put_raw"]


def put_raw(etcd_url: str, key: str, raw: bytes) -> None:
    """Write ``raw`` under ``key`` (the full key, with the cluster prefix),
    through etcd's JSON gateway."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "value": base64.b64encode(raw).decode()}).encode()
    request = urllib.request.Request(f"{etcd_url}/v3/kv/put", data=body,
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).read()
