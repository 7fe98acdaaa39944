"""What libvirt's storage API cannot do to a qcow2 file, done with QEMU's
own ``qemu-img`` on a file of this host's pool, never on a disk a running
VM holds.

- :func:`version` reads a volume's qcow2 version from libvirt's description;
- :func:`amend_to_v3` makes a qcow2 version 2 disk (compat 0.10) version 3
  (compat 1.1) in place, so that it can carry dirty bitmaps (checkpoints);
- :func:`detach_backing` drops the backing file an incremental backup's
  scratch file names (the live disk: a path of the source host only), so
  that the increment stands alone wherever it is kept;
- :func:`apply_increment` writes the clusters an incremental backup holds
  into the disk it was taken from: the increment is pointed at the disk
  (an unsafe rebase: only its header changes) and committed into it.
"""
from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET

from engine.errors import RequestError

__all__ = ["version", "amend_to_v3", "detach_backing", "apply_increment", "CAN_CHECKPOINT"]

CAN_CHECKPOINT = "1.1"          # the compat level dirty bitmaps need
TIMEOUT = 3600.0


def version(vol) -> str | None:
    """``"0.10"`` or ``"1.1"`` for a qcow2 volume; None for another format."""
    target = ET.fromstring(vol.XMLDesc(0)).find("./target")
    if target is None or target.find("format") is None \
            or target.find("format").get("type") != "qcow2":
        return None
    return target.findtext("compat") or "0.10"


def _qemu_img(*args: str) -> None:
    try:
        done = subprocess.run(["qemu-img", *args], capture_output=True, text=True,
                              timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RequestError(f"qemu-img {args[0]}: {exc}") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise RequestError(f"qemu-img {args[0]}: {why[-1] if why else 'failed'}")


def amend_to_v3(path: str) -> None:
    _qemu_img("amend", "-f", "qcow2", "-o", f"compat={CAN_CHECKPOINT}", path)


def detach_backing(path: str) -> None:
    _qemu_img("rebase", "-u", "-f", "qcow2", "-b", "", path)


def apply_increment(increment: str, disk: str) -> None:
    """Write ``increment``'s allocated clusters into ``disk`` (both qcow2)."""
    _qemu_img("rebase", "-u", "-f", "qcow2", "-b", disk, "-F", "qcow2", increment)
    _qemu_img("commit", "-f", "qcow2", "-d", increment)
