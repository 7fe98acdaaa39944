"""The cluster's side of a join: ``host add`` admits a host by a one-time
token, and a peer's API redeems it (``POST /v1/join``).

:func:`add_host`, run with the cluster's CA directory and etcd's root,
makes everything the new host needs (its etcd user ``peer-<host>`` with the
``peer`` role, its peer certificate, and with an address libvirt's
certificates) and keeps in etcd only ``joins/<id>``: the sha256 of the
token's proof, its expiry, and the bundle sealed with a key only the token
derives (:mod:`engine.core.join_tokens`).  The token is returned once.

:func:`redeem` hands the sealed bundle over once: the record is deleted by
a transaction that checks it is still the one that was read (its mod
revision), so two machines redeeming one token cannot both succeed.

Promises: every refusal (a bad name or address, a host the cluster has
already, no CA key, not etcd's root) is raised before anything is written;
a wrong proof, an expired or used token writes nothing.  A second
``host add`` of the same host replaces its earlier token.
"""
from __future__ import annotations

import os
import re
import time

from engine.core import join_tokens, keys
from engine.core.store import Delete, Put, modified_at
from engine.core.values import readable
from engine.errors import NoSuch, Refused, UsageError

from .specs import check_name

__all__ = ["add_host", "redeem", "unredeemed", "DEFAULT_EXPIRY", "libvirt_remote_of"]

DEFAULT_EXPIRY = 3600.0
_KEEP_AFTER_EXPIRY = 600        # seconds a record outlives its expiry (says "expired")
_ADDRESS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")


def libvirt_remote_of(address: str) -> str:
    """The URI other hosts reach a host's libvirt by, from its address."""
    return f"qemu+tls://{f'[{address}]' if ':' in address else address}/system"


def _checked(name: str, address: str | None, expires: float, ca_dir: str, via: list[str],
             etcd: str) -> None:
    check_name(name, "host name")
    if address is not None and not _ADDRESS.match(address):
        raise UsageError(f"bad --address {address!r} (an IP address or DNS name other hosts "
                         "reach this one at)")
    if not 0 < expires <= 7 * 86400:
        raise UsageError(f"bad --expires {expires:g} s (want more than 0, at most 7d)")
    if not all(url.startswith("https://") for url in etcd.split(",")):
        raise UsageError(f"host add needs an etcd over TLS with roles (https://, "
                         f"docs/security.md); etcd is {etcd}")
    for name_ in ("ca.pem", "ca-key.pem"):
        if not os.path.isfile(os.path.join(ca_dir, name_)):
            raise UsageError(f"host add needs the cluster's CA: no {name_} in {ca_dir} "
                             "(--ca-dir DIR, default the directory of --cacert)")
    if not via:
        raise UsageError("host add needs a peer API the new machine reaches over HTTPS "
                         "(--api https://ADDR:PORT, repeatable)")
    for url in via:
        if not url.startswith("https://") or any(c.isspace() for c in url):
            raise UsageError(f"bad --api {url!r} (want https://ADDR:PORT: a peer's API "
                             "served with api_cert and api_key)")


def add_host(ctx, name: str, *, address: str | None = None,
             expires: float = DEFAULT_EXPIRY, ca_dir: str, via: list[str]) -> dict:
    """Admit host ``name``: ``{host, token, expires, address, libvirt_remote}``."""
    from engine.core import auth, certs
    from engine.core.credentials import peer_user
    store = ctx.store()
    _checked(name, address, expires, ca_dir, via, store.endpoints)
    if store.get(keys.host_config(name)) is not None or store.get(keys.host(name)) is not None:
        raise UsageError(f"host {name} is already in the cluster (hostlist shows it; "
                         f"host remove {name} first to add a machine under that name again)")
    user = peer_user(name)
    auth.setup(store, {user: "peer"})    # as root: refused here before any file is made
    from engine.core import removed
    removed.clear(store, name)          # a name removed before may join again
    try:
        issued = certs.issue(ca_dir, user, "peer")
        libvirt = certs.issue_libvirt(ca_dir, name, address) if address else None
    except OSError as exc:
        raise UsageError(f"cannot write certificates in {ca_dir}: "
                         f"{exc.strerror or exc}") from None
    bundle = {"host": name, "cluster": store.cluster, "etcd": store.endpoints,
              "ca": _read(issued.cacert), "cert": _read(issued.cert), "key": _read(issued.key),
              # libvirt's files, and QEMU's for the migration streams' TLS
              "libvirt": ({file: _read(os.path.join(ca_dir, "libvirt", name, file))
                           for file in [*certs.LIBVIRT_FILES,
                                        *(f"qemu/{q}" for q in certs.QEMU_FILES)]}
                          if libvirt else {}),
              "libvirt_remote": libvirt_remote_of(address) if address else ""}
    token = join_tokens.new(store.cluster, store.endpoints, via,
                            join_tokens.fingerprint(bundle["ca"].encode()))
    now = time.time()
    record = {"id": token.id, "host": name, "created": now, "expires": now + expires,
              "check": join_tokens.check_of(join_tokens.proof_of(token)),
              "sealed": join_tokens.seal(token, bundle)}
    earlier = unredeemed(store, name)
    lease = store.grant(int(expires) + _KEEP_AFTER_EXPIRY)     # gone by itself, unused
    store.txn([], [*(Delete(key) for key in earlier),
                   Put(keys.join(token.id), record, lease)])
    return {"host": name, "token": token.text(), "expires": record["expires"],
            "address": address, "libvirt_remote": bundle["libvirt_remote"],
            "replaced": len(earlier)}


def unredeemed(store, host: str) -> list[str]:
    """The keys of ``host``'s join tokens not redeemed yet."""
    return [kv.key for kv in store.range(keys.join())[0]
            if (readable(kv) or {}).get("host") == host]


def redeem(store, token_id: str, proof: str) -> dict:
    """The sealed bundle of token ``token_id`` when ``proof`` is its proof:
    ``{host, sealed}``; the token is used up by this call.  NoSuch for an
    unknown or used token, Refused for a wrong proof or an expired token
    (then the record stays as it was)."""
    key = keys.join(token_id)
    kv = store.get(key)
    record = readable(kv)
    if not isinstance(record, dict) or "check" not in record:
        raise NoSuch("unknown or already used join token (host add prints a new one)")
    if not join_tokens.proof_matches(proof, record["check"]):
        raise Refused("join token refused: its secret does not match (a forged or altered "
                      "token)")
    if record["expires"] < time.time():
        raise Refused(f"join token for {record['host']} expired at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(record['expires']))}"
                      f" (host add {record['host']} prints a new one)")
    if not store.txn([modified_at(key, kv.mod_revision)], [Delete(key)]).succeeded:
        raise NoSuch("unknown or already used join token (host add prints a new one)")
    return {"host": record["host"], "sealed": record["sealed"]}


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()
