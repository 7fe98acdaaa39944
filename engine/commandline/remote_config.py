"""Where a command runs: straight on etcd, or through the API of a peer
(``--api URL[,URL...] --token-file FILE``, ``$PEERCTL_API`` and
``$PEERCTL_TOKEN_FILE``, ``--remote NAME`` or the remote ``remote use``
chose), and the named remotes kept in the user's configuration directory.

Promises:
- the first of these that is given wins: the flags, the environment, then
  ``--remote NAME`` (``$PEERCTL_REMOTE``), then the remote in use; none:
  the command reads etcd as before;
- a token file is refused (exit 2, one line) unless it is a regular file
  that only its owner can read or write, holding one line;
- the remotes file (``$XDG_CONFIG_HOME/peerctl/remotes.json``, else
  ``~/.config/peerctl/remotes.json``) is written whole, owner-only, or not
  at all; an unreadable or malformed one is one line, exit 2.
"""
from __future__ import annotations

import dataclasses
import json
import os
import stat

from engine.errors import UsageError

__all__ = ["Remote", "remote_for", "remotes_path", "read_remotes", "write_remotes",
           "read_token", "check_name", "api_urls"]


@dataclasses.dataclass
class Remote:
    urls: list
    token_file: str
    cacert: str | None = None
    name: str | None = None         # a named remote's, else None

    @property
    def token(self) -> str:
        return read_token(self.token_file)

    def where(self) -> str:
        return f"remote {self.name}" if self.name else ",".join(self.urls)


def api_urls(text: str | None, where: str = "--api") -> list[str]:
    """``URL[,URL...]`` as a list; each must be http:// or https://."""
    urls = [url.strip().rstrip("/") for url in (text or "").split(",") if url.strip()]
    if not urls:
        raise UsageError(f"{where} names no URL")
    for url in urls:
        if not url.startswith(("http://", "https://")) or "://" == url[-3:]:
            raise UsageError(f"bad API URL {url!r} {'in' if ' ' in where else 'from'} {where} "
                             "(want http://HOST:PORT or https://HOST:PORT)")
    return urls


def read_token(path: str, what: str = "token file") -> str:
    """The secret in token file ``path``, which only its owner may read
    (``what`` names it in messages: ``--token-file``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{what} {path} is not a regular file")
        if info.st_mode & 0o077:
            raise UsageError(f"{what} {path} is readable by others (mode "
                             f"{stat.S_IMODE(info.st_mode):04o}): chmod 600 {path}")
        if info.st_uid != os.geteuid():
            raise UsageError(f"{what} {path} belongs to another user (uid {info.st_uid})")
        text = os.read(fd, 4096).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not text or len(text.splitlines()) != 1:
        raise UsageError(f"{what} {path} holds no token (one line: the secret "
                         "token create printed)")
    return text


def remotes_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".config")
    return os.path.join(base, "peerctl", "remotes.json")


def read_remotes() -> dict:
    """``{"current": NAME or None, "remotes": {NAME: {urls, token_file, cacert}}}``."""
    path = remotes_path()
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {"current": None, "remotes": {}}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
                         .splitlines()[0]) from None
    remotes = doc.get("remotes") if isinstance(doc, dict) else None
    if not isinstance(remotes, dict) or not all(
            isinstance(r, dict) and isinstance(r.get("urls"), list)
            and isinstance(r.get("token_file"), str) for r in remotes.values()):
        raise UsageError(f"bad remotes file {path}: want {{current, remotes: {{NAME: "
                         "{urls, token_file, cacert}}}}; delete it and add the remotes again")
    current = doc.get("current")
    return {"current": current if current in remotes else None, "remotes": remotes}


def write_remotes(doc: dict) -> None:
    from engine.core.files import write_whole
    path = remotes_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_whole(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(),
                private=True)


def check_name(name: str) -> str:
    if not name or not all(c.isalnum() or c in "._-" for c in name) or len(name) > 64:
        raise UsageError(f"bad remote name {name!r} (want letters, digits, '.', '_' or '-')")
    return name


def _named(name: str, where: str) -> Remote:
    known = read_remotes()["remotes"]
    if name not in known:
        raise UsageError(f"no remote {name!r} {where}"
                         + (f" (known: {', '.join(sorted(known))})" if known
                            else " (add one with: remote add NAME URL --token-file FILE)"))
    entry = known[name]
    return Remote(list(entry["urls"]), entry["token_file"], entry.get("cacert"), name)


def remote_for(args) -> Remote | None:
    """The remote this command runs through, or None (straight on etcd)."""
    urls = getattr(args, "remote_api", None)
    token_file = getattr(args, "remote_token_file", None)
    where_urls, where_token = "--api", "--token-file"
    if urls is None and os.environ.get("PEERCTL_API"):
        urls, where_urls = os.environ["PEERCTL_API"], "$PEERCTL_API"
    if token_file is None and os.environ.get("PEERCTL_TOKEN_FILE"):
        token_file, where_token = os.environ["PEERCTL_TOKEN_FILE"], "$PEERCTL_TOKEN_FILE"
    if urls is not None or token_file is not None:
        if urls is None:
            raise UsageError(f"{where_token} goes with --api URL (or $PEERCTL_API)")
        if token_file is None:
            raise UsageError(f"{where_urls} needs a token: --token-file FILE (or "
                             "$PEERCTL_TOKEN_FILE)")
        return Remote(api_urls(urls, where_urls), token_file,
                      getattr(args, "cacert", None) or os.environ.get("PEERCTL_CACERT"))
    name = getattr(args, "remote", None)
    if name is not None:
        return _named(name, "(--remote)")
    if os.environ.get("PEERCTL_REMOTE"):
        return _named(os.environ["PEERCTL_REMOTE"], "($PEERCTL_REMOTE)")
    current = read_remotes()["current"] if os.path.exists(remotes_path()) else None
    return _named(current, "(remote use)") if current else None
