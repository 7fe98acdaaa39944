"""How other hosts reach this host's libvirt, and the check that they can
tell it from every other host's.

A peer publishes two URIs in its host record: ``libvirt_uri``, the one it
drives its own hypervisor by, and ``libvirt_remote``, the one other hosts
open for a migration, a copy of a backup or a replica, or a console (the
``libvirt_remote`` setting, e.g. ``qemu+tls://10.0.0.12/system``; by default
the local URI itself).  It also publishes ``machine``, this machine's
``/etc/machine-id``.

Promises of :func:`remote_conflict` (the peer refuses to start, one line,
when it answers one), among hosts of one driver (QEMU hosts never move VMs
to test-driver hosts, and test-driver hosts move theirs by redefinition
through the peers, never through libvirt, so they are never refused):
- a URI without a host part (``qemu:///system``, a UNIX socket, the test
  driver) reaches only this machine: with a live host on another machine
  it is refused, naming that host, since that host could not reach this one;
- two hosts on different machines publishing the same URI would open each
  other's as their own (``cannot move VM ... to its own host``): refused;
- hosts on one machine may share a URI (peers sharing one libvirtd) and use
  local URIs (the private daemons of ``up --libvirt qemu``); "one machine"
  is one ``/etc/machine-id``, so a container with a machine id of its own
  counts as another machine.

Where a host is probed from the others (``cluster verify``): its libvirt's
TCP endpoint (:func:`libvirt_endpoint`, from the URI it is reached at) and
its migration port (:func:`migration_endpoint`: ``migration_address``, the
first port of ``migration_ports``, both published in its record, see
:func:`migration_of`; the address may be found on this machine's interfaces
inside the ``migration_network`` CIDR, :func:`address_in`).  A host reached
by a URI with no TCP endpoint (``test:///default``, ``qemu:///system``,
``qemu+unix://``) has none: its pairs are skipped, not failed.
"""
from __future__ import annotations

import functools
import ipaddress
import socket
import urllib.parse

__all__ = ["machine_id", "reached_at", "reaches_other_machines", "remote_conflict",
           "libvirt_endpoint", "migration_endpoint", "migration_of", "migration_network",
           "address_in", "MIGRATION_PORTS"]

_MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
# libvirtd's TCP ports by transport (a URI with a host and no transport is TLS)
_LIBVIRT_PORTS = {"tls": 16514, "tcp": 16509, "ssh": 22, "libssh": 22, "libssh2": 22}
# libvirt's default range for QEMU's incoming migration streams (qemu.conf's
# migration_port_min and migration_port_max)
MIGRATION_PORTS = (49152, 49215)


@functools.lru_cache(maxsize=1)
def machine_id() -> str:
    """This machine's id: systemd's machine-id, else ``boot:`` and the
    kernel's boot id (a machine without a machine-id is still told apart
    from the others, for as long as it runs), else ""."""
    for path in _MACHINE_ID_FILES:
        try:
            with open(path) as f:
                found = f.read().strip()
        except OSError:
            continue
        if found:
            return found
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return "boot:" + f.read().strip()
    except OSError:
        return ""


def reached_at(record: dict) -> str | None:
    """The URI another host opens for the libvirt of the host whose record
    this is (a peer older than ``libvirt_remote`` published only its own)."""
    return record.get("libvirt_remote") or record.get("libvirt_uri")


def reaches_other_machines(uri: str) -> bool:
    """Whether ``uri`` names a host another machine could connect to."""
    parsed = urllib.parse.urlsplit(uri)
    return bool(parsed.hostname) and parsed.hostname not in ("localhost", "127.0.0.1", "::1")


def _driver(uri: str) -> str:
    """``qemu`` for ``qemu+tls://...``, ``test`` for ``test:///default``."""
    return urllib.parse.urlsplit(uri).scheme.split("+")[0]


