"""Replay in the "history in, requests out" style: no etcd involved."""
import re

import pytest

from engine.core.replay import NonDeterminism, Replayer, Request, Response
from tests.support.history import History


def two_steps(ctx, host):
    first = yield Request("ping", {"n": 1}, target=host)
    second = yield Request("ping", {"n": 2, "after": first.value}, target=host)
    return [first.status, second.status]


def fan_out(ctx, hosts):
    replies = yield ctx.all([Request("ping", {"round": 0}, target=h) for h in hosts])
    return sorted(r.executor for r in replies if r.ok)


def child(ctx, name):
    made = yield Request("build", {"uuid": ctx.uuid(name)}, target="h1", label=name)
    started = yield Request("start", {"uuid": ctx.uuid(name)}, target="h1", label=name)
    return {"name": name, "uuid": ctx.uuid(name), "state": started.status, "t": ctx.now()}


def parent(ctx, names):
    results = yield ctx.all([ctx.worker(child, n, label=n) for n in names])
    return results


def race(ctx):
    position, outcome = yield ctx.first([Request("a"), Request("b")])
    followup = yield Request("after", {"winner": position})
    return position


def test_sequential_worker_emits_one_request_at_a_time():
    history = History(two_steps, {"host": "h1"})
    live = history.run()
    assert live.finished and live.result == ["ok", "ok"]
    assert [r.args["n"] for r in history.requests] == [1, 2]
    assert history.appended_after == [1, 2, 2]


def test_fan_out_emits_all_requests_before_any_response():
    history = History(fan_out, {"hosts": ["h1", "h2", "h3"]})
    live = history.run()
    assert history.appended_after[0] == 3
    assert live.result == ["h", "h", "h"]


def test_children_interleave_in_any_delivery_order_and_replay_alike():
    history = History(parent, {"names": ["vm1", "vm2", "vm3"]},
                      order=lambda pending: pending[-1])      # newest first
    live = history.run()
    assert [r["name"] for r in live.result] == ["vm1", "vm2", "vm3"]
    replayed = history.replay()
    assert replayed.result == live.result


def test_uuids_are_derived_from_the_automation():
    one = History(parent, {"names": ["vm1"]}, automation_id="x").run().result
    again = History(parent, {"names": ["vm1"]}, automation_id="x").run().result
    other = History(parent, {"names": ["vm1"]}, automation_id="y").run().result
    assert one[0]["uuid"] == again[0]["uuid"] != other[0]["uuid"]


def test_now_comes_from_the_history_not_the_clock():
    history = History(parent, {"names": ["vm1"]})
    live = history.run()
    assert live.result[0]["t"] == history.responses[-1][1].time
    assert history.replay().result[0]["t"] == live.result[0]["t"]


def test_first_takes_the_earliest_delivered_response():
    history = History(race, {}, order=lambda pending: pending[-1])   # "b" answers first
    live = history.run()
    assert live.result == 1
    assert history.requests[-1].args == {"winner": 1}
    assert history.replay().result == 1


def test_changed_worker_is_non_determinism_naming_the_step():
    history = History(two_steps, {"host": "h1"})
    history.run()

    def edited(ctx, host):
        first = yield Request("ping", {"n": 1}, target=host)
        second = yield Request("reboot", {"n": 2}, target=host)
        return []
    edited.__name__ = "two_steps"   # the same worker, edited between runs

    with pytest.raises(NonDeterminism, match=r"step 1 .*ping@h1.*reboot@h1"):
        history.replay(worker=edited)


def test_lost_response_reaches_the_worker():
    def tolerant(ctx, host):
        reply = yield Request("ping", target=host)
        return reply.status

    history = History(tolerant, {"host": "dead"}, answer=lambda r: Response("lost", error="host died"))
    assert history.run().result == "lost"


def test_failing_child_fails_the_parent_with_its_error():
    def broken(ctx, name):
        yield Request("build", {"name": name})
        raise RuntimeError(f"{name} exploded")

    def boss(ctx):
        yield ctx.all([ctx.worker(broken, "vm1")])
        return "unreachable"

    live = History(boss, {}).run()
    assert live.finished and live.result is None
    assert "vm1 exploded" in live.error


