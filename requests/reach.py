"""``reach_listen`` and ``reach``: a host's half of ``cluster verify``'s pair
checks (:mod:`engine.hypervisor.host.probes`).  Both are idempotent: run
twice, a listener only stays open longer, probes are asked again."""
from engine.core.handlers import handler
from engine.hypervisor.host import probes


@handler("reach_listen")
def reach_listen(host, args):
    """Read this host's clock, then open its migration port (``address``,
    ``port``; none named: nothing to open) for ``hold`` seconds."""
    clock = probes.clock()
    error = None
    if args.get("address") and args.get("port"):
        error = probes.listen(args["address"], int(args["port"]), float(args.get("hold") or 10))
    return {"host": host.host, "clock": clock, "listen_error": error}


@handler("reach")
def reach(host, args):
    """TCP-connect to each of ``targets`` (``[{address, port, ...}]``) at once."""
    return {"host": host.host,
            "results": probes.probe(args.get("targets") or [],
                                    float(args.get("timeout") or probes.CONNECT_TIMEOUT))}
