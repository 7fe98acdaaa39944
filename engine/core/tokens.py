"""Bearer tokens of the HTTP API: ``tokens/<id>`` in the cluster's keyspace.

A token gives whoever holds its secret one role of :mod:`engine.core.auth`,
``viewer`` or ``operator``, until it expires or is deleted.  Promises:

- the secret is shown once, by :func:`create`; etcd keeps only its sha256
  (``{id, role, hash, created, expires}``, epoch seconds, ``expires`` None
  for never), so a reader of the keyspace (a viewer) cannot use a token;
- a secret names its token (``pct_<id>_<43 url-safe characters>``), so
  :func:`verify` is one get by id and a constant-time compare of hashes;
- :func:`verify` never raises for a bad secret (malformed, unknown, wrong,
  expired, deleted, or a garbled record): it answers None.  Only etcd being
  unreachable or refusing raises, as for every read;
- :func:`delete` deletes every token named, or none of them;
- a token made with a ``lease`` (a console's, :mod:`engine.operations.consoles`)
  is deleted by etcd when its lease ends; :func:`renew` moves its expiry
  on, and never brings back a token deleted meanwhile.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import time

from engine.errors import Conflict, NoSuch, UsageError

from . import keys
from .store import Delete, Put, absent, modified_at
from .values import declare, readable, shape

__all__ = ["TOKEN_ROLES", "TOKEN", "MAX_EXPIRY", "check_role", "check_expiry", "create",
           "renew", "list_tokens", "delete", "verify", "live"]

TOKEN_ROLES = ("viewer", "operator")
MAX_EXPIRY = 100 * 365 * 86400.0        # longer is a typo, not an expiry: use none

_SECRET = re.compile(r"pct_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_ID = re.compile(r"[^/\s]{1,64}")       # what delete accepts: any key's last part
_LAST_TIME = 253402300799.0     # 9999-12-31T23:59:59Z: a later time has no ISO date


def _check(record: dict) -> str | None:
    if record["role"] not in TOKEN_ROLES:
        return f"role {record['role']!r}"
    if not re.fullmatch(r"[0-9a-f]{64}", record["hash"]):
        return "hash is no sha256"
    for field in ("created", "expires"):
        t = record[field]
        if t is not None and not (math.isfinite(t) and 0 <= t <= _LAST_TIME):
            return f"{field} {t!r} is no time"
    return None


TOKEN = shape("API token", _check, id=str, role=str, hash=str, created=(int, float),
              expires=(int, float, type(None)))
declare(keys.token() + "*", TOKEN)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _iso(t: float | None) -> str | None:
    """Epoch seconds as ``2026-12-01T08:00:00Z``; None as None (never)."""
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _shown(record: dict) -> dict:
    return {"id": record["id"], "role": record["role"], "created": _iso(record["created"]),
            "expires": _iso(record["expires"])}


def check_role(role) -> str:
    if role not in TOKEN_ROLES:
        raise UsageError(f"bad token role {role!r} (want {' or '.join(TOKEN_ROLES)})")
    return role


def check_expiry(expires_in) -> float | None:
    """Seconds from now, more than 0 and at most :data:`MAX_EXPIRY`; None: never."""
    if expires_in is None:
        return None
    if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) \
            or not math.isfinite(expires_in) or not 0 < expires_in <= MAX_EXPIRY:
        raise UsageError(f"bad token expiry {expires_in!r} (want more than 0s and at most "
                         f"{MAX_EXPIRY / 86400:g}d)")
    return float(expires_in)


def create(store, role: str, expires_in: float | None = None, lease: int = 0) -> dict:
    """A new token of ``role`` expiring ``expires_in`` seconds from now (None:
    never), bound to etcd lease ``lease`` when given: ``{id, role, created,
    expires, secret}``, times ISO 8601 UTC.  The only place its secret is
    ever seen."""
    role, expires_in = check_role(role), check_expiry(expires_in)
    for _ in range(10):         # 48 random bits: a clash is rare, and refused
        token_id = secrets.token_hex(6)
        secret = f"pct_{token_id}_{secrets.token_urlsafe(32)}"
        now = time.time()
        record = {"id": token_id, "role": role, "hash": _hash(secret), "created": now,
                  "expires": None if expires_in is None else now + expires_in}
        if store.txn([absent(keys.token(token_id))],
                     [Put(keys.token(token_id), record, lease)]).succeeded:
            return dict(_shown(record), secret=secret)
    raise Conflict("no free token id after 10 tries: try again")


def renew(store, token_id: str, expires_in: float) -> bool:
    """Move token ``token_id``'s expiry to ``expires_in`` seconds from now,
    keeping its lease; False when it is gone (deleted, expired, garbled)."""
    for _ in range(10):
        kv = store.get(keys.token(token_id))
        record = live(kv, token_id)
        if record is None:
            return False
        record = dict(record, expires=time.time() + check_expiry(expires_in))
        if store.txn([modified_at(kv.key, kv.mod_revision)],
                     [Put(kv.key, record, kv.lease)]).succeeded:
            return True
    raise Conflict(f"token {token_id} kept changing under its renewal: try again")


def list_tokens(store) -> list[dict]:
    """Every readable token, oldest first: ``{id, role, created, expires}``
    (never its hash); an unreadable record is reported and skipped."""
    records = [record for record in (readable(kv) for kv in store.range(keys.token())[0])
               if record is not None]
    return [_shown(record) for record in sorted(records, key=lambda r: r["created"])]


def delete(store, ids) -> list:
    """Delete the tokens ``ids`` (each once), all of them or, when one is
    unknown, none (``NoSuch`` naming it); the ids deleted.  A garbled record
    is deleted like any other."""
    if isinstance(ids, str) or not ids:
        raise UsageError("name the tokens to delete by their ids (see token list)")
    chosen = []
    for token_id in ids:
        if not isinstance(token_id, str) or not _ID.fullmatch(token_id):
            raise UsageError(f"bad token id {token_id!r}")
        if token_id not in chosen:
            chosen.append(token_id)
    for _ in range(10):
        found = {token_id: store.get(keys.token(token_id)) for token_id in chosen}
        unknown = [token_id for token_id, kv in found.items() if kv is None]
        if unknown:
            raise NoSuch(f"no token {', '.join(unknown)} (see token list); nothing deleted")
        guards = [modified_at(kv.key, kv.mod_revision) for kv in found.values()]
        if store.txn(guards, [Delete(kv.key) for kv in found.values()]).succeeded:
            return chosen
    raise Conflict("the tokens kept changing under this delete: try again")


def verify(store, secret) -> dict | None:
    """``{id, role, expires}`` (``expires`` epoch seconds or None) of the
    unexpired token whose secret is ``secret``; None for any other secret."""
    match = _SECRET.fullmatch(secret) if isinstance(secret, str) else None
    if match is None:
        return None
    token_id = match.group(1)
    record = live(store.get(keys.token(token_id)), token_id)
    if record is None or not hmac.compare_digest(record["hash"], _hash(secret)):
        return None
    return {"id": token_id, "role": record["role"], "expires": record["expires"]}


def live(kv, token_id: str) -> dict | None:
    """The record of token ``token_id`` read as ``kv``, if it is readable,
    is that token's and has not expired; else None."""
    record = readable(kv)
    if record is None or record["id"] != token_id:
        return None
    if record["expires"] is not None and record["expires"] <= time.time():
        return None
    return record
