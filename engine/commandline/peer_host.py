"""Which host this machine's peer runs: its name, its libvirt (and the URI
other hosts reach it by) and its state directory, each from a ``peer``
flag, else ``$PEERCTL_HOST`` / ``$PEERCTL_LIBVIRT`` /
``$PEERCTL_LIBVIRT_REMOTE`` / ``$PEERCTL_STATE_DIR``, else the config file
(``host``, ``libvirt``, ``libvirt_remote``, ``state_dir``), else this
machine; and where its QEMU migration streams arrive (``migration_address``,
``migration_ports``: ``$PEERCTL_MIGRATION_ADDRESS``,
``$PEERCTL_MIGRATION_PORTS`` or the config file, see
:func:`~engine.hypervisor.host.reachability.migration_of`; or
``migration_network``, ``--migration-network`` or
``$PEERCTL_MIGRATION_NETWORK``: a CIDR, this machine's address inside it,
:func:`~engine.hypervisor.host.reachability.address_in`, unless
``migration_address`` names one).

So ``peerctl peer`` with no flags runs the host ``/etc/peerctl/peerctl.conf``
describes.  The config file's ``state_dir`` is also ``up``'s (``state``,
relative: ./state); the peer takes it only when it is absolute.

Promises, each refusal one line and exit 2 (a ``UsageError``) before
anything is created, connects or starts:
- the name, when nothing names one, is the machine's short host name (up
  to the first dot); one that is no usable name (``localhost``, empty,
  not letters, digits, '.', '_', '-') is refused, saying how to name it;
- the state directory is, when nothing names one,
  :func:`~engine.releases.current.default_state_dir` (``/var/lib/peerctl/
  <cluster>`` as root);
- it is never under ``/tmp`` (emptied at boot, and with it the VMs'
  disks) unless ``--state-dir`` or ``$PEERCTL_STATE_DIR`` names it;
- it is writable (or can be made: its nearest existing parent is);
- a ``migration_network`` that is no CIDR, or that none of this machine's
  addresses is in, is refused (even when ``migration_address`` wins);
- state left under the old default ``/tmp/peerctl/<cluster>/<host>`` is
  never silently abandoned: with nothing yet in the new directory the peer
  refuses to start and gives the ``mv`` that carries it over (starting
  afresh would run another release than the one ``upgrade`` chose, and
  leave the old guard watching a heartbeat nobody beats); with state in
  both, :attr:`PeerHost.notice` is one warning line naming the old one.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from engine.errors import UsageError
from engine.operations.specs import check_name

__all__ = ["PeerHost", "peer_host", "TMP"]

TMP = "/tmp"
# DRIVER[+TRANSPORT]://[USER@]HOST[:PORT]/PATH[?QUERY], or a local one (no host)
_REMOTE = re.compile(r"[a-z][a-z0-9]*(\+(tls|tcp|ssh|libssh|libssh2|unix|ext))?://"
                     r"([\w.-]+@)?(\[[0-9a-fA-F:]+\]|[\w.-]+)?(:\d+)?/[\w./-]*(\?\S*)?")
# host names that name no one host: every machine could say so
_NOT_A_NAME = frozenset(("", "localhost", "localhost.localdomain", "(none)"))


@dataclass(frozen=True)
class PeerHost:
    name: str
    libvirt: str
    state_dir: str          # absolute
    notice: str | None      # one warning line for the log, or None
    libvirt_remote: str = ""    # how other hosts reach its libvirt ("" = as ``libvirt``)
    migration: dict | None = None   # {migration_address, migration_ports}, published


def peer_host(args, settings: dict) -> PeerHost:
    """This machine's host, as ``peer``'s flags and ``settings`` name it,
    checked (see the module's promises); nothing is made or written."""
    name = _name(args, settings)
    state_dir, where, explicit = _state_dir(args, settings, name)
    if _under_tmp(state_dir) and not explicit:
        raise UsageError(f"refusing state directory {state_dir} ({where}): /tmp is emptied at "
                         "boot, and the VMs' disks with it; name another in state_dir, or "
                         "this one explicitly with --state-dir")
    _check_writable(state_dir, where)
    notice = None if explicit else _old_state(settings["cluster"], name, state_dir)
    libvirt = _libvirt(args, settings)
    remote = _libvirt_remote(args, settings, libvirt)
    return PeerHost(name, libvirt, state_dir, notice, remote,
                    _migration(args, settings, remote or libvirt))


def _migration(args, settings: dict, remote: str) -> dict:
    """Where QEMU's migration streams arrive: ``migration_address`` when
    named, else this machine's address inside ``migration_network`` when
    that is named, else the host part of ``remote``."""
    from engine.hypervisor.host.reachability import address_in, migration_network, migration_of
    address, _ = _pick(args, settings, "migration_address")
    value, in_network = _pick(args, settings, "migration_network")
    if value is not None:
        try:
            network = migration_network(value)
        except ValueError as exc:
            raise UsageError(f"{exc} ({in_network})") from None
        found = address_in(network)
        if found is None:
            raise UsageError(f"no address of this machine is in migration_network {network} "
                             f"({in_network}): name a network one of its interfaces has an "
                             "address in, or set migration_address")
        address = address or found
    ports, where = _pick(args, settings, "migration_ports")
    try:
        return migration_of(remote, address or "", ports or "")
    except ValueError as exc:
        raise UsageError(f"{exc} {where}") from None


def _pick(args, settings: dict, key: str):
    """(value, where) from the flag, the environment or the config file;
    (None, None) when none of them names it."""
    flag = getattr(args, key, None)
    if flag is not None:
        return flag, f"from --{key.replace('_', '-')}"
    env = os.environ.get("PEERCTL_" + key.upper())
    if env:
        return env, f"from $PEERCTL_{key.upper()}"
    if key in settings.get("in_conf", ()) and settings.get(key):
        return settings[key], f"{key} in {settings['conf_file']}"
    return None, None


def _name(args, settings: dict) -> str:
    name, where = _pick(args, settings, "host")
    if name is not None:
        if not _usable(name):
            raise UsageError(f"bad host name {name!r} {where} (letters, digits, '.', '_', "
                             "'-'; naming this one host)")
        return name
    derived = socket.gethostname().split(".")[0]
    if not _usable(derived):
        raise UsageError(f"no host name: none in {settings.get('conf_file')}, and this "
                         f"machine's ({socket.gethostname()!r}) names no one host: set "
                         "host = NAME there, or give --host NAME")
    return derived


def _usable(name: str) -> bool:
    if name.lower() in _NOT_A_NAME:
        return False
    try:
        check_name(name, "host name")
    except UsageError:
        return False
    return True


def _libvirt(args, settings: dict) -> str:
    uri, _ = _pick(args, settings, "libvirt")
    return uri if uri is not None else settings["libvirt"]


def _libvirt_remote(args, settings: dict, libvirt: str) -> str:
    """The URI other hosts reach this host's libvirt by (migrations, copies
    of backups and replicas, consoles): ``libvirt_remote`` when named (a
    ``qemu+tls://ADDR/system`` or ``qemu+ssh://...``), else the local URI
    itself, which reaches it only from this machine."""
    uri, where = _pick(args, settings, "libvirt_remote")
    if uri is None:
        return libvirt
    if not _REMOTE.fullmatch(uri):
        raise UsageError(f"bad libvirt_remote {uri!r} {where}: a libvirt URI such as "
                         "qemu+tls://10.0.0.12/system or qemu+ssh://root@kvm2/system")
    return uri


def _state_dir(args, settings: dict, host: str) -> tuple[str, str, bool]:
    """(directory, where it comes from, named explicitly?)"""
    if getattr(args, "state_dir", None):
        return os.path.abspath(args.state_dir), "from --state-dir", True
    if os.environ.get("PEERCTL_STATE_DIR"):
        return os.path.abspath(os.environ["PEERCTL_STATE_DIR"]), "from $PEERCTL_STATE_DIR", True
    configured = settings.get("state_dir") if "state_dir" in settings.get("in_conf", ()) else None
    if configured and os.path.isabs(configured):
        return os.path.normpath(configured), f"state_dir in {settings['conf_file']}", False
    from engine.releases.current import default_state_dir
    return default_state_dir(settings["cluster"], host), "the default", False


def _under_tmp(path: str) -> bool:
    real = os.path.realpath(path)
    return real == TMP or real.startswith(TMP + os.sep)


def _check_writable(state_dir: str, where: str) -> None:
    """The directory, or its nearest existing parent (the peer makes the
    rest), must be a directory this process may write in."""
    existing = state_dir
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"state directory {state_dir} ({where}) cannot be made: "
                         f"{existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is" if existing == state_dir else f"cannot be made: {existing} is"
        raise UsageError(f"state directory {state_dir} ({where}) {what} not writable")


def _has_state(path: str) -> bool:
    try:
        return bool(os.listdir(path))
    except OSError:
        return False


def _old_state(cluster: str, host: str, state_dir: str) -> str | None:
    from engine.releases.current import old_default_state_dir
    old = old_default_state_dir(cluster, host)
    if os.path.realpath(old) == os.path.realpath(state_dir) or not _has_state(old):
        return None
    if not _has_state(state_dir):
        raise UsageError(f"this host's state is still in {old}, the old default, which /tmp "
                         f"loses at boot: with its VMs moved off and its peer stopped, move it "
                         f"with 'mkdir -p {os.path.dirname(state_dir)} && mv -T {old} "
                         f"{state_dir}' (docs/install.md, Files), or keep it there with "
                         f"--state-dir {old}")
    return (f"state of this host from before is still in {old}, the old default; this peer "
            f"uses {state_dir}: see docs/install.md (Files) before removing it")
