"""An NBD export copied into a qcow2 volume of this host by QEMU's own
``qemu-img convert``, sparse: what the export reports as holes or zeros is
never read nor written.

:func:`copy_export` writes into a volume libvirt already made (empty, so
``--target-is-zero``), reports progress through ``tick(done, total)``, and
stops the copy when ``stop()`` says so.  ``qemu-img`` dies with the thread
that started it (``PR_SET_PDEATHSIG``, through ``setpriv``): a peer
SIGKILLed mid-copy leaves no writer behind on the volume.

An export served over TLS is read with QEMU's certificates of this host
(:func:`qemu_tls_dir`: the ``qemu/`` directory ``tls certs --libvirt``
writes, as QEMU's migration streams use them), the server's certificate
checked against the address the export listens on.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.parse

from engine.errors import RequestError
from engine.hypervisor.storage.volcopy import Interrupted

__all__ = ["copy_export", "export_uri", "qemu_tls_dir", "tls_object"]

_PROGRESS = re.compile(rb"\(([0-9.]+)/100%\)")


def _dying_with_parent() -> list[str]:
    """util-linux's ``setpriv --pdeathsig``, which sets PR_SET_PDEATHSIG and
    execs: a ``preexec_fn`` doing it would make Python fork() where it
    otherwise vforks, and a child forked from a process with gRPC's threads
    (the store's) may abort in gRPC's fork handlers."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def export_uri(address: str, port: int, name: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"nbd://{host}:{port}/{name}"


def qemu_tls_dir(remote_uri: str) -> str | None:
    """Where QEMU's certificates of the host reached at ``remote_uri`` are
    (``ca-cert.pem``, ``server-cert.pem``...), when that URI is libvirt over
    TLS: ``<pkipath>/qemu`` for a URI naming its ``pkipath``, else
    ``/etc/pki/qemu``; None when it is not TLS or they are not there."""
    parsed = urllib.parse.urlsplit(remote_uri or "")
    transport = parsed.scheme.partition("+")[2] or ("tls" if parsed.hostname else "")
    if transport != "tls":
        return None
    pkipath = urllib.parse.parse_qs(parsed.query).get("pkipath", [""])[0]
    directory = os.path.join(pkipath, "qemu") if pkipath else "/etc/pki/qemu"
    return directory if os.path.isfile(os.path.join(directory, "ca-cert.pem")) else None


def tls_object(directory: str, endpoint: str) -> list[str]:
    """QEMU's ``--object`` for the certificates in ``directory``, id ``tls0``."""
    escaped = directory.replace(",", ",,")         # QEMU's option syntax
    return ["--object", f"tls-creds-x509,id=tls0,endpoint={endpoint},dir={escaped}"]


def _source(where: dict, tls_dir: str | None) -> list[str]:
    if not where.get("tls"):
        return ["-f", "raw", export_uri(where["address"], where["port"], where["name"])]
    if tls_dir is None:
        raise RequestError(f"the export at {where['address']}:{where['port']} is served over "
                           "TLS, and this host has no QEMU certificates (tls certs --libvirt)")
    options = {"driver": "raw", "file.driver": "nbd", "file.server.type": "inet",
               "file.server.host": where["address"], "file.server.port": where["port"],
               "file.export": where["name"], "file.tls-creds": "tls0"}
    return [*tls_object(tls_dir, "client"), "--image-opts",
            ",".join(f"{k}={v}" for k, v in options.items())]


def copy_export(where: dict, path: str, total: int, tick=lambda done, total: None,
                stop=lambda: False, tls_dir: str | None = None) -> None:
    """The export ``where`` (``{address, port, name, tls?}``: raw, ``total``
    bytes) into the empty qcow2 file ``path``; ``tls_dir``: this host's
    QEMU certificates, for an export served over TLS."""
    uri = export_uri(where["address"], where["port"], where["name"])
    try:
        child = subprocess.Popen(
            [*_dying_with_parent(), "qemu-img", "convert", "-p", "-n", "--target-is-zero", "-W", "-m", "16",
             *_source(where, tls_dir), "-O", "qcow2", path],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
        code = child.wait()
        if code != 0:
            raise RequestError(f"qemu-img convert from {uri.rsplit('/', 1)[0]}: "
                               f"{why[-1] if why else f'exit status {code}'}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
