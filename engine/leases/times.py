"""The times and durations people write for leases.

``T`` is an ISO 8601 date-time (``2026-12-01T08:00``, ``2026-12-01 08:00Z``,
``2026-12-01``; without a zone it is UTC), ``now``, or ``+DURATION``
(``+90s``, ``+30m``, ``+2h``, ``+7d``, ``+1d12h``) counted from ``now``.
Every parser raises :class:`UsageError` naming the bad value.
"""
from __future__ import annotations

import datetime as dt
import re
import time

from engine.errors import UsageError
from engine.wording import value

__all__ = ["parse_time", "parse_span", "iso", "human_span"]

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_span(text, what: str = "duration") -> float:
    """``90``, ``90s``, ``30m``, ``1d12h``, ``2w`` -> seconds (> 0)."""
    raw = str(text).strip().lower()
    pos, total = 0, 0.0
    while pos < len(raw):
        match = _PART.match(raw, pos)
        if match is None or match.end() == pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not raw or pos != len(raw) or total <= 0:
        raise UsageError(f"bad {what} {value(text)} (want a positive number with s, m, h, d "
                         "or w: 90s, 30m, 1d12h)")
    return total


def parse_time(text, what: str = "time", now: float | None = None) -> float:
    """``now``, ``+DURATION`` or an ISO date-time -> epoch seconds."""
    now = time.time() if now is None else now
    raw = str(text).strip()
    if raw.lower() == "now":
        return now
    if raw.startswith("+"):
        return now + parse_span(raw[1:], what)
    candidate = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    try:
        parsed = dt.datetime.fromisoformat(candidate)
    except ValueError:
        raise UsageError(f"bad {what} {value(text)} (want now, +DURATION such as +2h, or an "
                         "ISO date-time such as 2026-12-01T08:00Z)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()


def iso(t: float | None) -> str:
    """Epoch seconds as ``2026-12-01T08:00:00Z`` ('-' for None)."""
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_span(seconds: float) -> str:
    """``93784`` -> ``1d2h3m``; under a minute in seconds."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{max(seconds, 0)}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)
