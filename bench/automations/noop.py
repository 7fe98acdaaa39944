"""Benchmark automations: replicated no-op steps."""
from engine.core.registry import automation
from engine.core.replay import Request


@automation("noop_sequence", version=1)
def noop_sequence(ctx, steps, target=None):
    for i in range(steps):
        yield Request("noop", {"i": i}, target=target)
    return {"steps": steps}


def _lane(ctx, lane, steps, target):
    for i in range(steps):
        yield Request("noop", {"lane": lane, "i": i}, target=target)
    return steps


@automation("noop_parallel", version=1)
def noop_parallel(ctx, lanes, steps, target=None):
    done = yield ctx.all([ctx.worker(_lane, lane, steps, target, label=f"lane{lane}")
                          for lane in range(lanes)])
    return {"steps": sum(done)}


@automation("noop_forever", version=1)
def noop_forever(ctx, target=None, pause=0.0):
    i = 0
    while True:
        yield Request("noop", {"i": i, "pause": pause}, target=target)
        i += 1
