"""Allocation candidate queries: Placement's query language, parsed once.

Two spellings are accepted and give the same :class:`Query`:

- Placement's own (microversion 1.39):
  ``resources=VCPU:1,MEMORY_MB:256&required=HW_CPU_X86_AVX2,!CUSTOM_SLOW``
  ``&member_of=in:AGG1,AGG2&in_tree=UUID&resources1=VGPU:1&required1=...``
  ``&group_policy=isolate&root_required=...&limit=5``;
- the command line's short spec ``VCPU:1,MEMORY_MB:256,DISK_GB:1`` with the
  required traits as a separate ``HW_CPU_X86_AVX2,!CUSTOM_SLOW`` string.

Malformed input raises :class:`PlacementError` naming the bad part.  Whether a
CUSTOM_ class exists is the backend's business, not the parser's.
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from engine.placement.model import (PlacementError, check_resource_class_name,
                                    check_trait_name, check_uuid)

__all__ = ["Query", "RequestGroup", "parse_query", "parse_resources"]

_GROUP_KEY = re.compile(r"^(resources|required|member_of|in_tree)([A-Za-z0-9_-]{1,64})?$")


@dataclass
class RequestGroup:
    """One request group: ``suffix`` '' is the unnumbered group.

    ``required`` is a list of any-of sets (all sets must hold); ``member_of``
    a list of ``(aggregates, negated)``: in one of them (or in none, negated).
    """
    suffix: str = ""
    resources: dict = field(default_factory=dict)
    required: list = field(default_factory=list)
    forbidden: set = field(default_factory=set)
    member_of: list = field(default_factory=list)
    in_tree: str | None = None


@dataclass
class Query:
    groups: list
    group_policy: str | None = None
    limit: int | None = None
    root_required: set = field(default_factory=set)
    root_forbidden: set = field(default_factory=set)

    @property
    def resource_classes(self) -> set:
        return {rc for g in self.groups for rc in g.resources}

    def to_params(self) -> list[tuple[str, str]]:
        """Back to Placement's query string parameters (for the REST backend)."""
        params = []
        for g in self.groups:
            s = g.suffix
            params.append(("resources" + s, ",".join(f"{rc}:{n}" for rc, n in g.resources.items())))
            plain = [next(iter(any_of)) for any_of in g.required if len(any_of) == 1]
            plain += ["!" + t for t in sorted(g.forbidden)]
            if plain:
                params.append(("required" + s, ",".join(plain)))
            for any_of in g.required:
                if len(any_of) > 1:
                    params.append(("required" + s, "in:" + ",".join(sorted(any_of))))
            for aggs, negated in g.member_of:
                params.append(("member_of" + s, ("!" if negated else "") + "in:" + ",".join(sorted(aggs))))
            if g.in_tree:
                params.append(("in_tree" + s, g.in_tree))
        if self.group_policy:
            params.append(("group_policy", self.group_policy))
        roots = sorted(self.root_required) + ["!" + t for t in sorted(self.root_forbidden)]
        if roots:
            params.append(("root_required", ",".join(roots)))
        if self.limit:
            params.append(("limit", str(self.limit)))
        return params


def parse_resources(text: str, where: str = "resources") -> dict:
    """``VCPU:1,MEMORY_MB:256`` -> ``{"VCPU": 1, "MEMORY_MB": 256}``."""
    if not isinstance(text, str) or not text.strip():
        raise PlacementError(f"{where}: no resources given (want e.g. VCPU:1,MEMORY_MB:256)")
    resources = {}
    for item in text.split(","):
        rc, sep, amount = item.strip().partition(":")
        if not sep or not rc:
            raise PlacementError(f"{where}: bad item {item!r} (want CLASS:AMOUNT)")
        check_resource_class_name(rc)
        try:
            value = int(amount)
        except ValueError:
            raise PlacementError(f"{where}: amount of {rc} is not an integer: {amount!r}") from None
        if value < 1:
            raise PlacementError(f"{where}: amount of {rc} must be >= 1, not {value}")
        if rc in resources:
            raise PlacementError(f"{where}: {rc} given twice")
        resources[rc] = value
    return resources


