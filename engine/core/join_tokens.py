"""One-time join tokens: what ``host add`` prints and ``join`` redeems.

A token is compact text, ``pcj1_`` then base64url (no padding) of a JSON
object: the cluster's name, its etcd endpoints, the peer APIs (HTTPS) the
new machine redeems it through, the sha256 of the cluster CA's certificate
(DER), the token's id and its secret (32 random bytes).

From the secret two values are derived (HKDF-SHA256), so the secret itself
never leaves the new machine:

- the *proof* it shows a peer's API to redeem the token; the cluster keeps
  only the proof's sha256 (:func:`check_of`), never the proof nor the secret;
- the *key* sealing the bundle the new host receives (its certificate, key,
  and what its config names): AES-256-GCM with the token's id as associated
  data, so the bundle kept in etcd reads as noise to anyone without the
  token, and a bundle of another token, or altered, does not open.

Promises: :func:`parse` turns any text that is not a whole, well-formed
token into one :class:`~engine.errors.UsageError` line ("bad join token:
..."); nothing here touches etcd or the disk.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass

from engine.errors import UsageError

__all__ = ["PREFIX", "Token", "new", "parse", "proof_of", "check_of", "proof_matches", "seal",
           "unseal", "fingerprint", "Unsealable"]

PREFIX = "pcj1_"
_SECRET_BYTES = 32


class Unsealable(Exception):
    """A sealed bundle that this token's key does not open."""


@dataclass(frozen=True)
class Token:
    cluster: str
    etcd: str               # endpoints, comma-separated
    via: tuple              # peer API URLs (https://...)
    ca: str                 # sha256 of the CA certificate's DER, hex
    id: str
    secret: bytes

    def text(self) -> str:
        body = {"c": self.cluster, "e": self.etcd, "v": list(self.via), "f": self.ca,
                "i": self.id, "s": _b64(self.secret)}
        return PREFIX + _b64(json.dumps(body, separators=(",", ":")).encode())


def new(cluster: str, etcd: str, via: list[str], ca_fingerprint: str) -> Token:
    """A fresh token (a new id and secret)."""
    return Token(cluster, etcd, tuple(via), ca_fingerprint, secrets.token_hex(8),
                 secrets.token_bytes(_SECRET_BYTES))


def parse(text: str) -> Token:
    """The token ``text`` spells; UsageError for anything else."""
    text = (text or "").strip()
    if not text.startswith(PREFIX):
        raise UsageError(f"bad join token: it does not start with {PREFIX} (copy the whole "
                         "line host add printed)")
    try:
        body = json.loads(_unb64(text[len(PREFIX):]))
        token = Token(body["c"], body["e"], tuple(body["v"]), body["f"], body["i"],
                      _unb64(body["s"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise UsageError("bad join token: it is truncated or garbled (copy the whole line "
                         "host add printed)") from None
    if not (all(isinstance(v, str) and v for v in (token.cluster, token.etcd, token.id,
                                                   token.ca))
            and token.via and all(isinstance(url, str) and url.startswith("https://")
                                  for url in token.via)
            and len(token.secret) == _SECRET_BYTES and len(token.ca) == 64):
        raise UsageError("bad join token: it is truncated or garbled (copy the whole line "
                         "host add printed)")
    return token


def _derive(secret: bytes, purpose: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"peerctl join " + purpose).derive(secret)


def proof_of(token: Token) -> str:
    """What the new machine shows to redeem ``token`` (hex)."""
    return _derive(token.secret, b"proof").hex()


def check_of(proof: str) -> str:
    """What the cluster keeps to recognise a proof: its sha256 (hex)."""
    return hashlib.sha256(proof.encode()).hexdigest()


def proof_matches(proof: str, check: str) -> bool:
    return hmac.compare_digest(check_of(proof), check)


def seal(token: Token, bundle: dict) -> str:
    """``bundle`` encrypted with the token's key (base64url text)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    nonce = os.urandom(12)
    data = AESGCM(_derive(token.secret, b"bundle")).encrypt(
        nonce, json.dumps(bundle).encode(), token.id.encode())
    return _b64(nonce + data)


def unseal(token: Token, sealed: str) -> dict:
    """The bundle :func:`seal` sealed with this token; :class:`Unsealable`
    when it was sealed by another or altered."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    try:
        raw = _unb64(sealed)
        plain = AESGCM(_derive(token.secret, b"bundle")).decrypt(raw[:12], raw[12:],
                                                                 token.id.encode())
        return json.loads(plain)
    except (InvalidTag, ValueError, TypeError):
        raise Unsealable("the bundle does not open with this token") from None


def fingerprint(ca_pem: bytes) -> str:
    """sha256 (hex) of a PEM certificate's DER: what a token pins."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    cert = x509.load_pem_x509_certificate(ca_pem)
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not isinstance(text, str):
        raise TypeError(text)
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
