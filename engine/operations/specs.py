"""Names, resource specs and traits as a user writes them, checked: a bad
one is a ``UsageError`` naming the bad part."""
from __future__ import annotations

import re

from engine.errors import PlacementError, UsageError
from engine.wording import given, value

__all__ = ["check_name", "check_names", "parse_resources", "parse_traits", "hostname_of"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_RC = re.compile(r"^[A-Z][A-Z0-9_]*$")


def check_name(name: str, what: str = "VM name") -> str:
    """A VM or host name: letters, digits, '.', '_', '-', no wildcards."""
    if not _NAME.match(name):
        raise UsageError(f"bad {what} {name!r} (letters, digits, '.', '_', '-'; no wildcards)")
    return name


def check_names(names: list[str]) -> list[str]:
    """VM names to create: each well formed, none twice."""
    for name in names:
        check_name(name)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UsageError("VM name given more than once: " + ", ".join(twice))
    return names


def parse_resources(spec: str, required: str | None = None) -> tuple[dict, list]:
    """``VCPU:1,MEMORY_MB:256`` or ``resources=...&required=...`` plus ``--required``
    -> (resources, traits) with forbidden traits as ``!TRAIT``.

    Placement's own parser reads it, so that the command line and the
    placement service agree on one grammar; boot takes one request group."""
    parse_traits(required)      # a bad --required is blamed on the traits, not the spec
    from engine.placement.query import parse_query     # no store, no grpc
    try:
        query = parse_query(spec)
    except PlacementError as exc:
        raise UsageError(f"bad resource spec {value(spec)}: {exc}") from None
    if required:
        try:
            query = parse_query(spec, required=required)
        except PlacementError as exc:
            raise UsageError(f"bad {given('required', required)}: {exc}") from None
    group = query.groups[0]
    traits = [next(iter(any_of)) for any_of in group.required if len(any_of) == 1]
    if len(query.groups) > 1 or len(traits) != len(group.required) or group.member_of \
            or group.in_tree or query.root_required or query.root_forbidden:
        raise UsageError(f"bad resource spec {spec!r}: boot takes one request group of "
                         "resources and required traits")
    return dict(group.resources), traits + ["!" + t for t in sorted(group.forbidden)]


def parse_traits(text: str | None) -> list[str]:
    traits = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        if not _RC.match(part.lstrip("!")) or part.count("!") > 1:
            raise UsageError(f"bad trait {part!r} (want TRAIT or !TRAIT, e.g. HW_CPU_X86_AVX2)")
        traits.append(part)
    return traits


def hostname_of(name: str) -> str:
    """A VM name made a hostname: lower case, other characters as '-'."""
    label = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:63].strip("-")
    return label or "vm"
