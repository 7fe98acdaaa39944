"""Asking another peer's API, on the caller's behalf, for what only that
peer has (the graphs of its host live in its memory): the caller's own
credentials passed on (its bearer token or session cookie: identities are
the cluster's, so every peer knows them), HTTPS verified with the
cluster's CA.

Promises: :func:`relayed` answers the other peer's JSON, or raises what
the API answers in one line: that peer's own refusal with its status and
line (a ``4xx``), or :class:`~engine.errors.Unavailable` (``503``) when it
does not answer within :data:`TIMEOUT` seconds, or not in JSON.  The
request it sends carries :data:`~.identity.RELAYED_HEADER`, so that a peer
never relays a relayed request again (host records that disagree make no
loop).  It blocks: call it on the API's pool."""
from __future__ import annotations

import requests

from engine.errors import Unavailable

from .identity import RELAYED_HEADER
from .routes.core import Refusal

__all__ = ["relayed", "TIMEOUT"]

TIMEOUT = 5.0       # seconds for the other peer to answer


def relayed(url: str, path: str, query: dict, passed: dict, cacert: str | None,
            whose: str) -> object:
    """``GET url + path?query`` from the peer of ``whose`` (a host's name,
    for the messages), as the caller whose headers ``passed`` are."""
    try:
        response = requests.get(url.rstrip("/") + path, params=query, timeout=TIMEOUT,
                                headers={**passed, RELAYED_HEADER: "1"},
                                verify=cacert or True, allow_redirects=False)
        doc = response.json()
    except requests.RequestException as exc:
        raise Unavailable(f"the peer of host {whose} does not answer at {url}: "
                          f"{type(exc).__name__}", url) from None
    except ValueError:
        raise Unavailable(f"the peer of host {whose} at {url} answered "
                          f"{response.status_code} but no JSON", url) from None
    if response.status_code == 200:
        return doc
    line = doc.get("error") if isinstance(doc, dict) else None
    if response.status_code >= 500 or not isinstance(line, str):
        raise Unavailable(f"the peer of host {whose} at {url} answered "
                          f"{response.status_code}: {line or 'no error line'}", url)
    raise Refusal(response.status_code, line)
