"""What a failed gRPC call to etcd means, in peerctl's errors.

:class:`~engine.core.store.Store` hands every ``grpc.RpcError`` here and
raises what comes back.

Promises:
- etcd's refusal of this identity (a role without the permission, a user
  it does not know, a client certificate it does not accept) is a
  :class:`PermissionDenied` naming the role; an ``https://`` endpoint that
  does not speak TLS is a :class:`UsageError` naming the endpoint;
- a broken TLS handshake is a refusal only while etcd never answered this
  store (``answered``); after that it is etcd restarting, and on
  ``http://`` it is never one: both are etcd unreachable;
- an answer of etcd's own (no space, a request too large) is told apart
  (:meth:`Failures.is_answer`): it is not failed over;
- a request that never left this process (:meth:`Failures.unsent`: no
  connection, or a handshake that broke off) may be sent to another member;
- etcd unreachable is a :class:`StoreUnavailable` whose ``timed_out`` says
  how long etcd had when it was reached and kept silent: a call's timeout,
  or :data:`CONNECT_WITHIN` for a new connection.
"""
from __future__ import annotations

import grpc

from engine.errors import PermissionDenied, StoreUnavailable, UsageError

__all__ = ["CONNECT_WITHIN", "Failures"]

# A new connection has this long to be answered (etcd's HTTP/2 SETTINGS).
# gRPC takes it from "min_reconnect_backoff": at 100 ms, an etcd on a busy
# machine missed it and a command said "unreachable" at once.  Below the
# call's timeout, so that a member that takes no connection is failed over
# within the call, as one that refuses it is.
CONNECT_WITHIN = 3.0

_ANSWERS = {"RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "FAILED_PRECONDITION",
            "OUT_OF_RANGE", "ALREADY_EXISTS"}
_DENIED = ("permission denied", "user name is empty", "user name not found",
           "invalid auth token", "authentication failed", "not capable")
_HANDSHAKE = ("SSL", "TSI_", "andshake", "certificate")
# A TLS handshake that met no TLS at all: the endpoint answered in plain
# bytes (OpenSSL's WRONG_VERSION_NUMBER) or closed before any reply (a
# plain http etcd drops what it cannot parse).  A TLS etcd refusing a
# certificate answers with an alert, or breaks the first read after the
# handshake (TSI_DATA_CORRUPTED).
# Only before etcd ever answered: a TLS etcd that once did and now breaks
# a handshake (a member restarting resets it: "Handshake read failed
# (... Connection reset by peer)", "(Endpoint closing)") is unreachable
# for a while, neither misnamed nor a refusal of this identity: callers
# retry, and a peer never exits for it.
_NO_TLS = ("WRONG_VERSION_NUMBER", "wrong version number", "Handshake read failed")


def _code(exc):
    return exc.code() if hasattr(exc, "code") else None


def _details(exc) -> str:
    return (exc.details() if hasattr(exc, "details") else "") or ""


class Failures:
    """The reading of one store's failed calls: its ``endpoints``, whether
    they are ``secure`` (https), its ``credentials`` and call ``timeout``;
    ``answered`` is set once any member answered it."""

    def __init__(self, endpoints: str, secure: bool, credentials, timeout: float):
        self.endpoints, self.secure = endpoints, secure
        self.credentials, self.timeout = credentials, timeout
        self.answered = False

    @staticmethod
    def is_answer(code) -> bool:
        """etcd answered and said no (nothing to fail over for)."""
        return code is not None and code.name in _ANSWERS

    @staticmethod
    def handshake(exc) -> bool:
        """A TLS handshake that broke off: nothing was sent over it."""
        return _code(exc) == grpc.StatusCode.UNAVAILABLE and any(
            part in _details(exc) for part in _HANDSHAKE)

    @classmethod
    def unsent(cls, exc) -> bool:
        """The request never left this process."""
        details = _details(exc)
        return "failed to connect" in details or "Connection refused" in details \
            or cls.handshake(exc)

    def unavailable(self, exc) -> StoreUnavailable:
        """etcd not answering ``exc``, with how long it had when it was
        reached and kept silent."""
        unavailable = StoreUnavailable(self.why(exc))
        if _code(exc) == grpc.StatusCode.DEADLINE_EXCEEDED:
            unavailable.timed_out = self.timeout
        elif _code(exc) == grpc.StatusCode.UNAVAILABLE \
                and "before receiving SETTINGS" in _details(exc):
            unavailable.timed_out = CONNECT_WITHIN
        return unavailable

    def why(self, exc) -> str:
        if isinstance(exc, grpc.RpcError) and self.secure and self.handshake(exc):
            return (f"etcd at {self.endpoints} unreachable (a TLS handshake broke off; "
                    "etcd accepted this certificate before: restarting?)")
        return f"etcd at {self.endpoints} unreachable ({type(exc).__name__})"

    def refusal(self, exc) -> PermissionDenied | UsageError | None:
        """etcd's refusal of this identity, as one line naming the role; an
        ``https://`` endpoint that does not speak TLS, as the bad setting it
        is (naming the endpoint: waiting will not mend it); None for any
        other failure (see the module's promises on broken handshakes)."""
        code, details = _code(exc), _details(exc)
        role = self.credentials.role
        if self.secure and code == grpc.StatusCode.UNAVAILABLE and not self.answered \
                and any(part in details for part in _NO_TLS):
            plain = self.endpoints.replace("https://", "http://")
            return UsageError(f"etcd at {self.endpoints} does not speak TLS "
                              f"(a plain etcd is reached as {plain})")
        if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED) \
                or any(part in details for part in _DENIED):
            if role is None:
                return PermissionDenied(
                    f"permission denied: etcd at {self.endpoints} wants an identity "
                    "(a client certificate: --cert/--key)", role)
            why = details.removeprefix("etcdserver: ")
            return PermissionDenied(f"permission denied for role {role}: etcd said {why!r} "
                                    f"(certificate {self.credentials.cert})", role)
        if self.secure and self.handshake(exc) and not self.answered:
            if not self.credentials.cert:
                return PermissionDenied(
                    f"permission denied: etcd at {self.endpoints} refused the connection "
                    "without a client certificate (give --cert and --key)", None)
            return PermissionDenied(
                f"permission denied for role {role}: etcd at {self.endpoints} refused the TLS "
                f"handshake with certificate {self.credentials.cert}", role)
        return None
