"""A rack in a box: each host a network namespace of its own, all on one switch.

A :class:`Rack` is what a few machines and a switch are in a rack, made of
network namespaces on this machine:

- the switch, a namespace named after the rack, holds two bridges:
  ``mgmt`` (the hosts' addresses: libvirt's TLS port, QEMU's migration and
  disk streams, the peers' API) and ``vms`` (one layer-2 segment for the
  guests of every host, so a guest keeps its address when it migrates);
- host ``H`` is the namespace ``<rack>-H``, with ``eth0`` on ``mgmt`` (its
  address in the rack's /24) and ``vmlink`` on ``vms`` (no address: it
  joins the bridge of the host's guest network, :meth:`Rack.join_guests`);
- this machine joins ``mgmt`` through one more link with the rack's first
  address, :attr:`Rack.gateway`: it is where the operator's commands and etcd
  are, as an administrator's workstation and the etcd members would be.

Nothing is routed or NATed anywhere: traffic to the rack's addresses stays
inside these namespaces and this machine.  The /24 is ``10.214.N.0/24`` with
``N`` the first one no interface of this machine uses (chosen under a lock,
so racks made at once never share one); it is recorded
(:meth:`Rack.record`) and kept across restarts.

:meth:`Rack.set_link` takes a host's ``eth0`` down or up: a machine whose
cable was pulled, for partition tests.  :meth:`Rack.delete` removes what it
made; a host namespace with processes still in it (guests kept) stays, as
:func:`~engine.hypervisor.local.daemons.delete_netns` keeps it.

No virsh, no brctl: only ``ip``.
"""
from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import os
import re

from engine.errors import Failed

from .daemons import ip, delete_netns, ensure_netns, netns_exists

__all__ = ["Rack", "LIBVIRT_TLS_PORT"]

LIBVIRT_TLS_PORT = 16514        # libvirtd's own default for TLS
_PREFIX = "10.214"              # the racks' /24s: 10.214.N.0/24
_LOCK = "/run/lock/peerctl-racks.lock"
_FIRST_HOST = 10                # host i has the address .(10 + i)


