"""The VM requests: ``build``, ``start``, ``stop``, ``reboot``, ``suspend``,
``resume``, ``destroy``, ``disown``, ``set_ha``, ``ha_start`` and ``vm_info``, each the function of the
same name in :mod:`engine.hypervisor.vm` (arguments and promises there);
and ``claim_vms``, boot's first claims of several VMs in one step (below)."""
from concurrent.futures import ThreadPoolExecutor

from engine.core.handlers import HANDLERS, handler
from engine.errors import RequestError
from engine.hypervisor import vm
from engine.placement import together

for _name in ("build", "start", "stop", "reboot", "suspend", "resume", "destroy", "disown",
              "set_ha", "ha_start", "vm_info"):
    handler(_name)(getattr(vm, _name))

MAX_CLAIMS = 64         # claims in one claim_vms step
# Claims of this peer in flight at once, over all its claim_vms steps: as
# many as placement writes in one transaction.
_claimers = ThreadPoolExecutor(max_workers=together.LIMIT, thread_name_prefix="claim")


@handler("claim_vms")
def claim_vms(host, args: dict) -> dict:
    """``{claims: [claim args, ...]}`` -> ``{claims: [reply, ...]}``, in order:
    each the ``claim`` request's reply for one VM (``{consumer, host,
    allocations}``), or ``{consumer, error}`` where that claim was refused.

    Each is exactly the ``claim`` request, with its guarantees, made in a
    thread of its own: placement writes the claims made at the same time in
    one transaction (:mod:`engine.placement.together`), so a step's claims,
    and those of the steps running beside it, land in a few transactions
    instead of one step each.  Idempotent as ``claim`` is, by consumer: sent
    again, each finds what it holds.  A failure that is no refusal (etcd
    away) fails the whole step, which the executor runs again as it would
    a ``claim``."""
    claims = args.get("claims")
    if not isinstance(claims, list) or not 0 < len(claims) <= MAX_CLAIMS \
            or not all(isinstance(c, dict) for c in claims):
        raise RequestError(f"claims must be a list of 1 to {MAX_CLAIMS} claims, "
                           f"got {str(claims)[:80]}")
    claim = HANDLERS["claim"]

    def one(args: dict) -> dict:
        try:
            return claim(host, args)
        except RequestError as exc:
            return {"consumer": args.get("consumer"), "error": str(exc)}
    return {"claims": [made.result() for made in [_claimers.submit(one, c) for c in claims]]}
