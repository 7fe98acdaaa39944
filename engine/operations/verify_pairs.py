"""``cluster verify``'s checks made from the hosts themselves: every live
host probes every other host's libvirt and migration port, and says its
clock, through one ``verify_reach`` automation (``automations/verify.py``).

Promises:
- ``reach``: one problem per failing pair and endpoint, named from where it
  was tried: ``h1 cannot reach h3's libvirt at 10.0.0.13:16514: connection
  refused``; a host that did not answer, or could not open its migration
  port to the probes, is one line.  An endpoint a host does not have (a
  libvirt reached by ``test:///default``, ``qemu:///system``, a UNIX
  socket; no migration address published) is *skipped*, listed apart, never
  a problem;
- ``clock``: each host's clock is read between two moments of the
  automation's initiator (when the host was asked, and as soon as its
  answer was in), so its offset from the initiator is known within half that
  window (NTP's midpoint).  The reference is the median of the hosts'
  offsets (the lower middle one: always one host's clock), so one wrong
  clock, the initiator's included, cannot move it.  etcd offers no clock of
  its own to a client, finer than its HTTP ``Date`` header's whole second;
  and its leases run on its leader's monotonic clock, so no wall clock
  matters to it.  A host is reported only when its skew exceeds
  :data:`MAX_SKEW` by more than the uncertainty of the measure: a slow round
  trip hides a small skew rather than inventing one;
- with ``only`` (``join``'s check of one host), that host probes every other
  and every other probes it alone; the clocks of all are read (the median
  needs them), and only problems about that host are said.
"""
from __future__ import annotations

import statistics

from engine.hypervisor.host.reachability import libvirt_endpoint, migration_endpoint, reached_at

from .plans import Plan

__all__ = ["check_from_hosts", "MAX_SKEW", "WAIT"]

MAX_SKEW = 0.5          # seconds
WAIT = 30.0             # seconds verify follows the automation (its rounds: 5 s + 6 s at most)
_ENDPOINTS = (("libvirt", libvirt_endpoint), ("migration port", migration_endpoint))


def _plan(live: list[dict]):
    """(listen, endpoints, skipped): each host's migration endpoint it opens,
    each host's endpoints the others probe, and those it has not."""
    listen = {h["host"]: list(migration_endpoint(h) or ()) or None for h in live}
    endpoints: dict[str, list[dict]] = {h["host"]: [] for h in live}
    skipped = []
    for there in live:
        for what, endpoint_of in _ENDPOINTS:
            endpoint = endpoint_of(there)
            if endpoint is not None:
                endpoints[there["host"]].append({"what": what, "address": endpoint[0],
                                                 "port": endpoint[1]})
            elif len(live) > 1:
                skipped.append({"host": there["host"], "what": what,
                                "why": _no_endpoint(there, what)})
    return listen, endpoints, skipped


def _no_endpoint(record: dict, what: str) -> str:
    if what == "libvirt":
        return f"reached at {reached_at(record)}, which has no TCP endpoint"
    return "it publishes no migration_address"


def check_from_hosts(ctx, live: list[dict], say, only: str | None = None) -> dict:
    """Run the checks on the ``live`` host records; ``say(check, host,
    problem, peer=None)`` each problem.  ``{skipped: [{host, what, why}],
    clocks: [{host, offset_s, within_s}], reference, automation}``."""
    from engine.errors import Failed, PermissionDenied
    from .tasks import follow, start
    listen, endpoints, skipped = _plan(live)
    done = {"skipped": skipped, "clocks": [], "reference": None, "automation": None}
    hosts = sorted(endpoints)
    if not hosts:
        return done
    try:
        automation = start(ctx, Plan("verify_reach", {"hosts": hosts, "listen": listen,
                                                      "endpoints": endpoints, "only": only},
                                     [], key="hosts"))
    except (Failed, PermissionDenied) as exc:     # no live peer; a viewer starts nothing
        say("reach", only, f"the hosts' reachability and clocks were not checked: "
                           f"{str(exc).splitlines()[0]}")
        return done
    done["automation"] = automation
    task = {}
    for task in follow(ctx, automation, timeout=WAIT):
        pass
    if task.get("state") != "done":
        say("reach", only, f"the hosts' reachability and clocks were not checked: automation "
                           f"{automation} is {task.get('state')} after {WAIT:g} s"
                           + (f" ({task['error']})" if task.get("error") else ""))
        return done
    found = (task.get("result") or {}).get("hosts") or {}
    _reach(found, only, say)
    _clocks(found, only, say, done)
    return done


def _reach(found: dict, only, say) -> None:
    for here, answer in sorted(found.items()):
        if answer.get("status") != "ok":
            if only in (None, here):
                say("reach", here, f"host {here} did not answer the reachability check: "
                                   f"{answer.get('error') or answer.get('status')}")
            continue
        if answer.get("listen_error") and only in (None, here):
            say("reach", here, f"host {here} cannot open its migration port to the probes: "
                               f"{answer['listen_error']}")
        for result in answer.get("results") or ():
            if not result.get("ok"):
                there, at = result.get("host"), _at(result["address"], result["port"])
                say("reach", here, f"{here} cannot reach {there}'s {result.get('what')} at "
                                   f"{at}: {result.get('error')}", peer=there)


def _at(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _clocks(found: dict, only, say, done: dict) -> None:
    readings = {}
    for host, answer in found.items():
        clock, sent, received = answer.get("clock"), answer.get("sent"), answer.get("received")
        if all(isinstance(v, (int, float)) and v for v in (clock, sent, received)):
            readings[host] = (clock - (sent + received) / 2, max(received - sent, 0) / 2)
    if not readings:
        return
    middle = statistics.median_low(offset for offset, _ in readings.values())
    reference = min(h for h, (offset, _) in readings.items() if offset == middle)
    done["reference"] = reference
    within_ref = readings[reference][1]
    for host, (offset, within) in sorted(readings.items()):
        skew, bound = offset - middle, within + within_ref
        done["clocks"].append({"host": host, "offset_s": round(skew, 3),
                               "within_s": round(bound, 3)})
        if abs(skew) - bound > MAX_SKEW and only in (None, host):
            say("clock", host, f"host {host}'s clock is {abs(skew):.1f} s "
                               f"{'ahead of' if skew > 0 else 'behind'} the cluster's (host "
                               f"{reference}'s, the median of {len(readings)} hosts' clocks; "
                               f"measured within {bound:.2f} s): over {MAX_SKEW:g} s")
