"""When an HA VM on a live host is restarted, and how often: the rules the
publisher, the ``recoverer`` and the listings share.  Free of libvirt, so
that listings can apply them.

- :func:`wants_restart`: an HA VM (``ha: restart``) that is ``missing``
  from its host, or down though it should run (``crashed``);
- at most :data:`MAX_RESTARTS` automatic restarts within
  :data:`RESTART_WINDOW` seconds (as Proxmox's ``max_restart``); a VM's
  record counts them in ``restarts`` (``{automation: time}``), and
  :func:`restarts_within` is what ``vmlist`` shows.
"""
from __future__ import annotations

import os

__all__ = ["wants_restart", "restarts_within", "MAX_RESTARTS", "RESTART_WINDOW", "DOWN"]

DOWN = ("shutoff", "error")     # states in which a VM that should run has crashed

MAX_RESTARTS = int(os.environ.get("PEERCTL_HA_MAX_RESTARTS", "3"))
RESTART_WINDOW = float(os.environ.get("PEERCTL_HA_RESTART_WINDOW", "3600"))


def wants_restart(record: dict | None) -> bool:
    """An HA VM that is missing, or down though it should run."""
    return bool(record) and record.get("ha") == "restart" \
        and (record.get("state") == "missing" or bool(record.get("crashed")))


def restarts_within(record: dict, now: float, window: float = RESTART_WINDOW) -> int:
    """How many HA restarts the VM's record counts in the last ``window``."""
    restarts = record.get("restarts")
    if not isinstance(restarts, dict):
        return 0
    return sum(1 for when in restarts.values()
               if isinstance(when, (int, float)) and not isinstance(when, bool)
               and now - when < window)