def remote_conflict(name: str, remote: str, machine: str, live: list[dict]) -> str | None:
    """The reason host ``name`` (publishing ``remote`` from ``machine``) must
    not join the live hosts whose records are ``live``, or None."""
    driver = _driver(remote)
    if driver == "test":
        return None
    for record in live:
        other = record.get("host")
        theirs = reached_at(record)
        if other == name or not isinstance(other, str) or not isinstance(theirs, str) \
                or _driver(theirs) != driver:
            continue
        elsewhere = bool(machine and record.get("machine")) and record["machine"] != machine
        if not elsewhere:
            continue
        if not reaches_other_machines(remote):
            return (f"host {other} runs on another machine and could not reach this host's "
                    f"libvirt at {remote}: set libvirt_remote to a URI it can reach, such "
                    f"as qemu+tls://ADDRESS/system (docs/deploy.md)")
        if theirs == remote:
            return (f"host {other}, on another machine, already publishes libvirt_remote "
                    f"{remote}: each host needs a URI of its own (docs/deploy.md)")
    return None


def libvirt_endpoint(record: dict) -> tuple[str, int] | None:
    """``(address, port)`` another host connects to for the libvirt of the
    host whose record this is, or None when its URI has no TCP endpoint."""
    uri = reached_at(record)
    if not isinstance(uri, str):
        return None
    parsed = urllib.parse.urlsplit(uri)
    transport = parsed.scheme.partition("+")[2] or "tls"
    try:
        port = parsed.port
    except ValueError:
        return None
    if not parsed.hostname or transport not in _LIBVIRT_PORTS:
        return None
    return parsed.hostname, port or _LIBVIRT_PORTS[transport]


def migration_endpoint(record: dict) -> tuple[str, int] | None:
    """``(address, port)`` QEMU's migration stream to the host whose record
    this is connects to (the first port of its range: the one QEMU takes
    while no other migration runs), or None when it publishes no address."""
    address, ports = record.get("migration_address"), record.get("migration_ports")
    if not isinstance(address, str) or not address:
        return None
    if isinstance(ports, list) and ports and isinstance(ports[0], int):
        return address, ports[0]
    return address, MIGRATION_PORTS[0]


def migration_of(remote: str, address: str = "", ports: str = "") -> dict:
    """What a peer publishes about its migration streams: ``{migration_address,
    migration_ports: [first, last]}``.  ``address`` (the ``migration_address``
    setting) defaults to the host part of ``remote`` (its ``libvirt_remote``)
    when that has one, else None (nothing to probe); ``ports`` (the
    ``migration_ports`` setting, ``PORT`` or ``FIRST-LAST``) to libvirt's
    49152-49215.  ValueError, saying why, for ports that are none."""
    first, last = MIGRATION_PORTS
    if ports:
        low, _, high = ports.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"bad migration_ports {ports!r}: a port or a range such as "
                             "49152-49215") from None
        if not 1 <= first <= last <= 65535:
            raise ValueError(f"bad migration_ports {ports!r}: ports from 1 to 65535, the "
                             "first one not above the last")
    if not address:
        address = urllib.parse.urlsplit(remote).hostname or None
    return {"migration_address": address, "migration_ports": [first, last]}


def migration_network(value: str):
    """The ``migration_network`` setting as an ``ipaddress`` network (a CIDR
    such as ``10.0.1.0/24``, as Proxmox's ``migration: network=``; host bits
    ignored).  ValueError, saying why, for one that is none."""
    try:
        return ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ValueError(f"bad migration_network {value!r}: a network such as "
                         "10.0.1.0/24 or fd00:1::/64") from None


def address_in(network) -> str | None:
    """This machine's address inside ``network`` (see
    :func:`migration_network`), from its interfaces (those of the network
    namespace the peer runs in): the lowest one when several are; None
    when none is."""
    import psutil           # only a peer that names a migration network needs it
    found = set()
    for addresses in psutil.net_if_addrs().values():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                address = ipaddress.ip_address(entry.address.partition("%")[0])
            except ValueError:
                continue
            if address in network:
                found.add(address)
    return str(min(found)) if found else None
