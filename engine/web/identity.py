"""Who is asking, and whether a browser's write really comes from the page.

A client is one of:
- a client certificate the TLS handshake verified against the cluster's CA:
  its CN is the user and its OU the role, as for the command line
  (engine/core/certs.py);
- a bearer token (engine/core/tokens.py) in ``Authorization: Bearer
  SECRET``;
- the page's session cookie, which ``POST /v1/session`` sets from a token:
  the secret of a session of its own (engine/core/sessions.py), never the
  token's.

The API knows two rights: ``viewer`` reads, ``operator`` reads and writes;
a peer's or root's certificate counts as an operator.

A cookie and a client certificate are *ambient*: a browser sends them to
any page that asks.  A write carried by a cookie, or by a certificate from a
browser (``Origin`` or ``Sec-Fetch-Site`` present), must also bring the CSRF token
(double-submit: the ``peerctl_csrf`` cookie the page was served with, sent
back in the ``X-CSRF-Token`` header, which another site can neither read
nor set).  A bearer header is never ambient and needs none.
"""
from __future__ import annotations

import dataclasses
import hmac
import secrets
import ssl

__all__ = ["Who", "API_ROLES", "SESSION_COOKIE", "CSRF_COOKIE", "CSRF_HEADER", "RELAYED_HEADER",
           "certificate_identity", "bearer_secret", "passed_on", "csrf_ok", "new_csrf"]

API_ROLES = {"viewer": "viewer", "operator": "operator", "peer": "operator",
             "root": "operator"}
SESSION_COOKIE = "peerctl_session"
CSRF_COOKIE = "peerctl_csrf"
CSRF_HEADER = "X-CSRF-Token"
RELAYED_HEADER = "X-Peerctl-Relayed"    # a peer asking another on a caller's behalf


@dataclasses.dataclass(frozen=True)
class Who:
    user: str
    role: str               # viewer or operator
    ambient: bool           # came by cookie or client certificate: writes need CSRF
    how: str                # certificate, token, session
    token: str | None = None        # the token's id, for a token or a session
    session: str | None = None      # the session's key, for a session
    expires: float | None = None    # when it ends unless used again (epoch); None: never


def certificate_identity(request) -> Who | None:
    """The verified client certificate's user and role, if one was presented
    and names a role the API knows."""
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    from engine.core.certs import identity
    user, role = identity(ssl.DER_cert_to_PEM_cert(der).encode())
    role = API_ROLES.get(role or user or "")
    if role is None:
        return None
    return Who(user or role, role, _from_a_browser(request), "certificate")


def _from_a_browser(request) -> bool:
    """A browser marks what a page sends (``Origin`` on writes,
    ``Sec-Fetch-Site`` everywhere today); a script with a certificate does
    not, and is not asked for a CSRF token."""
    return "Origin" in request.headers or "Sec-Fetch-Site" in request.headers


def bearer_secret(request) -> tuple[str | None, bool]:
    """``(secret, ambient)``: the bearer token of the Authorization header,
    else the session cookie's (a session's secret: ambient);
    ``(None, False)`` without either."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, secret = header.partition(" ")
        if scheme.lower() == "bearer" and secret.strip():
            return secret.strip(), False
        return "", False        # present but not a bearer token: refused, not ignored
    cookie = request.cookies.get(SESSION_COOKIE)
    return (cookie, True) if cookie else (None, False)


def passed_on(request, who: Who) -> dict:
    """The headers that carry ``who``'s own credentials to another peer's
    API (identities are the cluster's, in etcd: every peer knows them): the
    bearer token, or the session cookie; ``{}`` for a client certificate,
    which cannot be passed on."""
    if who.how == "token":
        return {"Authorization": request.headers["Authorization"]}
    if who.how == "session":
        return {"Cookie": f"{SESSION_COOKIE}={request.cookies[SESSION_COOKIE]}"}
    return {}


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def csrf_ok(request) -> bool:
    """The header matches the page's CSRF cookie."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    header = request.headers.get(CSRF_HEADER, "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), header.encode())
