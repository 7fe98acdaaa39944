"""``ping``: answers with the host's name and clock, to measure round trips."""
import time

from engine.core.handlers import handler


@handler("ping")
def ping(host, args):
    return {"host": host.host, "round": args.get("round"), "time": time.time()}


@handler("noop")
def noop(host, args):
    """Does nothing: the benchmark's unit of replicated work."""
    return {}
