"""What a request handler gets to work with on its host: its name, its
libvirt connection (opened on first use), the cluster's store and the
host's settings (networks offered, backup pool, reserved); and the
check that a libvirt URI is one libvirt accepts at all."""
from __future__ import annotations

import os
import threading
import urllib.parse
from dataclasses import dataclass, field

import structlog

from engine.errors import UsageError

__all__ = ["HostContext", "check_libvirt_uri"]

log = structlog.get_logger("peerctl.hostctx")


@dataclass
class HostContext:
    host: str
    libvirt_uri: str
    store: "object"                 # engine.core.store.Store of the cluster
    # The host's state directory (the disk pool, the image cache, the
    # guard's heartbeat, the releases): always named by the peer, which
    # chose it (engine/commandline/peer_host.py); no default under /tmp.
    state_dir: str
    # The networks this host offers, as configured: {name: {kind, source}}
    # (engine.hypervisor.domain.networks.parse_offer).
    offer: dict = field(default_factory=dict)
    # The libvirt storage pool backups of other hosts' VMs land in; None:
    # a dir pool under the state directory (engine.hypervisor.data.backups).
    backup_pool: str | None = None
    # What the operator keeps back from placement on top of the foreign
    # domains, {RC: amount} (the peer's reserved setting;
    # engine.hypervisor.host.accounting).
    reserved: dict = field(default_factory=dict)
    # Asks the peer to hand this host over to another release
    # (engine/releases/handover.py): replace({choice, deadline, automation})
    # -> False if one is under way already.  None outside a peer.
    replace: object = field(default=None, repr=False)
    # The URI other hosts reach this libvirt by (migrations, copies,
    # consoles); "" = libvirt_uri, which only this machine reaches.
    libvirt_remote: str = ""
    # Where QEMU's incoming migration streams arrive, as published:
    # {migration_address, migration_ports: [first, last]} (reachability.migration_of).
    migration: dict | None = None
    _conn: object = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def remote_uri(self) -> str:
        """What another host opens to reach this host's libvirt."""
        return self.libvirt_remote or self.libvirt_uri

    def is_me(self, uri: str) -> bool:
        """``uri``, as a record or a step gave it, names this host's libvirt."""
        return uri in (self.libvirt_uri, self.remote_uri)

    @property
    def conn(self):
        """The host's libvirt connection, opened on first use (thread-safe)."""
        with self._lock:
            if self._conn is None or not self._conn.isAlive():
                import libvirt
                self._conn = libvirt.open(self.libvirt_uri)
            return self._conn


def check_libvirt_uri(uri: str) -> None:
    """Raise :class:`~engine.errors.UsageError` if libvirt rejects ``uri`` outright (no
    driver for its scheme, unparsable, a test driver file it cannot read).
    A hypervisor that is merely unreachable now (daemon down, host away,
    connection refused) is not an error: the peer still runs, a live peer
    that says so in its host record, and uses libvirt once it answers."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "test" and parsed.path not in ("", "/default") \
            and not os.access(parsed.path, os.R_OK):
        # libvirt would say so too, after libxml2 printed a line of its own
        raise UsageError(f"libvirt rejects --libvirt {uri!r}: test driver file "
                         f"{parsed.path} cannot be read")
    try:
        import libvirt
    except ImportError:
        return
    unreachable = {getattr(libvirt, name, None) for name in (
        "VIR_ERR_SYSTEM_ERROR", "VIR_ERR_RPC", "VIR_ERR_OPERATION_TIMEOUT",
        "VIR_ERR_AUTH_FAILED", "VIR_ERR_AUTH_CANCELLED", "VIR_ERR_AUTH_UNAVAILABLE")} - {None}
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)    # no stray stderr lines
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() in unreachable or \
                exc.get_error_domain() == getattr(libvirt, "VIR_FROM_RPC", -1):
            log.warning("libvirt_unreachable", uri=uri, error=str(exc))
            return
        raise UsageError(f"libvirt rejects --libvirt {uri!r}: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") \
            from None
    conn.close()
