"""Where VM images may come from: the cluster's ``image_sources`` setting,
and the checks made of an image URL against it.

- ``settings/images`` ``{sources, time, by}``: one record for the cluster,
  written whole by ``images sources --set/--add/--remove``; no record reads
  as the default, :data:`DEFAULT`: ``images``, the ``images/`` directory
  under each host's state directory, and no network source.

A source is one of:
- a directory on every host: ``/srv/images`` or ``file:///srv/images``;
- a directory relative to each host's state directory: ``images``;
- an http(s) URL prefix naming its host: ``https://mirror.example/cloud/``
  (a prefix ends at a ``/``: it allows ``.../cloud/x.img``, not
  ``.../cloudy.img``);
- a whole scheme, ``http://`` or ``https://``: any host of it, except a
  name that resolves to a loopback, link-local or unspecified address or
  to the cluster's etcd: those need a prefix of their own.  (The API
  served over plain HTTP listens on loopback only; a TLS API on another
  address is not known here.)

Promises:
- an image URL is checked twice: when the boot is planned (:func:`refusal`
  with the hosts' state directories, before anything is written) and on
  the host right before it reads or fetches (:func:`local_file` resolves
  symlinks and ``..`` first; :func:`check_fetch` is called again for
  every redirect);
- each refusal is one line naming the URL once;
- a settings record that cannot be read, or holds a bad source, reads as
  the default (reported once): a bad record never widens what is allowed.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import time
import urllib.parse

from engine.core import keys
from engine.core.store import absent, modified_at, Put
from engine.core.values import declare, readable, report, shape
from engine.errors import UsageError

__all__ = ["DEFAULT", "SETTINGS", "parse_source", "parse_sources", "read_sources",
           "write_sources", "change_sources", "refusal", "local_file", "check_fetch",
           "addresses_of_urls", "describe"]

DEFAULT = ("images",)
SCHEMES = ("http", "https", "file")
_WANT = "want http(s)://HOST/PATH or file:///PATH"

SETTINGS = shape("image sources", sources=list)
declare(keys.IMAGE_SETTINGS, SETTINGS)


def describe(source: str) -> str:
    """What ``source`` allows, in words."""
    if source in ("http://", "https://"):
        return f"any {source[:-3]} host but loopback, link-local and etcd's"
    if source.startswith(("http://", "https://")):
        return "files under this URL prefix"
    if os.path.isabs(source):
        return "files under this directory, on every host"
    return "files under this directory of each host's state directory"


# -- sources -------------------------------------------------------------------

def _has_dots(path: str) -> bool:
    return any(part in (".", "..") for part in path.split("/"))


def parse_source(text) -> str:
    """``text`` as a source, normalised; a bad one is a ``UsageError``
    naming it."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"bad image source {text!r} (want a directory, or an http(s):// "
                         f"URL prefix)")
    text = text.strip()
    if text in ("http://", "https://"):
        return text
    scheme = text.split(":", 1)[0].lower() if "://" in text else ""
    if scheme in ("http", "https"):
        try:
            parsed = urllib.parse.urlsplit(text)
            port = parsed.port
        except ValueError:
            parsed = port = None
        if parsed is None or not parsed.hostname or parsed.query or parsed.fragment \
                or _has_dots(urllib.parse.unquote(parsed.path)):
            raise UsageError(f"bad image source {text!r} (want an http(s)://HOST[:PORT]/PATH/ "
                             f"prefix, or http:// or https:// alone for any host)")
        netloc = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
        if port is not None and port != {"http": 80, "https": 443}[scheme]:
            netloc += f":{port}"
        return f"{scheme}://{netloc}{parsed.path or '/'}"
    if scheme == "file":
        parsed = urllib.parse.urlsplit(text)
        if parsed.netloc not in ("", "localhost"):
            raise UsageError(f"bad image source {text!r} (a file:// source names no host: "
                             f"file:///DIR)")
        text = urllib.parse.unquote(parsed.path)
    elif scheme or ":" in text.split("/", 1)[0]:
        raise UsageError(f"bad image source {text!r} (unsupported scheme; want a directory, "
                         f"or an http(s):// URL prefix)")
    if _has_dots(text.rstrip("/")) or text.startswith("~"):
        raise UsageError(f"bad image source {text!r} (no '.', '..' or '~' in a directory)")
    return os.path.normpath(text)


