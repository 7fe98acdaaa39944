"""Patterns, and choosing VMs and hosts by them, each written once.

A VM pattern is ``HOSTGLOB/VMGLOB`` or ``VMGLOB`` (on any host); a host
pattern is a glob on host names.  A bad pattern is a ``UsageError`` naming
the bad part, before anything is read.  A pattern matching nothing is a
:class:`NoMatch` naming it, which still carries what the others matched."""
from __future__ import annotations

import fnmatch

from engine.errors import NoSuch, UsageError
from engine.natural import natural_key

__all__ = ["check_glob", "host_pattern", "vm_pattern", "match_vms", "select_vms",
           "select_hosts", "NoMatch", "by_host_and_name"]


class NoMatch(NoSuch):
    """A pattern matched nothing: exit 1 naming it; ``matched`` is what the
    other patterns found (a listing still prints them)."""

    def __init__(self, message: str, matched: list | None = None, result=None):
        super().__init__(message, result=result)
        self.matched = matched or []


def check_glob(text: str, what: str) -> str:
    if not text:
        raise UsageError(f"empty {what}")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise UsageError(f"bad {what} {text!r}: whitespace or control character")
    depth = 0
    for c in text:
        if c == "[":
            depth += 1
        elif c == "]" and depth:
            depth -= 1
    if depth:
        raise UsageError(f"bad {what} {text!r}: unclosed '['")
    return text


def host_pattern(text: str | None) -> str:
    if text is None:
        return "*"
    if "/" in text:
        raise UsageError(f"bad host pattern {text!r}: a host pattern has no '/'")
    return check_glob(text, "host pattern")


def vm_pattern(text: str) -> tuple[str, str]:
    """``HOSTGLOB/VMGLOB`` or ``VMGLOB`` -> (hostglob, vmglob)."""
    if text.count("/") > 1:
        raise UsageError(f"bad VM pattern {text!r}: more than one '/' (want HOSTGLOB/VMGLOB)")
    if "/" in text:
        host, vm = text.split("/")
        if not host or not vm:
            raise UsageError(f"bad VM pattern {text!r}: empty {'host' if not host else 'VM'} part")
        return check_glob(host, "VM pattern"), check_glob(vm, "VM pattern")
    return "*", check_glob(text, "VM pattern")


def match_vms(vms: list[dict], patterns: list[str], by_uuid: bool = False
              ) -> tuple[list[dict], list[str]]:
    """VMs matching any pattern (in listing order, each once) and the
    patterns matching none.  ``by_uuid``: a VMGLOB may also be a uuid."""
    parsed = [(p, vm_pattern(p)) for p in patterns]
    hits, unmatched = {}, []
    for text, (hglob, vglob) in parsed:
        found = False
        for vm in vms:
            if fnmatch.fnmatchcase(vm.get("host") or "", hglob) and (
                    fnmatch.fnmatchcase(vm.get("name") or "", vglob)
                    or (by_uuid and vm.get("uuid") == vglob)):
                hits[(vm.get("host"), vm.get("uuid"), vm.get("name"), vm.get("id"))] = vm
                found = True
        if not found:
            unmatched.append(text)
    return list(hits.values()), unmatched


def by_host_and_name(rows: list[dict]) -> list[dict]:
    """Rows in natural order of host, then name."""
    return sorted(rows, key=lambda row: (natural_key(row.get("host") or ""),
                                         natural_key(row.get("name") or "")))


def select_vms(read, patterns: list[str], what: str = "VM", key: str = "vms",
               by_uuid: bool = False) -> list[dict]:
    """The VMs (or rows with host and name) ``read()`` gives that match
    ``patterns``, sorted naturally; every bad pattern is a ``UsageError``
    before ``read`` is called; :class:`NoMatch` names every pattern that
    matched nothing."""
    for text in patterns:
        vm_pattern(text)
    chosen, unmatched = match_vms(read(), patterns, by_uuid)
    chosen = by_host_and_name(chosen)
    if unmatched:
        raise NoMatch(f"no {what} matches " + ", ".join(repr(p) for p in unmatched),
                      matched=chosen, result={"automation": None, "state": "failed", key: []})
    return chosen


def select_hosts(read, glob_text: str | None, what: str = "host",
                 result=None) -> list[dict]:
    """The host records (or rows with a host) ``read()`` gives whose host
    matches the host pattern ``glob_text`` (all when None); a bad pattern is
    a ``UsageError`` before ``read`` is called; :class:`NoMatch` when a
    pattern given matches none."""
    glob = host_pattern(glob_text)
    chosen = [h for h in read() if fnmatch.fnmatchcase(h.get("host") or "", glob)]
    if not chosen and glob_text is not None:
        raise NoMatch(f"no {what} matches {glob_text!r}", result=result)
    return chosen