def _traits(text: str, where: str, group: RequestGroup | None = None) -> tuple[list, set]:
    """``A,!B`` or ``in:A,B`` -> (required any-of sets, forbidden)."""
    text = text.strip()
    if text.startswith("in:"):
        names = {check_trait_name(t.strip()) for t in text[3:].split(",")}
        if any(n.startswith("!") for n in names) or not names:
            raise PlacementError(f"{where}: bad any-of list {text!r}")
        return [names], set()
    required, forbidden = [], set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise PlacementError(f"{where}: empty trait in {text!r}")
        if item.startswith("!"):
            forbidden.add(check_trait_name(item[1:]))
        else:
            required.append({check_trait_name(item)})
    clash = {t for s in required for t in s} & forbidden
    if clash:
        raise PlacementError(f"{where}: trait(s) {sorted(clash)} both required and forbidden")
    return required, forbidden


def _member_of(text: str, where: str) -> tuple[set, bool]:
    text = text.strip()
    negated = text.startswith("!")
    if negated:
        text = text[1:]
    if text.startswith("in:"):
        text = text[3:]
    aggs = {check_uuid(a.strip(), f"aggregate in {where}") for a in text.split(",")}
    return aggs, negated


def _positive(value: str, where: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise PlacementError(f"{where} must be an integer, not {value!r}") from None
    if number < 1:
        raise PlacementError(f"{where} must be >= 1, not {number}")
    return number


def parse_query(spec, required: str | None = None, limit: int | None = None) -> Query:
    """Parse either spelling; ``required`` and ``limit`` add to the unnumbered group."""
    if isinstance(spec, Query):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise PlacementError("empty query: want e.g. VCPU:1,MEMORY_MB:256 or resources=VCPU:1")
    spec = spec.strip().lstrip("?")
    groups: dict[str, RequestGroup] = {}
    query = Query(groups=[])
    if "=" not in spec:
        groups[""] = RequestGroup(resources=parse_resources(spec, "resource spec"))
    else:
        seen_resources = set()
        pairs = urllib.parse.parse_qsl(spec, keep_blank_values=True, strict_parsing=False)
        if not pairs:
            raise PlacementError(f"malformed query {spec!r}")
        for key, value in pairs:
            if key == "limit":
                query.limit = _positive(value, "limit")
                continue
            if key == "group_policy":
                if value not in ("none", "isolate"):
                    raise PlacementError(f"group_policy must be none or isolate, not {value!r}")
                query.group_policy = value
                continue
            if key == "root_required":
                req, forb = _traits(value, "root_required")
                if any(len(s) > 1 for s in req):
                    raise PlacementError("root_required does not take in: lists")
                query.root_required |= {t for s in req for t in s}
                query.root_forbidden |= forb
                continue
            match = _GROUP_KEY.match(key)
            if not match:
                raise PlacementError(f"unknown query parameter {key!r}")
            kind, suffix = match.group(1), match.group(2) or ""
            group = groups.setdefault(suffix, RequestGroup(suffix=suffix))
            if kind == "resources":
                if suffix in seen_resources:
                    raise PlacementError(f"{key} given twice")
                seen_resources.add(suffix)
                group.resources = parse_resources(value, key)
            elif kind == "required":
                req, forb = _traits(value, key)
                group.required += req
                group.forbidden |= forb
            elif kind == "member_of":
                group.member_of.append(_member_of(value, key))
            else:
                if group.in_tree:
                    raise PlacementError(f"{key} given twice")
                group.in_tree = check_uuid(value, key)
    if required:
        group = groups.setdefault("", RequestGroup())
        req, forb = _traits(required, "required traits")
        group.required += req
        group.forbidden |= forb
    if limit is not None:
        query.limit = _positive(str(limit), "limit")
    for group in groups.values():
        if not group.resources:
            name = "resources" + group.suffix
            raise PlacementError(f"{name} missing: traits, member_of or in_tree given "
                                 "without resources in the same group")
        clash = {t for s in group.required for t in s if len(s) == 1} & group.forbidden
        if clash:
            raise PlacementError(f"trait(s) {sorted(clash)} both required and forbidden")
    numbered = [s for s in groups if s]
    if len(numbered) > 1 and not query.group_policy:
        raise PlacementError("group_policy (none or isolate) is required with more than "
                             "one numbered request group")
    query.groups = [groups[s] for s in sorted(groups, key=lambda s: (s != "", s))]
    return query
