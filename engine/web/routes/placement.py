"""The API's placement: providers, allocations, candidates."""
from __future__ import annotations

from engine.errors import UsageError

from .core import Answer, Call, HOSTGLOB, route

@route("GET", "/v1/placement/providers", "resource providers", "placement providers [HOSTGLOB]",
       query=HOSTGLOB)
def providers(ctx, call: Call) -> Answer:
    from engine.operations import placement
    return Answer(placement.providers(ctx, call.one("pattern")))


@route("GET", "/v1/placement/allocations", "allocations", "placement allocations [CONSUMER]",
       query=(("consumer", "string", "one consumer's uuid"),))
def allocations(ctx, call: Call) -> Answer:
    from engine.operations import placement
    return Answer(placement.allocations(ctx, call.one("consumer")))


@route("GET", "/v1/placement/candidates", "where a VM would fit",
       "placement candidates SPEC [--required TRAITS] [--limit N]",
       query=(("resources", "string", "SPEC, required"), ("required", "string", "traits"),
              ("limit", "integer", "at most this many")))
def candidates(ctx, call: Call) -> Answer:
    from engine.operations import placement
    spec = call.one("resources")
    if not spec:
        raise UsageError("query parameter resources is required (VCPU:1,MEMORY_MB:256,...)")
    limit = call.one("limit")
    if limit is not None:
        if not limit.isdigit() or int(limit) < 1:
            raise UsageError(f"bad limit {limit!r}: want a positive integer")
        limit = int(limit)
    return Answer(placement.candidates(ctx, spec, call.one("required"), limit))
