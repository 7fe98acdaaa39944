"""The VM requests: ``build``, ``start``, ``stop``, ``reboot``, ``suspend``,
``resume``, ``destroy``, ``disown``, ``set_ha``, ``ha_start`` and ``vm_info``, each the function of the
same name in :mod:`engine.hypervisor.host.vm` (arguments and promises there);
and ``claim_vms``, boot's first claims of several VMs in one step (below)."""
from concurrent.futures import ThreadPoolExecutor

from engine.core.handlers import HANDLERS, handler
from engine.errors import RequestError
from engine.hypervisor.host import vm
from engine.leases.events import unreserved_each
from engine.placement import for_request, together

for _name in ("build", "start", "stop", "reboot", "suspend", "resume", "destroy", "disown",
              "set_ha", "ha_start", "vm_info"):
    handler(_name)(getattr(vm, _name))

MAX_CLAIMS = 64         # claims in one claim_vms step
# Claims of this peer that go alone (the batch could not make them), in
# flight at once over all its claim_vms steps.
_claimers = ThreadPoolExecutor(max_workers=together.LIMIT, thread_name_prefix="claim")


@handler("claim_vms")
def claim_vms(host, args: dict) -> dict:
    """``{claims: [claim args, ...]}`` -> ``{claims: [reply, ...]}``, in order:
    each the ``claim`` request's reply for one VM (``{consumer, host,
    allocations}``), or ``{consumer, error}`` where that claim was refused.

    Each is exactly the ``claim`` request, with its guarantees.  The plain
    ones (a VM's first claim: resources, no group, no allocations given)
    are handed to placement at once from this thread
    (:func:`engine.placement.together.claim_many`), the reserved hosts read
    once for the step: they land, with the claims of the steps running
    beside, in a few transactions.  What the batch could not make, and
    every other claim, is the ``claim`` request itself, in a thread of its
    own.  Idempotent as ``claim`` is, by consumer: sent again, each finds
    what it holds.  A failure that is no refusal (etcd away) fails the
    whole step, which the executor runs again as it would a ``claim``."""
    claims = args.get("claims")
    if not isinstance(claims, list) or not 0 < len(claims) <= MAX_CLAIMS \
            or not all(isinstance(c, dict) for c in claims):
        raise RequestError(f"claims must be a list of 1 to {MAX_CLAIMS} claims, "
                           f"got {str(claims)[:80]}")
    replies: list = [None] * len(claims)
    new = _new_claims(host, claims)
    for index, done in zip(new, together.claim_many(host.store, list(new.values()))):
        replies[index] = done
    claim = HANDLERS["claim"]

    def one(args: dict) -> dict:
        try:
            return claim(host, args)
        except RequestError as exc:
            return {"consumer": args.get("consumer"), "error": str(exc)}
    alone = {index: _claimers.submit(one, claims[index])
             for index, reply in enumerate(replies) if reply is None}
    for index, made in alone.items():
        replies[index] = made.result()
    return {"claims": replies}


def _new_claims(host, claims: list) -> dict:
    """index -> :class:`~engine.placement.together.NewClaim` for each claim
    that the ``claim`` request would hand to placement's batches (etcd
    backend, resources asked, no group, no allocations given), as it would
    make it; the reserved hosts are read once per distinct ``required``."""
    with for_request(host.store) as placement:
        if placement.backend != "etcd":
            return {}
    unreserved = unreserved_each(host.store)
    new = {}
    for index, args in enumerate(claims):
        query = together.query_of(args)
        if (args.get("allocations") or args.get("group") or query is None
                or not isinstance(args.get("consumer"), str)
                or not isinstance(args.get("required"), (str, type(None)))):
            continue
        new[index] = together.NewClaim.of_request(args, query, unreserved(args.get("required")))
    return new
