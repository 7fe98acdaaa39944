"""An NBD export copied into a qcow2 volume of this host by QEMU's own
``qemu-img convert``, sparse: what the export reports as holes or zeros is
never read nor written.

:func:`copy_export` writes into a volume libvirt already made (empty, so
``--target-is-zero``), reports progress through ``tick(done, total)``, and
stops the copy when ``stop()`` says so.  ``qemu-img`` dies with the thread
that started it (``PR_SET_PDEATHSIG``): a peer SIGKILLed mid-copy leaves no
writer behind on the volume.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import re
import signal
import subprocess

from engine.errors import RequestError
from engine.hypervisor.storage.volcopy import Interrupted

__all__ = ["copy_export", "export_uri"]

_PR_SET_PDEATHSIG = 1
_PROGRESS = re.compile(rb"\(([0-9.]+)/100%\)")
try:
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):        # not Linux: the child outlives a killed peer
    _prctl = None


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def export_uri(address: str, port: int, name: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"nbd://{host}:{port}/{name}"


def copy_export(uri: str, path: str, total: int, tick=lambda done, total: None,
                stop=lambda: False) -> None:
    """The export at ``uri`` (raw, ``total`` bytes) into the empty qcow2 file
    ``path``."""
    try:
        child = subprocess.Popen(
            ["qemu-img", "convert", "-p", "-n", "--target-is-zero", "-W", "-m", "16",
             "-f", "raw", "-O", "qcow2", uri, path],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent)
    except OSError as exc:
        raise RequestError(f"qemu-img convert: {exc}") from None
    try:
        pending = b""
        while True:
            chunk = child.stdout.read1(256)
            if not chunk:
                break
            pending = (pending + chunk)[-256:]
            found = _PROGRESS.findall(pending)
            if found:
                tick(int(total * float(found[-1]) / 100), total)
            if stop():
                raise Interrupted("stopped: asked to abort")
        why = child.stderr.read().decode(errors="replace").strip().splitlines()
        if child.wait() != 0:
            raise RequestError(f"qemu-img convert from {uri.rsplit('/', 1)[0]}: "
                               f"{why[-1] if why else 'failed'}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
