"""The requests of ``adopt`` and ``unmanage``: ``adopt_survey``,
``adopt_take`` and ``let_go`` are the functions of
:mod:`engine.hypervisor.host.adoption` (arguments and promises there);
``adopt_claim`` claims a foreign domain's size where it runs.

``adopt_claim`` ``{consumer, resources: {RC: n}, project?}`` -> ``{consumer,
host, allocations}``, run on the domain's host.  While the domain is
foreign, what it holds is in the host provider's ``reserved``
(:mod:`engine.hypervisor.host.accounting`).  Under the host's accounting lock,
reserved is lowered by the domain's share and the claim made on this host's
provider; a claim that does not fit puts reserved back and is refused, so
the domain is counted once at every moment, never twice and (but for the
instant between the two writes) never not at all.  Idempotent: a consumer
that holds allocations already gets them back.
"""
from engine.core.handlers import handler
from engine.errors import RequestError
from engine.hypervisor.host import accounting, adoption
from engine.placement import for_request
from engine.placement.host import register_host
from engine.placement.model import Conflict

for _name, _fn in (("adopt_survey", adoption.survey), ("adopt_take", adoption.take),
                   ("let_go", adoption.let_go)):
    handler(_name)(_fn)


def _reserve(host, placement, excluded=()) -> dict:
    return register_host(placement, host.host, host.conn, state_dir=host.state_dir,
                         reserved=accounting.reserved_for(host, placement, excluded))


@handler("adopt_claim")
def adopt_claim(host, args: dict) -> dict:
    consumer = args.get("consumer")
    resources = args.get("resources")
    if not isinstance(resources, dict) or not resources:
        raise RequestError(f"adopt_claim needs resources {{RC: n}}, got {resources!r}")
    with for_request(host.store) as placement:
        held = placement.allocations(consumer)
        if held["allocations"]:
            return {"consumer": consumer, "host": host.host, "allocations": held["allocations"]}
        with accounting.lock(host.host):
            provider = _reserve(host, placement, {consumer})
            wanted = {rc: n for rc, n in resources.items()
                      if n and rc in provider["inventories"]}
            try:
                doc = placement.claim(consumer, {provider["uuid"]: wanted},
                                      project=args.get("project") or "peerctl", user="peerctl")
            except Conflict as exc:
                _reserve(host, placement)
                raise RequestError(f"its claim does not fit on {host.host} ({exc}): "
                                   f"{_fits(provider, wanted)}") from None
        return {"consumer": consumer, "host": host.host, "allocations": doc["allocations"]}


def _fits(provider: dict, wanted: dict) -> str:
    """What the host has left against what the domain needs, per class."""
    from engine.placement.model import capacity
    parts = []
    for rc, n in sorted(wanted.items()):
        inventory = provider["inventories"][rc]
        free = capacity(inventory) - provider["usages"].get(rc, 0)
        parts.append(f"{rc} {n} wanted, {free} free")
    return ", ".join(parts)
