"""Test automations with bugs in them: the engine must fail them cleanly."""
from engine.core.registry import automation
from engine.core.replay import Request


@automation("bad_yield", version=1)
def bad_yield(ctx, target):
    """One good step, then a yield that is not a Request: a worker bug."""
    yield Request("ping", {"step": 0}, target=target, label=target)
    yield 5