def emitted_at_every_prefix(history):
    """For each k, replay the first k responses against the log as it stood
    before the live initiator appended what the k-th one unlocked; return
    what each replay emits, next to what the live run appended then."""
    where = {step.index: (step.worker, step.seq) for step in history.steps.values()}
    rows = []
    for k in range(len(history.responses) + 1):
        logged_before = history.appended_after[k - 1] if k else 0
        replayer = Replayer(history.automation_id, history.worker, history.args,
                            logged={key: step for key, step in history.steps.items()
                                    if step.index < logged_before})
        for index, response in history.responses[:k]:
            replayer.deliver(index, response)
        emitted = [(new.worker, new.seq, new.request) for new in replayer.take_new()]
        expected = [(*where[i], history.requests[i])
                    for i in range(logged_before, history.appended_after[k])]
        rows.append((emitted, expected, replayer))
    return rows


@pytest.mark.parametrize("worker,args", [
    (two_steps, {"host": "h1"}),
    (fan_out, {"hosts": ["h1", "h2"]}),
    (parent, {"names": ["vm1", "vm2", "vm3"]}),
    (race, {}),
])
def test_every_prefix_emits_exactly_the_requests_the_live_run_appended(worker, args):
    history = History(worker, args)
    live = history.run()
    for k, (emitted, expected, replayer) in enumerate(emitted_at_every_prefix(history)):
        assert emitted == expected, f"after {k} responses"
    assert replayer.finished and replayer.result == live.result


def test_prefixes_of_a_two_step_history_emit_these_requests():
    history = History(two_steps, {"host": "h1"})
    history.run()
    emitted = [e for e, _, _ in emitted_at_every_prefix(history)]
    assert emitted == [
        [("0", 0, Request("ping", {"n": 1}, target="h1"))],
        [("0", 1, Request("ping", {"n": 2, "after": {"echo": {"n": 1}}}, target="h1"))],
        [],
    ]


def test_prefixes_of_child_workers_emit_these_requests():
    history = History(parent, {"names": ["vm1", "vm2"]})
    history.run()
    rows = emitted_at_every_prefix(history)
    names = [[(w, s, r.name, r.label) for w, s, r in emitted] for emitted, _, _ in rows]
    assert names == [
        [("0.0", 0, "build", "vm1"), ("0.1", 0, "build", "vm2")],   # both children start
        [("0.0", 1, "start", "vm1")],       # vm1 built
        [("0.1", 1, "start", "vm2")],       # vm2 built
        [],                                  # vm1 started
        [],                                  # vm2 started: the parent returns
    ]
    assert rows[-1][2].finished


def lottery(ctx, hosts):
    """Uses ctx.random for a target and for arguments, and in a child."""
    first = yield Request("ping", target=ctx.random.choice(hosts))
    draws = [round(ctx.random.random(), 12) for _ in range(3)]
    second = yield Request("ping", {"draws": draws}, target=ctx.random.choice(hosts))
    child = yield ctx.all([ctx.worker(lottery_child), ctx.worker(lottery_child)])
    return {"draws": draws, "children": child}


def lottery_child(ctx):
    yield Request("noop", {"draw": round(ctx.random.random(), 12)})
    return ctx.random.random()


def test_random_is_seeded_per_automation_and_worker_and_replays_alike():
    hosts = [f"h{i}" for i in range(20)]
    one = History(lottery, {"hosts": hosts}, automation_id="auto-1")
    live = one.run()
    again = History(lottery, {"hosts": hosts}, automation_id="auto-1")
    assert again.run().result == live.result and again.requests == one.requests
    for k, (emitted, expected, _) in enumerate(emitted_at_every_prefix(one)):
        assert emitted == expected, f"after {k} responses"   # replays draw the same
    assert one.replay().result == live.result
    other = History(lottery, {"hosts": hosts}, automation_id="auto-2")
    assert other.run().result["draws"] != live.result["draws"]
    first_child, second_child = live.result["children"]
    assert first_child != second_child, "sibling workers share a random stream"