class Rack:
    """Switch ``name`` and its hosts; ``subnet`` as recorded, else chosen
    free when :meth:`build` first runs."""

    def __init__(self, name: str, subnet: str | None = None):
        self.name = name
        self.subnet = subnet
        self.hosts: list[str] = []

    def __repr__(self):
        return f"Rack({self.name!r}, {self.subnet!r})"

    # -- names and addresses --------------------------------------------------------

    def netns(self, host: str) -> str:
        """The namespace of ``host``."""
        return f"{self.name}-{host}"

    @property
    def gateway(self) -> str:
        """This machine's address in the rack."""
        return str(ipaddress.ip_network(self.subnet)[1])

    def address(self, host: str) -> str:
        """``host``'s address: .11 for the first host, .12 for the second..."""
        index = self.hosts.index(host) + 1
        return str(ipaddress.ip_network(self.subnet)[_FIRST_HOST + index])

    @property
    def _uplink(self) -> str:
        """This machine's end of its link to the switch (15 bytes at most)."""
        return "pcr" + hashlib.sha1(self.name.encode()).hexdigest()[:8]

    # -- making it ------------------------------------------------------------------

    def build(self, hosts: list[str]) -> "Rack":
        """The switch, this machine's link and each of ``hosts`` on it
        (idempotent: what exists is kept)."""
        self.hosts = list(hosts)
        ensure_netns(self.name)
        for bridge in ("mgmt", "vms"):
            if not _has_link(self.name, bridge):
                ip("-n", self.name, "link", "add", bridge, "type", "bridge")
            ip("-n", self.name, "link", "set", bridge, "up")
        if _has_link(None, self._uplink) and not _has_link(self.name, "up0"):
            ip("link", "delete", self._uplink)     # left by a switch deleted before
        if not _has_link(None, self._uplink):
            with _racks_lock():
                self.subnet = self.subnet or _free_subnet()
                ip("link", "add", self._uplink, "type", "veth", "peer", "name", "up0",
                    "netns", self.name)
                ip("addr", "add", f"{self.gateway}/24", "dev", self._uplink)
        ip("link", "set", self._uplink, "up")
        ip("-n", self.name, "link", "set", "up0", "master", "mgmt", "up")
        for index, host in enumerate(self.hosts, 1):
            self._plug(host, index)
        return self

    def _plug(self, host: str, index: int) -> None:
        ns = self.netns(host)
        ensure_netns(ns)
        for inside, port, bridge in (("eth0", f"m{index}", "mgmt"),
                                     ("vmlink", f"v{index}", "vms")):
            if not _has_link(ns, inside):
                ip("-n", ns, "link", "add", inside, "type", "veth", "peer", "name", port,
                    "netns", self.name)
            ip("-n", self.name, "link", "set", port, "master", bridge, "up")
            ip("-n", ns, "link", "set", inside, "up")
        if f"{self.address(host)}/24" not in ip("-n", ns, "-4", "-o", "addr", "show", "eth0"):
            ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")

    def join_guests(self, host: str, bridge: str, make: bool) -> None:
        """Put ``host``'s ``vmlink`` in its guest bridge ``bridge``; with
        ``make``, create that bridge first (for a libvirt network in bridge
        mode, which needs one; the owner's network makes its own)."""
        ns = self.netns(host)
        if make and not _has_link(ns, bridge):
            ip("-n", ns, "link", "add", bridge, "type", "bridge", "stp_state", "0")
        if make:
            ip("-n", ns, "link", "set", bridge, "up")
        ip("-n", ns, "link", "set", "vmlink", "master", bridge)

    def libvirtd(self, host: str, base_dir: str, name: str, tls_dir: str):
        """``host``'s private libvirtd (not started), in ``base_dir/name``
        inside its namespace, listening on TLS at its address with a
        certificate of the authority in ``tls_dir`` (issued there now, or
        kept: ``tls certs --libvirt``)."""
        from engine.core import certs
        from .daemons import PrivateLibvirtd
        certs.issue_libvirt(tls_dir, host, self.address(host))
        return PrivateLibvirtd(base_dir, name, self.netns(host),
                               tls=(os.path.join(tls_dir, "libvirt", host), self.address(host),
                                    LIBVIRT_TLS_PORT))

    def set_link(self, host: str, up: bool) -> None:
        """``host``'s cable in or out: its ``eth0`` up or down."""
        ip("-n", self.netns(host), "link", "set", "eth0", "up" if up else "down")

    # -- taking it down ---------------------------------------------------------------

    def delete(self, settle: float = 0.0) -> list[str]:
        """Delete the hosts' namespaces (those with nothing left in them)
        and then, when all are gone, the switch; the namespaces kept."""
        kept = [self.netns(host) for host in self.hosts
                if not delete_netns(self.netns(host), settle)]
        if not kept and netns_exists(self.name):
            if _has_link(None, self._uplink):
                ip("link", "delete", self._uplink)     # and its end in the switch
            delete_netns(self.name, settle)
        return kept

    # -- up.json ----------------------------------------------------------------------

    def record(self) -> dict:
        return {"name": self.name, "subnet": self.subnet, "hosts": list(self.hosts),
                "gateway": self.gateway if self.subnet else None}

    @classmethod
    def from_record(cls, record: dict) -> "Rack":
        rack = cls(record["name"], record.get("subnet"))
        rack.hosts = list(record.get("hosts") or [])
        return rack


def _has_link(netns: str | None, name: str) -> bool:
    args = (["-n", netns] if netns else []) + ["-o", "link", "show"]
    return any(line.split(":")[1].strip().split("@")[0] == name
               for line in ip(*args).splitlines() if line.count(":") >= 2)


class _racks_lock:
    """One rack at a time chooses its /24."""

    def __enter__(self):
        os.makedirs(os.path.dirname(_LOCK), exist_ok=True)
        self._file = open(_LOCK, "a")
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()


def _free_subnet() -> str:
    """The first ``10.214.N.0/24`` no interface here has an address in."""
    used = {int(m.group(1)) for m in
            re.finditer(rf"inet {re.escape(_PREFIX)}\.(\d+)\.", ip("-4", "-o", "addr", "show"))}
    for n in range(256):
        if n not in used:
            return f"{_PREFIX}.{n}.0/24"
    raise Failed(f"no free {_PREFIX}.N.0/24 left for a rack on this machine")
