"""Values read from etcd are evidence, not truth: an operator's ``etcdctl
put``, an older or newer peerctl, or a bad disk can leave anything there.

Promises:
- decoding never raises: bytes that are not msgpack come back from the store
  as a :class:`Garbled` value (``engine.core.store`` uses :func:`decode`);
- :func:`readable` gives a key's value when it has the shape its kind of key
  must have, and otherwise ``None``, reporting the key;
- a key is reported once per process (a peer logs it once and carries on; a
  command prints one warning line on stderr, see :func:`set_reporter`);
- every kind of key declares its shape once, with :func:`declare`, in the
  room that writes it; :func:`shape_of` finds it for any key, which is what
  ``peerctl scrub`` walks the keyspace with.

    entry = readable(kv)                 # the shape declared for kv.key
    if entry is None:
        continue                         # skipped, and reported once
"""
from __future__ import annotations

import fnmatch
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

import msgpack
import structlog

from . import keys

__all__ = ["Garbled", "Shape", "shape", "decode", "readable", "problem", "declare", "shape_of",
           "set_reporter", "report", "MAPPING"]

log = structlog.get_logger("peerctl.values")


@dataclass(frozen=True)
class Garbled:
    """What a value that is not msgpack decodes to."""
    raw: bytes
    why: str


def decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:    # msgpack raises ValueError, ExtraData, FormatError, ...
        return Garbled(bytes(raw), f"not msgpack ({type(exc).__name__}: {exc})"[:200])


_NUMBER = (int, float)
_ABSENT = object()


@dataclass(frozen=True)
class Shape:
    """A mapping whose ``fields`` are present with these types (a tuple of
    types, or None for anything but absent).  Other fields are allowed: a
    newer peerctl may add some.  ``check(value)``, if given, returns what
    else is wrong, or None.  ``kind`` other than dict: a plain value."""
    name: str
    fields: tuple = ()
    check: Callable | None = None
    kind: type = dict

    def problem(self, value) -> str | None:
        if self.kind is dict and type(value) is dict and self.check is None:
            # The common case, in one pass: every field present, of exactly
            # one of its types (what msgpack decodes to).  Anything else
            # takes the full path below, which also says what is wrong.
            for field, types in self.fields:
                if types is None:
                    if field not in value:
                        break
                elif type(value.get(field, _ABSENT)) not in types:
                    break
            else:
                return None
        if isinstance(value, Garbled):
            return value.why
        if not isinstance(value, self.kind):
            want = "a mapping" if self.kind is dict else f"a {self.kind.__name__}"
            return f"not a {self.name} (a {type(value).__name__}, want {want})"
        if self.kind is not dict:
            return None
        for field, types in self.fields:
            if field not in value:
                return f"not a {self.name}: no {field!r}"
            if types is not None and (not isinstance(value[field], types)
                                      or isinstance(value[field], bool) and bool not in types):
                return (f"not a {self.name}: {field!r} is a "
                        f"{type(value[field]).__name__}")
        if self.check is not None:
            try:
                why = self.check(value)
            except Exception as exc:        # a check that trips over the value
                why = f"{type(exc).__name__}: {exc}"
            if why:
                return f"not a {self.name}: {why}"
        return None


def shape(name: str, check: Callable | None = None, plain: type = dict, /,
          **fields) -> Shape:
    """``shape("host record", host=str, vcpus=(int, float))``; ``check``:
    see :class:`Shape`; ``plain``: the type of a value that is no mapping."""
    return Shape(name, tuple((f, t if t is None or isinstance(t, tuple) else (t,))
                             for f, t in fields.items()), check, plain)


MAPPING = shape("mapping")
_ANYTHING = None
_SHAPES: list[tuple[str, Shape | None]] = []      # (key glob, shape), first match wins
_matcher = None     # every glob of _SHAPES in one regex, one group each; None: stale
_lock = threading.Lock()
_reported: set[str] = set()
_reporter: Callable[[str, str], None] | None = None


