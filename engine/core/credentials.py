"""Who this process is to etcd: the TLS files it presents.

A command or peer speaking to an ``https://`` etcd trusts ``cacert`` (the
system's authorities when unset) and, when etcd checks client certificates,
presents ``cert`` with its ``key``.  With etcd's authentication on, the
certificate's common name is the etcd user and its organizational unit the
role peerctl gave it (:mod:`engine.core.certs`); :attr:`Credentials.role`
reads it back so that a refusal can name the role.

Cheap to import (stdlib and ``engine.errors``); reading the files checks
them, and every problem is a :class:`~engine.errors.UsageError` naming the
file and where its name came from (``from --cert``, ``from $PEERCTL_KEY``,
``in conf/peerctl.conf``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import PermissionDenied, UsageError

__all__ = ["Credentials", "SETTINGS", "peer_user"]

SETTINGS = ("cacert", "cert", "key")     # setting names, also flags and PEERCTL_* variables
_WHAT = {"cacert": "CA certificate", "cert": "client certificate", "key": "client key"}
_PEM = {"cacert": b"-----BEGIN CERTIFICATE-----", "cert": b"-----BEGIN CERTIFICATE-----",
        "key": b"PRIVATE KEY-----"}


def peer_user(host: str) -> str:
    """The etcd user a host's peer is: its certificate's common name."""
    return f"peer-{host}"


@dataclass(frozen=True)
class Credentials:
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    sources: dict = field(default_factory=dict, compare=False)   # setting -> "from --cert"

    @classmethod
    def from_settings(cls, settings: dict, sources: dict | None = None) -> "Credentials":
        return cls(*(settings.get(name) or None for name in SETTINGS),
                   sources=dict(sources or {}))

    def __bool__(self) -> bool:
        return any((self.cacert, self.cert, self.key))

    def _where(self, name: str) -> str:
        return f" ({self.sources[name]})" if self.sources.get(name) else ""

    def _read(self, name: str) -> bytes | None:
        path = getattr(self, name)
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise UsageError(f"cannot read {_WHAT[name]} {path}{self._where(name)}: "
                             f"{exc.strerror or exc}") from None
        if _PEM[name] not in data:
            raise UsageError(f"{_WHAT[name]} {path}{self._where(name)} is not PEM "
                             f"(no {_PEM[name].decode().strip('-')} block)")
        return data

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """``(cacert, key, cert)`` as bytes, the order gRPC takes them."""
        if bool(self.cert) != bool(self.key):
            given, missing = ("cert", "key") if self.cert else ("key", "cert")
            raise UsageError(f"{_WHAT[given]} {getattr(self, given)}{self._where(given)} "
                             f"given without a {_WHAT[missing]} (--{missing}, "
                             f"$PEERCTL_{missing.upper()} or {missing} in the config file)")
        cacert, cert, key = (self._read(name) for name in SETTINGS)     # errors in this order
        return cacert, key, cert

    def identity(self) -> tuple[str | None, str | None]:
        """``(user, role)`` the client certificate names; ``(None, None)``
        without one."""
        cert = self._read("cert")
        if cert is None:
            return None, None
        from engine.core.certs import identity
        return identity(cert)

    def check_peer(self, host: str) -> None:
        """A peer runs only as the host its certificate names: a client
        certificate whose common name is not ``peer-<host>`` is refused
        (:class:`~engine.errors.PermissionDenied`, before anything is
        written).  Without a certificate there is nothing to check."""
        user, role = self.identity()
        if self.cert is None or user == peer_user(host):
            return
        raise PermissionDenied(
            f"permission denied: certificate {self.cert}{self._where('cert')} names "
            f"{user or 'no user'}, not {peer_user(host)}: a peer runs only as the host "
            f"its certificate names", role)

    @property
    def role(self) -> str | None:
        try:
            user, role = self.identity()
        except UsageError:
            return None
        return role or user
