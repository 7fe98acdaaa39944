"""Where a host's libvirt has QEMU write a guest's own log: the file that
says why QEMU paused or stopped a guest (a KVM emulation failure's
register dump, an I/O error), on that host.

- ``qemu:///system`` (and ``qemu+ssh://.../system``...): libvirt's
  ``/var/log/libvirt/qemu/NAME.log``;
- a private libvirtd (:mod:`engine.hypervisor.local.daemons`), reached at
  ``qemu+unix:///system?socket=DIR/run/libvirt-sock``: its ``/var/log/libvirt``
  is ``DIR/log``, so ``DIR/log/qemu/NAME.log`` seen from outside;
- ``qemu:///session``: ``~/.cache/libvirt/qemu/log/NAME.log`` of the user
  the peer runs as;
- any other driver (``test://``): None, it has no such log.

Promises: pure (the URI and the name only), no libvirt call; the path is
on the guest's host, which a message names beside it.
"""
from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

__all__ = ["qemu_log_path"]

_PRIVATE_SOCKET = os.path.join("run", "libvirt-sock")


def qemu_log_path(uri: str, name: str) -> str | None:
    """The QEMU log of domain ``name`` on the host whose libvirt is ``uri``."""
    parts = urlsplit(uri or "")
    if not parts.scheme.split("+")[0] == "qemu":
        return None
    socket = (parse_qs(parts.query).get("socket") or [None])[0]
    if socket and socket.endswith("/" + _PRIVATE_SOCKET):
        base = socket[:-len(_PRIVATE_SOCKET) - 1]
        return os.path.join(base, "log", "qemu", f"{name}.log")
    if parts.path.rstrip("/") == "/session":
        return os.path.join(os.path.expanduser("~"), ".cache", "libvirt", "qemu", "log",
                            f"{name}.log")
    return f"/var/log/libvirt/qemu/{name}.log"
