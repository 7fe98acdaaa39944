"""The guest agent's part in point-in-time copies: the guest's filesystems
frozen around the instant a backup, replica update or snapshot is taken,
when an agent answers (else the copy is crash-consistent)."""
from __future__ import annotations

import libvirt
import structlog

__all__ = ["freeze", "thaw"]

log = structlog.get_logger("peerctl.guest_agent")


def freeze(dom) -> bool:
    """True when the guest's agent froze its filesystems."""
    try:
        dom.fsFreeze(None, 0)
        return True
    except libvirt.libvirtError:
        return False        # no guest agent answering: crash-consistent


def thaw(dom) -> None:
    try:
        dom.fsThaw(None, 0)
    except libvirt.libvirtError as exc:
        log.warning("thaw_failed", vm=dom.name(), error=exc.get_error_message())
