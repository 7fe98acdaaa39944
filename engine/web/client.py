"""A client of the HTTP API for the command line run from a workstation
(``peerctl --api URL[,URL...] --token-file FILE``): JSON calls with a
bearer token, one peer after another, and the event stream.

Promises:
- a call goes to the peer that answered last, else to each URL in turn; a
  peer that cannot be reached, times out or answers ``503`` (its etcd is
  unreachable) is passed over.  When none answers: :class:`NoPeerAnswered`
  (exit 3), naming each URL and why.  A write is sent again to the next
  peer only when the first could not have received it (no connection);
- an answer's ``{"error": LINE}`` becomes the error root's class the
  command line would have raised for it, with the server's line: ``400``
  and ``413`` :class:`~engine.errors.UsageError` (exit 2), ``401``/``403``
  :class:`~engine.errors.PermissionDenied` (exit 4), ``404``
  :class:`~engine.errors.NoSuch`, ``409`` and the rest
  :class:`~engine.errors.Failed` (exit 1), keeping the ``result`` and
  ``matched`` documents the server sent beside the line;
- HTTPS is verified against ``cacert`` when given, else the system's CAs.
"""
from __future__ import annotations

import json
import ssl

from engine.errors import Failed, NoSuch, PermissionDenied, Unavailable, UsageError

__all__ = ["ApiClient", "NoPeerAnswered", "ApiError"]

CONNECT_TIMEOUT = 5.0           # seconds to open a connection to one peer
READ_TIMEOUT = 330.0            # a wait route blocks up to 300 s


class NoPeerAnswered(Unavailable):
    """No peer's API answered (exit 3)."""


class ApiError(Failed):
    """A refusal (409 and the like) carrying the server's extra fields."""

    def __init__(self, message: str, status: int, more: dict):
        super().__init__(message, result=more.get("result"))
        self.status = status
        self.more = more


def _refusal(status: int, doc: dict, url: str):
    line = doc.get("error") or f"the API at {url} answered {status}"
    more = {k: v for k, v in doc.items() if k != "error"}
    if status in (400, 413):
        return UsageError(line)
    if status in (401, 403):
        return PermissionDenied(line)
    if status == 404:
        if "matched" in more:
            from engine.operations.select import NoMatch
            return NoMatch(line, more["matched"], more.get("result"))
        return NoSuch(line, result=more.get("result"))
    return ApiError(line, status, more)


class ApiClient:
    """The API of a cluster at any of ``urls``, as one holder of ``token``."""

    def __init__(self, urls: list[str], token: str, cacert: str | None = None):
        import requests
        if not urls:
            raise UsageError("no API URL given")
        self.urls = [url.rstrip("/") for url in urls]
        self.token = token
        self.cacert = cacert
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers["Peerctl-Wording"] = "command-line"    # its errors name flags
        self.session.verify = cacert or True
        self.url = self.urls[0]         # the peer that answered last

    def _order(self) -> list[str]:
        return [self.url] + [url for url in self.urls if url != self.url]

    def call(self, method: str, path: str, body=None, query: dict | None = None,
             raw: bytes | None = None, content_type: str | None = None,
             timeout: float = READ_TIMEOUT):
        """The answer's JSON document, or the error it stands for."""
        response = self.request(method, path, body, query, raw, content_type, timeout)
        doc = _json(response)
        if response.status_code >= 400:
            raise _refusal(response.status_code, doc if isinstance(doc, dict) else {},
                           self.url)
        return doc

    def request(self, method: str, path: str, body=None, query: dict | None = None,
                raw: bytes | None = None, content_type: str | None = None,
                timeout: float = READ_TIMEOUT, stream: bool = False,
                headers: dict | None = None):
        """The raw response of the first peer that answers (not 503)."""
        import requests
        why = []
        headers = {**(headers or {}), **({"Content-Type": content_type} if content_type else {})}
        for url in self._order():
            try:
                response = self.session.request(
                    method, url + path, params=_params(query),
                    json=body if raw is None else None, data=raw, headers=headers,
                    timeout=(CONNECT_TIMEOUT, timeout), stream=stream)
            except requests.exceptions.SSLError as exc:
                why.append(f"{url}: {_tls_why(exc)}")
                continue
            except requests.exceptions.ConnectionError as exc:
                why.append(f"{url}: {_why(exc)}")
                continue
            except requests.exceptions.Timeout:
                why.append(f"{url}: no answer in time")
                if method != "GET":         # it may have been received: never sent twice
                    break
                continue
            if response.status_code == 503:
                said = _json(response)
                error = said.get("error") if isinstance(said, dict) else None
                why.append(f"{url}: {error or 'unavailable'}")
                continue
            self.url = url
            return response
        raise NoPeerAnswered("no peer answered: " + "; ".join(why))

    def events(self, last_event_id: int | None = None, read_timeout: float = 60.0):
        """Each server-sent event of ``/v1/events`` as ``(id, event, doc)``,
        from ``last_event_id`` on (else from a ``hello`` event); ends when the
        stream does, or when nothing came for ``read_timeout`` seconds
        (heartbeats come every 15)."""
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else None
        response = self.request("GET", "/v1/events", timeout=read_timeout, stream=True,
                                headers=headers)
        if response.status_code != 200:
            doc = _json(response)
            raise _refusal(response.status_code, doc if isinstance(doc, dict) else {},
                           self.url)
        yield from _sse(response)


def _sse(response):
    event, data, ident = "message", [], None
    try:
        for line in response.iter_lines(decode_unicode=True):
            if line is None:
                continue
            if line == "":
                if data:
                    try:
                        doc = json.loads("\n".join(data))
                    except ValueError:
                        doc = {}
                    yield (int(ident) if ident and ident.isdigit() else None), event, doc
                event, data, ident = "message", [], None
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "data":
                    data.append(value)
                elif name == "event":
                    event = value
                elif name == "id":
                    ident = value
    except Exception:       # the stream broke: the caller resumes from the last id
        return
    finally:
        response.close()


def _params(query: dict | None):
    if not query:
        return None
    params = []
    for name, value in query.items():
        for one in value if isinstance(value, (list, tuple)) else [value]:
            if one is None or one is False:
                continue
            params.append((name, "true" if one is True else str(one)))
    return params


def _json(response):
    try:
        return response.json()
    except ValueError:
        return {"error": (response.text.strip().splitlines() or [""])[0][:200]}


def _why(exc: BaseException) -> str:
    """The socket's own words: ``Connection refused``, ``Name or service not known``."""
    text = str(exc)
    for cause in (getattr(exc, "__context__", None), *getattr(exc, "args", ())):
        reason = getattr(cause, "reason", None)
        if reason is not None:
            text = str(reason)
    for marker in ("Errno", "]"):
        if marker in text:
            text = text.split(marker)[-1]
    return text.strip(" :')\"") or "no answer"


def _tls_why(exc) -> str:
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text or isinstance(exc, ssl.SSLCertVerificationError):
        return "its certificate does not verify (--cacert: the cluster's CA)"
    return "TLS failed"
