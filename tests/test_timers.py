"""Durable timers (``ctx.sleep_until``): logged, woken once, by whoever leads.

The replay half needs no etcd; the rest runs real peers on a real etcd and
kills the leader while the timer sleeps or as it wakes."""
import time

import pytest

from engine.core import api, failpoints, keys
from engine.core.replay import TIMER, Replayer, Request, Response
from tests.support import TEST_AUTOMATIONS, wait_for, wait_until
from tests.support.cluster import finished, start_automation, start_peers
from tests.support.history import History
from tests.support.hooks import assert_each_index_ran_once, counting_hook

ENV = {"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS}


def nap_then_work(ctx, until):
    woke = yield ctx.sleep_until(until)
    done = yield Request("work", {"woke": woke.value["woke"]}, target="h1")
    return {"woke": woke.value, "now": ctx.now(), "done": done.status}


def answer(request):
    if request.name == TIMER:
        return Response("ok", {"woke": "time", "at": request.args["until"], "why": []})
    return Response("ok", {})


# -- replay, no etcd -----------------------------------------------------------

def test_the_wake_up_time_is_in_the_logged_step():
    live = Replayer("a1", nap_then_work, {"until": 1234.5})
    [step] = live.take_new()
    assert step.request.name == TIMER and step.request.args == {"until": 1234.5}
    assert step.request.target is None


def test_the_same_log_wakes_the_worker_once_on_every_replay():
    history = History(nap_then_work, {"until": 1234.5}, answer=answer)
    live = history.run()
    assert live.finished and live.result["woke"]["woke"] == "time"
    assert [r.name for r in history.requests] == [TIMER, "work"]
    for upto in range(len(history.responses) + 1):
        replay = history.replay(upto)
        assert replay.take_new() == []                  # nothing yielded twice
    again = history.replay()
    assert again.finished and again.result == live.result


def test_time_after_waking_comes_from_the_log():
    history = History(nap_then_work, {"until": 1234.5}, answer=answer)
    live = history.run()
    woke_at = history.responses[0][1].time
    assert live.result["now"] >= woke_at
    assert history.replay().result["now"] == live.result["now"]


def test_a_timer_not_answered_yet_keeps_the_worker_asleep_on_replay():
    history = History(nap_then_work, {"until": 1234.5}, answer=answer)
    history.run()
    replay = history.replay(upto=0)
    assert not replay.finished and replay.take_new() == []


# -- real peers ----------------------------------------------------------------

def sleeper(store, until, **options):
    return start_automation(store, "sleeper", {"until": until, **options.pop("args", {})},
                            **options)


def timer_response(store, automation_id):
    task = api.get_task(store, automation_id)
    [index] = [e["index"] for e in task["log"] if e["request"] == TIMER][:1]
    return store.get(keys.response(automation_id, index)).value


def test_a_timer_wakes_its_worker_at_the_logged_time(cluster, store, tmp_path):
    start_peers(cluster, store, ["m1", "m2"], env=ENV)
    until = time.time() + 2
    automation_id = sleeper(store, until, members=2)
    sleeping = wait_until(lambda: api.get_task(store, automation_id), lambda t: t["log"],
                          what="the timer step")
    assert sleeping["log"][0]["request"] == TIMER and sleeping["log"][0]["status"] == "sleeping"
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    [woken] = task["result"]["woken"]
    assert woken["woke"] == "time" and woken["at"] >= until
    assert [e["request"] for e in task["log"]] == [TIMER, "noop"]


def test_a_late_leader_wakes_an_overdue_timer_at_once(cluster, store, tmp_path):
    """The leader dies while its worker sleeps; by the time another member
    leads, the wake-up time has passed: it answers the timer first thing,
    and the step after it runs once."""
    hooks = str(tmp_path / "hooks")
    runs = counting_hook(hooks, request="noop")
    start_peers(cluster, store, ["m1", "m2"], env=ENV, hooks=hooks)
    until = time.time() + 1
    automation_id = sleeper(store, until, members=2, prefer=["m1", "m2"])
    leader = wait_for(lambda: api.get_task(store, automation_id)["initiator"],
                      what="a leader")
    cluster.kill(leader)
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    response = timer_response(store, automation_id)
    assert response["value"]["woke"] == "time"
    assert response["time"] >= until
    assert task["initiator"] != leader
    assert len(assert_each_index_ran_once(runs, automation_id)) == 1


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_sigkill_as_the_timer_is_answered_wakes_it_exactly_once(cluster, store, tmp_path):
    """Three wake-ups, the leader SIGKILLed right before writing each
    answer: every timer is answered once, every step after it runs once."""
    hooks = str(tmp_path / "hooks")
    runs = counting_hook(hooks, request="noop")
    armed = str(tmp_path / "failpoints")
    env = {**ENV, failpoints.ENV: armed}
    start_peers(cluster, store, ["m1", "m2", "m3"], env=env, hooks=hooks)
    failpoints.arm(armed, ["wake", "wake", "wake"])
    automation_id = sleeper(store, time.time() + 1, members=3, args={"rounds": 3})

    def restart_the_dead():
        for host in ("m1", "m2", "m3"):
            if cluster.peers[host].poll() is not None:
                cluster.start_peer(host, extra_args=["--hooks", hooks], env=env)
        task = api.get_task(store, automation_id)
        return task if task["state"] in keys.TERMINAL_STATES else None
    task = wait_for(restart_the_dead, timeout=90, interval=0.05, what="the sleeper to finish")
    assert task["state"] == "done", task["error"]
    assert [p for p, _, _ in failpoints.fired(armed)] == ["wake"] * 3
    assert [w["woke"] for w in task["result"]["woken"]] == ["time"] * 3
    assert [e["request"] for e in task["log"]] == [TIMER, "noop"] * 3
    assert len(assert_each_index_ran_once(runs, automation_id)) == 3


def test_a_nudge_wakes_a_sleeping_timer_and_is_consumed(cluster, store):
    start_peers(cluster, store, ["m1"], env=ENV)
    automation_id = sleeper(store, time.time() + 3600, members=1)
    wait_for(lambda: api.get_task(store, automation_id)["log"], what="the timer step")
    api.nudge(store, automation_id, "the lease was extended")
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    [woken] = task["result"]["woken"]
    assert woken["woke"] == "nudge" and woken["why"] == ["the lease was extended"]
    assert store.range(keys.wake(automation_id))[0] == []


def test_a_nudge_before_the_sleep_wakes_the_next_timer(cluster, store, tmp_path):
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, request="noop", sleep=1.0)
    start_peers(cluster, store, ["m1"], env=ENV, hooks=hooks)
    automation_id = sleeper(store, time.time(), members=1, args={"rounds": 2})
    wait_for(lambda: any(e["request"] == "noop" for e in api.get_task(store, automation_id)["log"]),
             what="the first noop")
    api.nudge(store, automation_id, "early")      # while the noop runs: no timer sleeps
    task = finished(store, automation_id)
    assert [w["woke"] for w in task["result"]["woken"]] == ["time", "nudge"]


def test_abort_interrupts_a_sleep(cluster, store):
    start_peers(cluster, store, ["m1", "m2"], env=ENV)
    automation_id = sleeper(store, time.time() + 3600, members=2)
    wait_for(lambda: api.get_task(store, automation_id)["log"], what="the timer step")
    assert api.abort(store, automation_id)["state"] == "aborted"
    task = api.get_task(store, automation_id)
    [woken] = task["result"]["woken"] if task["result"] else [None]
    assert woken is None or woken["woke"] == "abort"
    response = timer_response(store, automation_id)
    assert response["value"]["woke"] == "abort"
