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
"""
from __future__ import annotations

import functools
import urllib.parse

__all__ = ["machine_id", "reached_at", "reaches_other_machines", "remote_conflict"]

_MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


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
