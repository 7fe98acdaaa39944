"""Sessions of the page: ``sessions/<token id>/<sha256>`` in the cluster's keyspace.

Logging in with a token's secret (``POST /v1/session``) makes a session of
its own: the page's cookie holds the session's secret, never the token's.
Promises:

- the secret (``pcs_<token id>_<43 url-safe characters>``) is given once,
  by :func:`create`; etcd keeps only its sha256, as the key's last part, so
  a reader of the keyspace (a viewer) cannot use a session;
- a session is ``{token, token_created, created, used, idle, expires}``
  (epoch seconds; ``idle`` seconds): it is refused once ``used + idle`` or
  ``expires`` has passed, or once its token is deleted or expired (a token
  made again under the same id does not revive it: ``token_created``
  must match).  Its limits are fixed at login, so every API server agrees;
- :func:`verify` refreshes ``used`` at most once per :func:`refresh_every`
  (a minute, or a tenth of ``idle`` when shorter), guarded by the
  session's revision, so that a refresh never brings back a session that
  was deleted meanwhile;
- the key holds an etcd lease of its absolute lifetime: etcd deletes a
  session nobody logged out of once it can no longer be used;
- :func:`verify` and :func:`state` never raise for a bad secret or key:
  they answer None.  Only etcd being unreachable or refusing raises.
"""
from __future__ import annotations

import hashlib
import math
import re
import secrets
import time

from engine.errors import PeerctlError

from . import keys, tokens
from .store import Compare, Delete, Get, Put, absent, modified_at
from .values import declare, readable, shape

__all__ = ["SESSION", "IDLE", "LIFETIME", "refresh_every", "create", "verify", "state",
           "delete", "delete_of_token"]

IDLE = 12 * 3600.0              # seconds without a request before a session ends
LIFETIME = 7 * 86400.0          # seconds from login after which it ends anyway
_REFRESH = 60.0
_SECRET = re.compile(r"pcs_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")


def _check(record: dict) -> str | None:
    for field in ("token_created", "created", "used", "idle", "expires"):
        if not (math.isfinite(record[field]) and record[field] >= 0):
            return f"{field} {record[field]!r} is no time"
    return None


_TIME = (int, float)
SESSION = shape("page session", _check, token=str, token_created=_TIME, created=_TIME,
                used=_TIME, idle=_TIME, expires=_TIME)
declare(keys.session() + "*", SESSION)


def refresh_every(idle: float) -> float:
    """How stale ``used`` may get before a request writes it again."""
    return min(_REFRESH, idle / 10)


def _key(secret) -> str | None:
    match = _SECRET.fullmatch(secret) if isinstance(secret, str) else None
    if match is None:
        return None
    return keys.session(match.group(1), hashlib.sha256(secret.encode()).hexdigest())


def create(store, token_secret: str, idle: float = IDLE, lifetime: float = LIFETIME):
    """A new session of the live token whose secret is ``token_secret``:
    ``(secret, {id, role, expires, session})``, or None for any other secret.
    It ends ``lifetime`` seconds from now at the latest (sooner if the token
    expires sooner), or after ``idle`` seconds without a request."""
    token = tokens.verify(store, token_secret)
    if token is None:
        return None
    token = tokens.live(store.get(keys.token(token["id"])), token["id"])
    if token is None:
        return None
    now = time.time()
    expires = now + lifetime
    if token["expires"] is not None:
        expires = min(expires, token["expires"])
    record = {"token": token["id"], "token_created": token["created"], "created": now,
              "used": now, "idle": float(idle), "expires": expires}
    lease = store.grant(max(1, math.ceil(expires - now) + 1))
    secret = f"pcs_{token['id']}_{secrets.token_urlsafe(32)}"
    key = _key(secret)
    still = Compare(keys.token(token["id"]), "version", ">", 0)     # not deleted meanwhile
    if not store.txn([absent(key), still], [Put(key, record, lease)]).succeeded:
        store.revoke(lease)
        return None
    return secret, {"id": token["id"], "role": token["role"], "session": key,
                    "expires": min(expires, now + idle)}


def verify(store, secret) -> dict | None:
    """``{id, role, expires, session}`` of the live session whose secret is
    ``secret`` (``id`` its token's, ``expires`` when it ends unless used
    again, ``session`` its key); None for any other secret.  A request: it
    refreshes ``used`` when stale."""
    key = _key(secret)
    return None if key is None else _alive(store, key, touch=True)


def state(store, key: str) -> dict | None:
    """What :func:`verify` answers for the session at ``key``, without
    counting as a use of it."""
    return _alive(store, key, touch=False)


def _alive(store, key: str, touch: bool) -> dict | None:
    parts = key.split("/")
    if len(parts) != 3 or not key.startswith(keys.session()):
        return None
    token_id = parts[1]
    got = store.txn([], [Get(key), Get(keys.token(token_id))]).ranges
    session_kv = got[0][0] if got[0] else None
    session = readable(session_kv)
    token = tokens.live(got[1][0] if got[1] else None, token_id)
    if session is None or token is None or session["token"] != token_id \
            or session["token_created"] != token["created"]:
        return None
    now = time.time()
    guard = [modified_at(key, session_kv.mod_revision)]
    if now >= min(session["used"] + session["idle"], session["expires"]):
        _best_effort(store, guard, Delete(key))
        return None
    if touch and now - session["used"] >= refresh_every(session["idle"]):
        if _best_effort(store, guard, Put(key, dict(session, used=now), session_kv.lease)):
            session = dict(session, used=now)
    ends = min(session["used"] + session["idle"], session["expires"])
    if token["expires"] is not None:
        ends = min(ends, token["expires"])
    return {"id": token_id, "role": token["role"], "expires": ends, "session": key}


def _best_effort(store, guard, op) -> bool:
    """Tidying that a read may do: refused or lost, the read still answers."""
    try:
        return store.txn(guard, [op]).succeeded
    except PeerctlError:
        return False


def delete(store, secret) -> bool:
    """Log out: delete the session whose secret is ``secret``; whether there
    was one."""
    key = _key(secret)
    return key is not None and store.delete(key) > 0


def delete_of_token(store, token_id: str) -> int:
    """Delete every session of token ``token_id`` (its token is gone); how many."""
    return store.delete(keys.session(token_id), prefix=True)