def test_a_worker_bug_fails_the_automation_naming_the_worker_on_every_replay():
    """A bad yield, a child called with wrong arguments, or arguments that
    cannot be logged are bugs in the worker: the replay ends `failed` with
    an error naming the worker and the exception (not an exception out of
    the engine), it asks for nothing more, and every replay says the same."""
    def yields_five(ctx, host):
        yield Request("ping", target=host)
        yield 5

    def helper(ctx, name):
        yield Request("build", {"name": name})

    def wrong_args(ctx, host):
        yield Request("ping", target=host)
        yield ctx.all([ctx.worker(helper, "vm1"), ctx.worker(helper, nmae="vm2")])

    def unloggable(ctx, host):
        yield Request("ping", target=host)
        yield Request("ping", {"when": object()}, target=host)

    def bad_root(ctx, host):
        yield Request("ping", target=host)

    cases = [(yields_five, {"host": "h1"}, r"worker yields_five \(0\) yielded 5\b"),
             (wrong_args, {"host": "h1"},
              r"worker helper \(0\.1\) cannot start: TypeError: .*nmae"),
             (unloggable, {"host": "h1"}, r"worker unloggable \(0\) yielded request ping@h1: TypeError"),
             (bad_root, {"hots": "h1"}, r"worker bad_root \(0\) cannot start: TypeError")]
    for worker, args, error in cases:
        history = History(worker, args)
        live = history.run()        # raises nothing
        assert live.finished and live.result is None, worker.__name__
        assert re.search(error, live.error), live.error
        assert live.take_new() == []
        again = history.replay()
        assert (again.finished, again.error) == (True, live.error)
        assert len(history.requests) == (0 if worker is bad_root else 1)


def test_a_worker_now_yielding_fewer_steps_is_non_determinism_naming_the_first_one():
    """The log holds three steps; the code now returns after one.  Finishing
    `done` would drop logged work on the floor: it is non-determinism, and
    the first step never re-yielded is named."""
    def three(ctx, host):
        for n in range(3):
            yield Request("ping", {"n": n}, target=host)
        return "three"

    history = History(three, {"host": "h1"})
    assert history.run().result == "three"

    def one(ctx, host):
        yield Request("ping", {"n": 0}, target=host)
        return "one"
    one.__name__ = "three"

    with pytest.raises(NonDeterminism, match=r"^step 1 \(worker 0 three, call 1\): the log "
                                             r"holds ping@h1 but the code now ends the worker"):
        history.replay(worker=one)
    # Before the first response the shortened worker has not ended yet: nothing to say.
    assert not history.replay(upto=0, worker=one).finished


def test_a_parent_now_starting_fewer_children_is_non_determinism():
    history = History(parent, {"names": ["vm1", "vm2", "vm3"]})
    history.run()

    def fewer(ctx, names):
        return (yield ctx.all([ctx.worker(child, n, label=n) for n in names[:2]]))
    fewer.__name__ = "parent"

    with pytest.raises(NonDeterminism, match=r"step 2 \(worker 0\.2, call 0\): the log holds "
                                             r"build@h1 but worker 0 parent now ends without "
                                             r"starting worker 0\.2"):
        history.replay(worker=fewer)


def test_a_child_now_yielding_fewer_steps_is_non_determinism():
    history = History(parent, {"names": ["vm1"]})
    history.run()

    def short_child(ctx, name):
        yield Request("build", {"uuid": ctx.uuid(name)}, target="h1", label=name)
        return {}
    short_child.__name__ = "child"

    def edited(ctx, names):
        return (yield ctx.all([ctx.worker(short_child, n, label=n) for n in names]))
    edited.__name__ = "parent"

    with pytest.raises(NonDeterminism, match=r"step 1 \(worker 0\.0 child, call 1\)"):
        history.replay(worker=edited)


def test_changed_arguments_alone_say_the_arguments_differ_showing_both():
    """Same request, same target, other arguments: the reason must not read
    "the log holds ping@h1 but the code now yields ping@h1"."""
    import dataclasses
    history = History(two_steps, {"host": "h1"})
    history.run()
    logged = {key: dataclasses.replace(step, worker_name="two_steps",
                                       request=history.requests[step.index].name,
                                       target=history.requests[step.index].target,
                                       args=history.requests[step.index].args)
              for key, step in history.steps.items()}

    def edited(ctx, host):
        first = yield Request("ping", {"n": 1}, target=host)
        second = yield Request("ping", {"n": 2, "after": "x" * 500}, target=host)
    edited.__name__ = "two_steps"

    replayer = Replayer(history.automation_id, edited, history.args, logged=logged)
    with pytest.raises(NonDeterminism) as stuck:
        replayer.deliver(*history.responses[0])
    reason = str(stuck.value)
    assert reason.startswith("step 1 (worker 0 two_steps, call 1): the arguments of ping@h1 "
                             "differ: the log holds {'n': 2, 'after': {'echo': {'n': 1}}} "
                             "but the code now yields {'n': 2, 'after': 'xxx"), reason
    assert reason.endswith("...") and len(reason) < 400, reason
