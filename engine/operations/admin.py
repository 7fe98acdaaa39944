"""Keeping the cluster's keyspace sound: find the keys nobody can read, and
delete them; set up etcd's roles and users (docs/security.md)."""
from __future__ import annotations

from engine.errors import UsageError

from .specs import check_name

__all__ = ["unreadable_keys", "delete_keys", "identities", "etcd_members", "libvirt_hosts",
           "setup_roles"]


def unreadable_keys(ctx) -> list:
    """Every key whose value cannot be decoded or has the wrong shape."""
    from engine.operations.scrub import find_unreadable
    return find_unreadable(ctx.store())


def delete_keys(ctx, found: list) -> list[str]:
    """Delete ``found`` (from :func:`unreadable_keys`); a key rewritten
    meanwhile is kept.  The keys deleted."""
    from engine.operations.scrub import delete_unreadable
    return delete_unreadable(ctx.store(), found)


def identities(peers: list[str] = (), users: list[str] = ()) -> dict[str, str]:
    """``{user: role}``: root, operator and viewer, ``peer-HOST`` per host
    in ``peers``, and each ``NAME:ROLE`` of ``users``."""
    from engine.core.auth import ROLES
    from engine.core.credentials import peer_user
    found = {"root": "root", "operator": "operator", "viewer": "viewer"}
    for host in peers or []:
        check_name(host, "host name")
        found[peer_user(host)] = "peer"
    for text in users or []:
        name, _, role = text.partition(":")
        try:
            check_name(name, "user name")
        except UsageError:
            role = None
        if role not in ROLES:
            raise UsageError(f"bad --user {text!r} (want NAME:ROLE, ROLE one of "
                             f"{', '.join(ROLES)})")
        found[name] = role
    return found


def etcd_members(texts: list[str] = ()) -> dict[str, str]:
    """``{member: address}`` from ``NAME=ADDR`` texts (``tls certs --member``)."""
    return _named_addresses(texts, "--member", "member")


def libvirt_hosts(texts: list[str] = ()) -> dict[str, list[str]]:
    """``{host: [address, ...]}`` from ``HOST=ADDR[,ADDR2...]`` texts (``tls
    certs --libvirt``): the address its libvirt is reached at, then any
    other it is also reached at (its migration address on another network)."""
    found = {}
    for text in texts or []:
        name, _, addresses = text.partition("=")
        found[name] = [_named_addresses([f"{name}={address}"], "--libvirt", "host",
                                        text)[name] for address in addresses.split(",")]
    return found


def _named_addresses(texts, flag: str, what: str, given: str | None = None) -> dict[str, str]:
    found = {}
    for text in texts or []:
        name, _, address = text.partition("=")
        try:
            check_name(name, f"{what} name")
        except UsageError:
            address = ""
        if not address.strip() or any(c.isspace() or c in "/,=" for c in address):
            want = "NAME=ADDR[,ADDR2]" if flag == "--libvirt" else "NAME=ADDR"
            raise UsageError(f"bad {flag} {given or text!r} (want {want}: the {what}'s name "
                             "and the address or DNS name it is reached at)")
        found[name] = address
    return found


def setup_roles(ctx, users: dict[str, str]) -> dict:
    """As etcd's root: roles on this cluster's keys, the users, auth on."""
    from engine.core import auth
    return auth.setup(ctx.store(), users)
