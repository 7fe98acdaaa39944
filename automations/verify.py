"""``verify_reach``: ``cluster verify``'s pair checks and clock readings,
run by every live host at once.

1. ``reach_listen`` on every host: it reads its clock, then opens its
   migration port to the others' probes for ``hold`` seconds (nothing
   listens there between migrations, and a probe must meet a listener);
2. ``reach`` on every host that answered: it TCP-connects to the others'
   ``endpoints`` (``{host: [{what, address, port}]}``: their libvirt and
   migration ports; with ``only``, a host other than ``only`` probes
   ``only``'s alone), all at once, ``timeout`` seconds each.

Two rounds, each a round trip whatever the number of hosts.  Nothing fails
the automation: a host that did not answer is in the result with its
status, and ``cluster verify`` says so.  Every step is idempotent, so a new
initiator resumes from the log.

The result: ``{hosts: {host: {status, error, clock, sent, received,
listen_error, results: [{host, what, address, port, ok, error}]}}}``.  ``sent`` (when
the host was asked its clock) and ``received`` (a local ``ping`` as soon as
its answer was in) are the initiator's clock, so each host's clock was read
between its ``sent`` and ``received``.
"""
from engine.core.registry import automation
from engine.core.replay import Request

HOLD = 15.0         # seconds a migration port stays open to the probes
DEADLINE = 5.0      # seconds a host has to answer round 1


def _opened(ctx, host, listen, hold, deadline):
    """Round 1 on one host: its clock and its migration port opened, then
    the initiator's own clock (a local ``ping``) as soon as it answered."""
    address, port = listen or (None, None)
    answer = yield Request("reach_listen", {"address": address, "port": port, "hold": hold},
                           target=host, deadline=deadline, label=host)
    if not answer.ok:
        return {"status": answer.status, "error": answer.error, "results": None}
    stamp = yield Request("ping", {"round": 0}, label=host)
    return {"status": "ok", "error": None, "results": None,
            "clock": answer.value.get("clock"), "sent": answer.requested,
            "received": (stamp.value or {}).get("time") if stamp.ok else None,
            "listen_error": answer.value.get("listen_error")}


def targets_of(host, endpoints, only=None):
    """The endpoints ``host`` probes: every other host's (only ``only``'s
    when named and ``host`` is not ``only``), each naming whose it is."""
    return [dict(endpoint, host=there) for there, theirs in sorted(endpoints.items())
            if there != host and only in (None, host, there) for endpoint in theirs]


@automation("verify_reach", version=1)
def verify_reach(ctx, hosts, listen, endpoints, only=None, timeout=1.0, hold=HOLD,
                 deadline=DEADLINE):
    opened = yield ctx.all([ctx.worker(_opened, h, listen.get(h), hold, deadline, label=h)
                            for h in hosts])
    found = dict(zip(hosts, opened))
    answered = [h for h in hosts if found[h]["status"] == "ok"]
    if answered:
        reached = yield ctx.all([Request("reach", {"targets": targets_of(h, endpoints, only),
                                                   "timeout": timeout},
                                         target=h, deadline=deadline + timeout, label=h)
                                 for h in answered])
        for host, answer in zip(answered, reached):
            if answer.ok:
                found[host]["results"] = answer.value.get("results") or []
            else:
                found[host].update(status=answer.status, error=answer.error)
    return {"hosts": found}