def parse_sources(texts) -> list[str]:
    """Each of ``texts`` parsed, duplicates dropped, in order."""
    return list(dict.fromkeys(parse_source(text) for text in texts))


def read_sources(store) -> list[str]:
    """The cluster's image sources (the default where none were set, or the
    record cannot be used).  ``store`` None (a host outside a cluster, in
    tests): the default."""
    return _sources_of(store.get(keys.IMAGE_SETTINGS) if store is not None else None)


def _sources_of(kv) -> list[str]:
    record = readable(kv)
    if record is None:
        return list(DEFAULT)
    try:
        return parse_sources(record["sources"])
    except UsageError as exc:
        report(keys.IMAGE_SETTINGS, str(exc))
        return list(DEFAULT)


def write_sources(store, sources, by: str) -> list[str]:
    """``sources`` (checked) as the cluster's, whole."""
    sources = parse_sources(sources)
    store.put(keys.IMAGE_SETTINGS, {"sources": sources, "time": time.time(), "by": by})
    return sources


def change_sources(store, by: str, *, add=(), remove=()) -> list[str]:
    """The sources with ``add`` appended and ``remove`` taken out (each
    checked first; removing one that is not there is a ``UsageError``), in
    one compare-and-put so that two changes made at once both count."""
    add, remove = parse_sources(add), parse_sources(remove)
    while True:
        kv = store.get(keys.IMAGE_SETTINGS)
        current = _sources_of(kv)
        missing = [source for source in remove if source not in current]
        if missing:
            raise UsageError(f"image source {missing[0]!r} is not in the list "
                             f"({', '.join(current) or 'none'})")
        wanted = [s for s in current if s not in remove] + [s for s in add if s not in current]
        guard = modified_at(keys.IMAGE_SETTINGS, kv.mod_revision) if kv is not None \
            else absent(keys.IMAGE_SETTINGS)
        record = {"sources": wanted, "time": time.time(), "by": by}
        if store.txn([guard], [Put(keys.IMAGE_SETTINGS, record)]).succeeded:
            return wanted


# -- image URLs ----------------------------------------------------------------

def _split(url) -> tuple[str, urllib.parse.SplitResult]:
    """(scheme, the URL split, its fragment dropped); a URL that is none
    is a ValueError saying why."""
    if not isinstance(url, str) or not url.strip() or url != url.strip() \
            or any(c.isspace() for c in url):
        raise ValueError(f"not a URL ({_WANT})")
    bare = urllib.parse.urldefrag(url)[0]
    try:
        parsed = urllib.parse.urlsplit(bare)
        parsed.port             # a bad port, or an unclosed [IPv6
    except ValueError:
        raise ValueError(f"not a URL ({_WANT})") from None
    scheme = parsed.scheme.lower()
    if not scheme or "://" not in bare:
        raise ValueError(f"not a URL ({_WANT})")
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported scheme {scheme} (want http, https or file)")
    path = urllib.parse.unquote(parsed.path)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError("a file URL names no host (want file:///PATH)")
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"not a file's URL ({_WANT})")
    elif not parsed.hostname:
        raise ValueError(f"not a URL, it names no host ({_WANT})")
    if _has_dots(path):
        raise ValueError("a path with '.' or '..' in it")
    return scheme, parsed


def _under(path: str, directory: str) -> bool:
    directory = directory.rstrip("/") or "/"
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _directories(sources, state_dirs) -> list[str]:
    found = []
    for source in sources:
        if source.startswith(("http://", "https://")):
            continue
        if os.path.isabs(source):
            found.append(source)
        else:
            found += [os.path.join(state_dir, source) for state_dir in state_dirs]
    return found


def _port(parsed) -> int:
    return parsed.port or (443 if parsed.scheme.lower() == "https" else 80)