def declare(pattern: str, kind: Shape | None) -> None:
    """Keys matching ``pattern`` (a glob on the relative key; ``*`` spans
    ``/``) hold ``kind``; None: any value, even undecodable (election keys)."""
    global _matcher
    with _lock:
        _SHAPES.append((pattern, kind))
        _matcher = None


def _compiled():
    """One regex for all the globs, first declared first: every read checks
    a shape, so finding it is one match, not one per declared glob."""
    global _matcher
    matcher = _matcher
    if matcher is not None:         # every read comes here: no lock once built
        return matcher
    with _lock:
        if _matcher is None:
            _matcher = re.compile("|".join(f"({fnmatch.translate(pattern)})"
                                           for pattern, _ in _SHAPES) or "(?!)")
        return _matcher


def shape_of(key: str) -> Shape | None:
    match = _compiled().match(key)
    if match is None:
        return MAPPING
    return _SHAPES[match.lastindex - 1][1]


def problem(kv) -> str | None:
    """Why ``kv`` cannot be read, or None."""
    kind = shape_of(kv.key)
    if kind is None:
        return None
    return kind.problem(kv.value)


def set_reporter(fn: Callable[[str, str, bool], None] | None) -> None:
    """Where unreadable keys are reported, ``fn(key, why, skipped)``
    (default: one structured log line)."""
    global _reporter
    _reporter = fn


def report(key: str, why: str, skipped: bool = True) -> None:
    """``key`` cannot be read (once per key and process); ``skipped``
    False: only part of it, the rest is used."""
    with _lock:
        if key in _reported:
            return
        _reported.add(key)
    if _reporter is not None:
        _reporter(key, why, skipped)
    else:
        log.warning("unreadable_value", key=key, why=why, skipped=skipped)


def readable(kv, kind: Shape | None = None):
    """``kv``'s value if it has its shape (``kind``, else the declared one),
    else None (reported).  ``kv`` None gives None, unreported."""
    if kv is None:
        return None
    kind = kind if kind is not None else shape_of(kv.key)
    why = kind.problem(kv.value) if kind is not None else None
    if why is not None:
        report(kv.key, why)
        return None
    return kv.value


# -- the engine's own keys -------------------------------------------------------

TASK = shape("task summary", id=str, kind=str, state=str)
SPEC = shape("automation spec", id=str, kind=str, version=int, args=dict)
STATUS = shape("automation status", state=str)
LOG_ENTRY = shape("log entry", index=int, request=str, target=str, worker=str, seq=int,
                  fingerprint=str)
RESPONSE = shape("response", status=str)
CLAIM = shape("claim", executor=str)
INBOX_ENTRY = shape("inbox entry")
MEMBERSHIP = shape("membership")
HOST = shape("host record")
LOCK = shape("lock", owner=str)
DRAINED = shape("drained host", host=str)

_EVERY = "*"        # any automation id, in a key glob

for _pattern, _kind in (
        (keys.task() + "*", TASK), (keys.spec(_EVERY), SPEC), (keys.status(_EVERY), STATUS),
        (keys.log_entry(_EVERY) + "*", LOG_ENTRY), (keys.response(_EVERY) + "*", RESPONSE),
        (keys.claim(_EVERY) + "*", CLAIM),
        (keys.elect(_EVERY) + "*", _ANYTHING), (keys.abort(_EVERY), _ANYTHING),
        (keys.aborting(_EVERY), MAPPING), (keys.progress(_EVERY) + "*", MAPPING),
        (keys.wake(_EVERY) + "*", MAPPING),
        (keys.lock() + "*", LOCK), (keys.drained() + "*", DRAINED),
        (keys.singleton() + "*", _ANYTHING), (keys.member() + "*", MEMBERSHIP),
        (keys.inbox() + "*", INBOX_ENTRY), (keys.host() + "*", HOST),
        (keys.host_config() + "*", HOST)):
    declare(_pattern, _kind)
