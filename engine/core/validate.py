"""The checks of input that both the command line and the engine take: one
function per kind of input, so that a value the command line accepts is one
the engine can use, and the other way round.

Cheap to import (the standard library and ``engine.errors`` only), so the
command line can check its settings before it loads anything else.  Every
check raises :class:`~engine.errors.UsageError` naming the bad part.

    parse_endpoints("http://10.0.0.1:2379,10.0.0.2")  # [("10.0.0.1", 2379), ("10.0.0.2", 2379)]
    parse_duration("30m")                             # 1800.0
"""
from __future__ import annotations

import math
import re
import urllib.parse

from engine.errors import UsageError

__all__ = ["parse_endpoints", "endpoint_scheme", "parse_duration", "parse_size",
           "DEFAULT_ETCD_PORT"]

DEFAULT_ETCD_PORT = 2379


def parse_endpoints(text: str, where: str = "") -> list[tuple[str, int]]:
    """Comma-separated ``http://HOST[:PORT]``, ``https://HOST[:PORT]`` (or
    ``HOST[:PORT]``) -> ``[(host, port), ...]``; ``where`` says where the
    text came from (``from --etcd``), for the message when it names no
    endpoint.  All endpoints speak one scheme (:func:`endpoint_scheme`)."""
    urls = [url.strip() for url in text.split(",") if url.strip()]
    if not urls:
        raise UsageError(f"no etcd endpoint given ({text!r}{' ' + where if where else ''})")
    endpoints = []
    for url in urls:
        try:
            parsed = urllib.parse.urlparse(url if "//" in url else "http://" + url)
            host, port = parsed.hostname, parsed.port
        except ValueError as exc:       # 'Invalid IPv6 URL', 'Port out of range 0-65535'
            raise UsageError(f"bad etcd endpoint {url!r}: {exc}") from None
        if parsed.scheme not in ("http", "https", "") or not host:
            raise UsageError(f"bad etcd endpoint {url!r}: want http://HOST:PORT "
                             "or https://HOST:PORT")
        if port == 0:
            raise UsageError(f"bad etcd endpoint {url!r}: port 0")
        endpoints.append((host, port or DEFAULT_ETCD_PORT))
    endpoint_scheme(text)
    return endpoints


def endpoint_scheme(text: str) -> str:
    """``"https"`` when the endpoints are TLS ones, else ``"http"``; a list
    mixing both is a usage error (one client speaks one of them)."""
    schemes = {url.strip().split("://", 1)[0].lower() if "://" in url else "http"
               for url in text.split(",") if url.strip()}
    if len(schemes) > 1:
        raise UsageError(f"etcd endpoints {text!r} mix http:// and https://")
    return schemes.pop() if schemes else "http"


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value, what: str = "duration", where: str = "") -> float:
    """``3600``, ``"45s"``, ``"30m"``, ``"12h"``, ``"7d"`` -> seconds, never
    negative; ``what`` and ``where`` name the value in the message
    (``bad retention '-1d' in conf/peerctl.conf (...)``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value >= 0:
        return float(value)
    match = _DURATION.fullmatch(str(value).strip().lower())
    if match is None:
        raise UsageError(f"bad {what} {value!r}{' ' + where if where else ''} (want seconds, "
                         "or a number with s, m, h or d: 3600, 30m, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?")


def parse_size(value, what: str = "size", where: str = "") -> int:
    """``2147483648``, ``"2G"``, ``"512MiB"`` -> bytes (powers of 1024)."""
    match = _SIZE.fullmatch(str(value).strip().lower())
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(f"bad {what} {value!r}{' ' + where if where else ''} (want bytes, "
                         "or a number with K, M, G or T: 2G, 512M)")
    return int(float(match.group(1)) * 1024 ** "_kmgt".index(match.group(2) or "_"))