def _matching(parsed, sources) -> str | None:
    """The source allowing http(s) URL ``parsed``: a prefix naming its host
    first, else its whole scheme; None."""
    scheme = parsed.scheme.lower()
    for source in sources:
        if not source.startswith(scheme + "://") or source == scheme + "://":
            continue
        prefix = urllib.parse.urlsplit(source)
        path, under = (urllib.parse.unquote(p) for p in (parsed.path, prefix.path))
        if prefix.hostname == parsed.hostname.lower() and _port(prefix) == _port(parsed) \
                and (path.startswith(under) if under.endswith("/") else _under(path, under)):
            return source
    return scheme + "://" if scheme + "://" in sources else None


def addresses_of_urls(urls) -> set[str]:
    """The IP addresses the hosts of ``urls`` (comma-separated endpoints,
    or a list) resolve to: the cluster's own etcd, which a whole scheme
    never allows."""
    if isinstance(urls, str):
        urls = urls.split(",")
    found = set()
    for url in urls or ():
        url = url.strip()
        host = urllib.parse.urlsplit(url if "://" in url else "//" + url).hostname
        if host:
            found |= _resolve(host)
    return found


def _resolve(host: str) -> set[str]:
    try:
        return {str(ipaddress.ip_address(info[4][0].split("%")[0]))
                for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError, ValueError):
        return set()


def _guarded(host: str, guarded: set[str]) -> str | None:
    """Why a whole-scheme source does not allow ``host``, or None."""
    found = _resolve(host)
    if not found:
        return f"its host name {host} does not resolve"
    for text in sorted(found):
        address = ipaddress.ip_address(text)
        what = host if text == host.strip("[]") else f"{host} ({text})"
        if address.is_loopback or address.is_unspecified:
            return f"{what} is a loopback address"
        if address.is_link_local:
            return f"{what} is a link-local address"
        if text in guarded:
            return f"{what} is the cluster's own etcd"
    return None


def _http_refusal(parsed, sources, guarded) -> tuple[str | None, str | None]:
    source = _matching(parsed, sources)
    if source is None:
        return None, "is outside the image sources"
    if source.endswith("://"):           # a whole scheme: not the cluster's own
        why = _guarded(parsed.hostname, guarded)
        if why:
            return source, f"is refused: {why}; list its prefix in the image sources " \
                           f"to allow it"
    return source, None


def refusal(url, sources, state_dirs=(), guarded=frozenset()) -> str | None:
    """Why a boot may not use image ``url``, one line naming it once, or
    None: checked where the boot is planned, against ``sources``, the
    hosts' ``state_dirs`` (for relative sources) and the ``guarded``
    addresses (:func:`addresses_of_urls` of etcd's endpoints)."""
    try:
        scheme, parsed = _split(url)
    except ValueError as exc:
        return f"image {url!r}: {exc}"
    if scheme == "file":
        path = os.path.normpath(urllib.parse.unquote(parsed.path))
        if any(_under(path, d) for d in _directories(sources, state_dirs)):
            return None
        return f"image {url!r} is outside the image sources ({_listing(sources)})"
    _source, why = _http_refusal(parsed, sources, guarded)
    if why == "is outside the image sources":
        return f"image {url!r} {why} ({_listing(sources)})"
    return f"image {url!r} {why}" if why else None


def _listing(sources) -> str:
    return ("sources: " + ", ".join(sources) if sources else "no sources") + \
        "; see images sources"


def local_file(url: str, sources, state_dir: str) -> str:
    """The real path of file URL ``url`` on this host, symlinks and ``..``
    resolved, if it lies inside a source directory; else ``ValueError``
    with the refusal's line."""
    _scheme, parsed = _split(url)
    real = os.path.realpath(urllib.parse.unquote(parsed.path))
    allowed = [os.path.realpath(d) for d in _directories(sources, [os.path.abspath(state_dir)])]
    if not any(_under(real, d) for d in allowed):
        raise ValueError(f"image {url!r} is outside the image sources on this host "
                         f"({_listing(sources)})")
    return real


def check_fetch(url: str, sources, guarded=frozenset()) -> None:
    """``ValueError`` with the refusal's line unless http(s) URL ``url`` (a
    first request or a redirect's target) is allowed on this host."""
    why = refusal(url, sources, (), guarded)
    if why is None and _split(url)[0] == "file":
        why = f"image {url!r}: a redirect to a file is refused"
    if why:
        raise ValueError(why)
