"""Which code a host's peer runs: ``<state_dir>/releases/current.json``.

``{release, path, version, feature_level, previous}``: the installed
release (its ``code list`` version, None for the tree the peer was first
started from), the directory it runs from, and ``previous``, the same for
what it ran before (what ``upgrade --rollback`` goes back to).  No file:
the peer runs from the tree it was started from.

Promises:
- written atomically (a temporary file, then ``os.replace``), so a crash
  leaves the old or the new choice, never half of one;
- :func:`exec_current` is how every start of ``peer`` (by ``up``, a service
  manager or a person) lands on the host's current release: when the file
  names another tree that exists, the process replaces itself with that
  tree's ``peerctl.py`` (same PID, same arguments), saying so in one line
  (a package upgraded under it runs only once ``upgrade`` chooses it:
  no host runs code nobody chose); a file that names a
  missing tree or is unreadable is ignored, with one warning line;
- :func:`peer_file` (``<state_dir>/peer.json``, ``{pid, cmd}``) says which
  process serves as this host's peer now, for ``down`` and for tests, since
  a hand-over changes the PID.
"""
from __future__ import annotations

import json
import os
import sys

from .version import ROOT, describe

__all__ = ["write_json", "read_json", "read_current", "write_current", "clear_current",
           "exec_current", "default_state_dir", "old_default_state_dir", "running_code",
           "peer_file", "write_peer_file", "read_peer_file", "releases_dir"]


def default_state_dir(cluster: str, host: str) -> str:
    """Where a peer keeps its state when nothing names a directory: as root,
    ``/var/lib/peerctl/<cluster>`` (one host per machine); otherwise
    ``$XDG_STATE_HOME/peerctl/<cluster>/<host>`` (``~/.local/state`` when
    unset), so that one user can run several hosts' peers."""
    if os.geteuid() == 0:
        return os.path.join("/var/lib/peerctl", cluster)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".local", "state")
    return os.path.join(base, "peerctl", cluster, host)


def old_default_state_dir(cluster: str, host: str) -> str:
    """Where a peer kept its state when not told, before issue 50: under /tmp,
    which Debian empties at boot (engine/commandline/peer_host.py points
    a host that still has state there to the way out)."""
    return os.path.join("/tmp", "peerctl", cluster, host)


def releases_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "releases")


def _path(state_dir: str) -> str:
    return os.path.join(releases_dir(state_dir), "current.json")


def write_json(path: str, value) -> None:
    """``value`` as JSON at ``path``, whole or not at all (a temporary file,
    then ``os.replace``)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    """The JSON object at ``path``; None when there is none, or no object."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def read_current(state_dir: str) -> dict | None:
    """The host's current choice, or None (no file, or not a choice).  A
    release the choice names under another state directory that is gone,
    and that this one holds (the directory was moved, e.g. out of the old
    default under /tmp), is read at its place here."""
    value = read_json(_path(state_dir))
    if not value or not isinstance(value.get("path"), str):
        return None
    for choice in (value, value.get("previous")):
        if isinstance(choice, dict) and isinstance(choice.get("path"), str):
            choice["path"] = _moved(state_dir, choice["path"])
    return value


def _moved(state_dir: str, path: str) -> str:
    if os.path.exists(path) or not _is_installed_release(path):
        return path
    here = os.path.join(releases_dir(state_dir), os.path.basename(path))
    return here if os.path.isdir(here) else path


def _is_installed_release(path: str) -> bool:
    """``path`` is ``<some state_dir>/releases/<version>``."""
    return os.path.basename(os.path.dirname(os.path.normpath(path))) == "releases"


def write_current(state_dir: str, choice: dict) -> None:
    write_json(_path(state_dir), choice)


def clear_current(state_dir: str) -> None:
    try:
        os.unlink(_path(state_dir))
    except FileNotFoundError:
        pass


def running_code(state_dir: str) -> dict:
    """What this process runs, as a choice for ``current.json``: ``{release,
    path, version, commit, feature_level, previous}``; ``release`` and
    ``previous`` are what the host's ``current.json`` says when it names
    this tree, else None (a tree started as it is)."""
    described = describe(ROOT)
    code = {"release": None, "path": described["path"], "version": described["version"],
            "commit": described["commit"], "feature_level": described["feature_level"],
            "previous": None}
    chosen = read_current(state_dir)
    if chosen and os.path.realpath(chosen["path"]) == code["path"]:
        code.update(release=chosen.get("release"), previous=chosen.get("previous"))
    return code


def exec_current(state_dir: str) -> None:
    """Become the host's current release if this process runs another tree
    (never returns then); otherwise return at once."""
    choice = read_current(state_dir)
    if choice is None or os.path.realpath(choice["path"]) == os.path.realpath(ROOT):
        return
    script = os.path.join(choice["path"], "peerctl.py")
    if not os.path.isfile(script):
        sys.stderr.write(f"peerctl: warning: {_path(state_dir)} names {choice['path']}, "
                         "which holds no peerctl.py: running this tree instead\n")
        return
    mine = describe(ROOT).get("version") or "unknown"
    sys.stderr.write(f"peerctl: running release {choice.get('version') or choice['path']}, "
                     f"this host's choice by `upgrade`, not this tree's {mine} "
                     f"({_path(state_dir)}; `upgrade --to {mine}` to run it)\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, script, *sys.argv[1:]])


def peer_file(state_dir: str) -> str:
    return os.path.join(state_dir, "peer.json")


def write_peer_file(state_dir: str) -> None:
    """Note this process as the host's peer."""
    from engine.hypervisor.local.daemons import cmdline
    write_json(peer_file(state_dir), {"pid": os.getpid(), "cmd": cmdline(os.getpid())})


def read_peer_file(state_dir: str) -> dict | None:
    value = read_json(peer_file(state_dir))
    return value if value and isinstance(value.get("pid"), int) else None
