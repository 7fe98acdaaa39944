"""Test automations, loaded by peers through PEERCTL_AUTOMATIONS_PATH."""
from engine.core.registry import automation
from engine.core.replay import Request


@automation("steps", version=1)
def steps(ctx, target, count, deadline=30.0):
    """``count`` sequential pings to ``target``; reports each outcome."""
    outcomes = []
    for i in range(count):
        reply = yield Request("ping", {"step": i}, target=target, deadline=deadline, label=target)
        outcomes.append({"step": i, "status": reply.status, "error": reply.error})
    return {"outcomes": outcomes}


@automation("inventory", version=1)
def inventory(ctx, hosts):
    """What each host's hypervisor holds (domains and pool volumes)."""
    replies = yield ctx.all([Request("inventory", target=h, label=h) for h in hosts])
    return {"hosts": {h: r.value if r.ok else {"error": r.error or r.status}
                      for h, r in zip(hosts, replies)}}


@automation("local_steps", version=1)
def local_steps(ctx, count):
    """``count`` sequential steps run on whichever peer leads (no target)."""
    outcomes = []
    for i in range(count):
        reply = yield Request("noop", {"step": i})
        outcomes.append({"step": i, "status": reply.status, "executor": reply.executor})
    return {"outcomes": outcomes}


@automation("first_local", version=1)
def first_local(ctx, target):
    """The first of a local step and a ping to ``target``: when ``target``
    is stopped the local one wins and the ping is left unanswered."""
    position, outcome = yield ctx.first([Request("noop", {"race": 0}),
                                         Request("ping", {"race": 1}, target=target)])
    return {"winner": position}


@automation("sleeper", version=1, cleans_up=True)
def sleeper(ctx, until, rounds=1):
    """Sleep until ``until`` (then ``rounds - 1`` more times, 1 s apart),
    running a ``noop`` after each wake-up: a hook counts them."""
    woken = []
    for round_ in range(rounds):
        woke = yield ctx.sleep_until(until + round_)
        yield Request("noop", {"round": round_, "woke": woke.value["woke"]})
        woken.append({**woke.value, "now": ctx.now()})
        if ctx.aborted:
            break
    return {"woken": woken}


@automation("fanout", version=1)
def fanout(ctx, target, width, rounds=1, deadline=30.0):
    """``rounds`` rounds of ``width`` pings to ``target`` at once: each
    round's requests reach its inbox together."""
    outcomes = []
    for round_ in range(rounds):
        replies = yield ctx.all([Request("ping", {"round": round_, "lane": lane}, target=target,
                                         deadline=deadline, label=target)
                                 for lane in range(width)])
        outcomes += [{"round": round_, "lane": lane, "status": reply.status}
                     for lane, reply in enumerate(replies)]
    return {"outcomes": outcomes}
