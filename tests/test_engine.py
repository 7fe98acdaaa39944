"""The engine against a real etcd and real peer processes.

Each scenario kills something for real (SIGKILL, SIGSTOP, etcd itself) and
then checks the automation's log: nothing lost, nothing run twice.
"""
import os
import signal
import time

import pytest

from engine.core import api, failpoints, keys
from engine.core.initiator import SUMMARY_INTERVAL
from engine.core.store import KV, Store
from tests.support import TEST_AUTOMATIONS, wait_for, wait_until
from tests.support.cluster import Cluster, finished, start_automation, start_peers
from tests.support.hooks import (assert_each_index_ran_once, counting_hook, executions,
                                 recorded, recording_hook)

# Lease TTL of the peers the step-boundary test crashes: a crashed peer must
# restart and publish its host record within its old lease's remaining TTL
# plus the initiator's grace of one TTL (peer start-up takes 0.5-2.5 s on a
# loaded 2-core machine), or the next round finds that target gone: `lost`.
KILL_TTL = 3
# After etcd comes back from an outage longer than the TTL, the old leases
# (which etcd renews on restart) expire one TTL (2 s) later and the members'
# new candidacies lead; a target not back yet gets a TTL of grace; then the
# remaining rounds.
ETCD_RETURN_BOUND = 12.0


def test_three_peers_ping_ten_rounds(cluster, store):
    start_peers(cluster, store, ["h1", "h2", "h3"])
    automation_id = api.start_automation(store, "ping", {"hosts": ["h1", "h2", "h3"], "rounds": 10})
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    replies = task["result"]["replies"]
    assert sorted((r["host"], r["round"]) for r in replies) == \
        sorted((h, n) for h in ("h1", "h2", "h3") for n in range(10))
    assert all(r["latency_ms"] >= 0 for r in replies)
    assert [e["index"] for e in task["log"]] == list(range(30))
    assert {e["executor"] for e in task["log"]} == {"h1", "h2", "h3"}


def replies_of(task):
    return sorted((r["host"], r["round"], r["status"]) for r in task["result"]["replies"])


@pytest.mark.slow
def test_sigkill_of_the_initiator_at_every_step_boundary(cluster, store, tmp_path):
    """A 3-peer ping --rounds 10, with the initiator SIGKILLed by a crash
    point exactly before each round's append and before the final status:
    11 crashes, each of whichever peer leads at that moment.  Each killed
    peer is restarted under its own name, so every ping still has a live
    target.  The result equals a clean run's and a pre hook sees every
    (automation, index) run exactly once."""
    hosts = ["h1", "h2", "h3"]
    hooks = str(tmp_path / "hooks")
    runs_log = counting_hook(hooks)
    armed = str(tmp_path / "failpoints")
    env = {failpoints.ENV: armed}
    start_peers(cluster, store, hosts, hooks=hooks, env=env, ttl=KILL_TTL)
    clean = finished(store, api.start_automation(store, "ping", {"hosts": hosts, "rounds": 10}))
    assert clean["state"] == "done", clean["error"]

    boundaries = [f"append {3 * r}" for r in range(10)] + ["finish"]
    failpoints.arm(armed, boundaries)
    automation_id = api.start_automation(store, "ping", {"hosts": hosts, "rounds": 10})
    restarted, comeback = {}, []      # host -> (pid, spawned at); seconds to come back

    def restart_the_dead():
        """Restart a crashed peer at once.  It has its old lease's remaining
        TTL, plus the grace of one TTL the new initiator gives a missing
        target, to publish its host record again; later, its ping is `lost`."""
        live = api.live_hosts(store)
        for host, (pid, spawned) in list(restarted.items()):
            if live.get(host, {}).get("pid") == pid:
                comeback.append(time.monotonic() - spawned)
                del restarted[host]
        for host in hosts:
            if cluster.peers[host].poll() is not None:
                process = cluster.start_peer(host, ttl=KILL_TTL, extra_args=["--hooks", hooks],
                                             env=env)
                restarted[host] = (process.pid, time.monotonic())
        task = api.get_task(store, automation_id)
        return task if task["state"] in keys.TERMINAL_STATES else None
    task = wait_for(restart_the_dead, timeout=30 + len(boundaries) * (KILL_TTL + 1),
                    interval=0.02, what="the automation to finish through the crashes")

    fired = failpoints.fired(armed)
    assert [point for point, _, _ in fired] == boundaries, "a boundary produced no crash"
    assert len(comeback) + len(restarted) == len(boundaries), "a crash nobody saw"
    late = [r for r in task["result"]["replies"] if r["status"] != "ok"]
    assert task["state"] == "done" and not late, \
        f"{task['error']}: {late}; peers took {max(comeback, default=0):.1f}s at most to come " \
        f"back (allowed: about {2 * KILL_TTL}s)"
    assert replies_of(task) == replies_of(clean)
    assert [e["index"] for e in task["log"]] == list(range(30))
    runs = assert_each_index_ran_once(runs_log, automation_id)
    assert sorted(int(i) for _, i in runs) == list(range(30)), "an index never ran"
    writers = {kv.value["initiator"] for kv in store.range(keys.auto(automation_id, "log/"))[0]}
    assert len(writers) >= 2, f"every round appended by {writers}: nobody took over"


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_paused_initiator_is_fenced_after_its_lease_expires(cluster, store, tmp_path):
    hooks = str(tmp_path / "hooks")
    runs_log = counting_hook(hooks, sleep=0.1)
    start_peers(cluster, store, ["t1"], hooks=hooks)
    start_peers(cluster, store, ["m1", "m2"])
    automation_id = api.start_automation(store, "ping", {"hosts": ["t1"], "rounds": 30},
                                         prefer=["m1", "m2"], members=2)
    task = wait_until(lambda: api.get_task(store, automation_id), lambda t: len(t["log"]) >= 3,
                      what="3 steps")
    old = task["initiator"]
    cluster.kill(old, signal.SIGSTOP)
    stopped_at = len(api.get_task(store, automation_id)["log"])
    # Its lease expires; the other member takes over and appends.
    wait_for(lambda: api.get_task(store, automation_id)["initiator"] not in (old, None),
             what="a new initiator")
    wait_for(lambda: len(api.get_task(store, automation_id)["log"]) >= stopped_at + 3,
             what="the new initiator appending")
    cluster.kill(old, signal.SIGCONT)
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    entries, _ = store.range(f"auto/{automation_id}/log/")
    writers = [kv.value["initiator"] for kv in entries]
    assert old not in writers[stopped_at + 1:], "the deposed initiator appended after the pause"
    assert [kv.value["index"] for kv in entries] == list(range(30))
    assert len(assert_each_index_ran_once(runs_log, automation_id)) == 30
    assert "session_started" in cluster.log(old)    # it came back as a fresh session


def test_initiator_paused_right_before_an_append_is_refused_by_the_fence(cluster, store,
                                                                        tmp_path):
    """The initiator SIGSTOPs itself (failpoint `pause append 3`) with the
    transaction appending index 3 built and about to be sent.  Its lease
    expires; the other member leads and is SIGKILLed just before appending
    index 3 itself, so index 3 is still free when the paused one is
    resumed at once: only the election fence can refuse its append."""
    hooks = str(tmp_path / "hooks")
    runs_log = counting_hook(hooks)
    armed = str(tmp_path / "failpoints")
    env = {failpoints.ENV: armed}
    start_peers(cluster, store, ["t1"], hooks=hooks)
    start_peers(cluster, store, ["m1", "m2"], env=env)
    failpoints.arm(armed, ["pause append 3"])
    automation_id = api.start_automation(store, "ping", {"hosts": ["t1"], "rounds": 6},
                                         prefer=["m1", "m2"], members=2)
    paused = wait_for(lambda: [f for f in failpoints.fired(armed) if f[0] == "pause append 3"],
                      what="the initiator to pause before appending index 3")[0]
    old = next(h for h in ("m1", "m2") if cluster.peers[h].pid == paused[1])
    other = ({"m1", "m2"} - {old}).pop()
    try:
        failpoints.arm(armed, ["append 3"])     # the next leader dies right there
        wait_for(lambda: cluster.peers[other].poll() is not None, timeout=20,
                 what=f"{other} to lead and crash before appending index 3")
        assert [f[0] for f in failpoints.fired(armed)] == ["pause append 3", "append 3"]
        assert store.get(keys.log_entry(automation_id, 3)) is None
    finally:
        cluster.kill(old, signal.SIGCONT)       # its append goes out at once
    appended = wait_for(lambda: "initiator_deposed" in cluster.log(old)
                        or store.get(keys.log_entry(automation_id, 3)), timeout=10,
                        what=f"{old} to send its append")
    assert not (isinstance(appended, KV) and appended.value["time"] < paused[2]), \
        f"the deposed {old} appended index 3 after its lease expired"
    assert "initiator_deposed" in cluster.log(old)
    cluster.start_peer(other, env=env)
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    entries, _ = store.range(keys.auto(automation_id, "log/"))
    assert [kv.value["index"] for kv in entries] == list(range(6))
    stale = [kv.value["index"] for kv in entries
             if kv.value["index"] >= 3 and kv.value["time"] < paused[2]]
    assert not stale, f"the deposed initiator appended index {stale} built before its pause"
    assert sorted(int(i) for _, i in assert_each_index_ran_once(runs_log, automation_id)) == \
        list(range(6))


def test_fence_refuses_a_deposed_initiators_append(etcd, cluster_name):
    """In-process: revoke the leader's lease, then let it try to append."""
    import threading
    from engine.core.election import Candidacy
    from engine.core.initiator import Initiator
    from engine.errors import Deposed
    from engine.core.replay import NewRequest, Replayer, Request
    from engine.core.session import Session
    from engine.core.registry import lookup

    store = Store(etcd.url, cluster_name)
    store.put("hosts/h1", {"host": "h1"}, store.grant(60))
    automation_id = api.start_automation(store, "ping", {"hosts": ["h1"], "rounds": 1}, members=1)
    session = Session(store, 2)
    candidacy = Candidacy(store, session, keys.elect(automation_id), "h1")
    assert candidacy.wait_until_leader(threading.Event())
    initiator = Initiator(store, session, "h1", automation_id, candidacy,
                          lambda *a, **k: None, threading.Event())
    initiator.spec = store.get(keys.spec(automation_id)).value
    initiator.entries, initiator.claimed, initiator.next_index = {}, {}, 0
    initiator.open, initiator._carry = {}, []
    replayer = Replayer(automation_id, lookup("ping", 1), {"hosts": ["h1"], "rounds": 1})
    session.close(revoke=True)          # the lease is gone: deposed
    with pytest.raises(Deposed):
        initiator._append(replayer, [NewRequest("0", 0, "ping", Request("ping", target="h1"), "f")])
    assert store.range(f"auto/{automation_id}/log/")[0] == []
    assert store.range("inbox/h1/")[0] == []


def test_changed_worker_goes_stuck_and_writes_nothing_more(cluster, store, tmp_path):
    code_dir = tmp_path / "automations"
    code_dir.mkdir()
    original = open(os.path.join(TEST_AUTOMATIONS, "steps.py")).read()
    (code_dir / "steps.py").write_text(original)
    env = {"PEERCTL_AUTOMATIONS_PATH": str(code_dir)}
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, sleep=0.2)
    start_peers(cluster, store, ["t1"], hooks=hooks)
    start_peers(cluster, store, ["m1"], env=env)
    automation_id = start_automation(store, "steps", {"target": "t1", "count": 6},
                                     code=code_dir, members=1, prefer=["m1"])
    wait_for(lambda: len(api.get_task(store, automation_id)["log"]) >= 2, what="2 steps")
    cluster.kill("m1")
    (code_dir / "steps.py").write_text(original.replace('Request("ping", {"step": i}',
                                                        'Request("ping", {"step": i * 10}'))
    before = api.get_task(store, automation_id)
    cluster.start_peer("m1", env=env)
    task = finished(store, automation_id)
    assert task["state"] == "stuck"
    assert task["error"] == ("step 1 (worker 0 steps, call 1): the arguments of ping@t1 differ: "
                             "the log holds {'step': 1} but the code now yields {'step': 10}"), \
        task["error"]
    # Nothing was appended or answered by the new code.
    assert len(task["log"]) == len(before["log"])
    entries, _ = store.range(f"auto/{automation_id}/log/")
    assert all(kv.value["args"]["step"] < 2 for kv in entries)


def test_a_worker_yielding_a_non_request_ends_failed_naming_the_worker(cluster, store):
    """A worker bug (it yields 5) must end the automation `failed` with an
    error naming the worker and what it yielded, not leave it `running`
    forever behind a dead duty thread that still holds the election key."""
    env = {"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS}
    start_peers(cluster, store, ["t1"])
    start_peers(cluster, store, ["m1", "m2"], env=env)
    automation_id = start_automation(store, "bad_yield", {"target": "t1"}, members=2,
                                          prefer=["m1", "m2"])
    task = finished(store, automation_id, timeout=20)
    assert task["state"] == "failed", task
    assert task["error"].startswith("worker bad_yield (0) yielded 5: yield a Request"), \
        task["error"]
    assert [(e["request"], e["status"]) for e in task["log"]] == [("ping", "ok")]
    # The members resign once they see the terminal state, a moment after it
    # is written, while their leases live on: a candidacy must not outlive it.
    wait_for(lambda: store.range(keys.elect(automation_id))[0] == [], timeout=10,
             what="every candidacy withdrawn")
    for member in ("m1", "m2"):
        assert "duty_crashed" not in cluster.log(member)


def test_a_duty_that_crashes_resigns_and_says_so(store, monkeypatch, capsys):
    """An unexpected exception in the initiator (an engine bug) must not kill
    the duty thread silently with its candidacy still held by a live lease:
    it is logged and the candidacy resigned, so another member can lead."""
    import threading
    from engine.core import duties as duties_module
    from engine.core.session import Session

    crashes = threading.Event()

    class CrashingInitiator:
        def __init__(self, *args):
            pass

        def run(self):
            crashes.set()
            raise RuntimeError("engine bug")

    monkeypatch.setattr(duties_module, "Initiator", CrashingInitiator)
    monkeypatch.setattr(duties_module, "STEP_ASIDE_PAUSE", 60.0)   # stays resigned meanwhile
    session = Session(store, 5)
    store.put(keys.member("h1", "a1"), {})
    duties = duties_module.Duties(store, session, "h1", lambda *a, **k: None).start()
    try:
        assert crashes.wait(10), "never elected"
        wait_for(lambda: store.range(keys.elect("a1"))[0] == [], timeout=5,
                 what="the crashed duty to resign its candidacy")
        assert session.alive
    finally:
        duties.stop()
        session.close()
    captured = capsys.readouterr()
    assert "duty_crashed" in captured.out + captured.err


def test_unanswered_requests_never_run_once_the_automation_has_ended(cluster, store, tmp_path):
    """ctx.first of a local step and a ping to a SIGSTOPped host: the local
    one wins and the automation is `done` with the ping unanswered.  Its
    inbox entry goes with the terminal status, so when the host resumes it
    never runs it (a pre hook counts), though it runs later work."""
    hooks = str(tmp_path / "hooks")
    runs_log = counting_hook(hooks)
    env = {"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS}
    start_peers(cluster, store, ["t1"], hooks=hooks, ttl=10)
    start_peers(cluster, store, ["m1"], env=env)
    cluster.kill("t1", signal.SIGSTOP)
    try:
        automation_id = start_automation(store, "first_local", {"target": "t1"},
                                              members=1, prefer=["m1"])
        task = finished(store, automation_id, timeout=20)
        assert (task["state"], task["result"]) == ("done", {"winner": 0}), task
        assert [e["status"] for e in task["log"]][1] not in ("ok", "error", "lost", "timeout")
        assert store.range("inbox/")[0] == [], "an unclaimed request outlived its automation"
    finally:
        cluster.kill("t1", signal.SIGCONT)
    later = start_automation(store, "steps", {"target": "t1", "count": 1},
                                  members=1, prefer=["m1"])
    assert finished(store, later)["state"] == "done"
    assert [a for a, _, _ in executions(runs_log)] == [later]
    assert store.range("inbox/")[0] == []


def test_the_executor_refuses_an_entry_of_a_finished_automation(store, tmp_path):
    """An inbox entry left behind by a finished automation (older code, or
    a crash between the two) is claimed but never run."""
    from engine.core.executor import Executor
    from engine.hypervisor.host.hostctx import HostContext
    from engine.core.session import Session

    hooks = str(tmp_path / "hooks")
    runs_log = counting_hook(hooks)
    entry = {"index": 0, "worker": "0", "seq": 0, "request": "ping", "target": "t1",
             "args": {}, "local": False, "fingerprint": "f"}
    store.put(keys.log_entry("a1", 0), entry)
    store.put(keys.status("a1"), {"state": "stuck"})
    store.put(keys.inbox("t1", "a1", 0), {})
    store.put(keys.log_entry("a2", 0), {**entry})
    store.put(keys.inbox("t1", "a2", 0), {})
    session = Session(store, 5)
    executor = Executor(store, HostContext("t1", "test:///default", store, str(tmp_path)),
                        hooks)
    executor.attach(session)
    try:
        wait_for(lambda: store.get(keys.response("a2", 0)), what="the live entry to run")
        assert executor.wait_idle(10)
        assert store.range("inbox/")[0] == []
        assert store.get(keys.claim("a1", 0)) is None
        assert store.get(keys.response("a1", 0)) is None
        assert [a for a, _, _ in executions(runs_log)] == ["a2"]
    finally:
        executor.detach()
        session.close()


def test_request_to_a_dead_host_is_lost_within_its_deadline(cluster, store, tmp_path):
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, sleep=60)      # t1 claims the request and hangs in the hook
    start_peers(cluster, store, ["t1"], hooks=hooks)
    start_peers(cluster, store, ["m1"], env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS})
    automation_id = start_automation(store, "steps", {"target": "t1", "count": 2,
                                                      "deadline": 4.0},
                                     members=1, prefer=["m1"])
    wait_for(lambda: api.get_task(store, automation_id)["log"][0]["status"] == "running"
             if api.get_task(store, automation_id)["log"] else False, what="t1 claiming")
    appended = api.get_task(store, automation_id)["log"][0]["time"]
    cluster.kill("t1")
    task = finished(store, automation_id, timeout=30)
    first, second = task["result"]["outcomes"]
    assert first["status"] in ("lost", "timeout") and second["status"] in ("lost", "timeout")
    responses = {kv.key: kv.value for kv in store.range(f"auto/{automation_id}/resp/")[0]}
    for index, entry in enumerate(task["log"]):
        answered = responses[keys.response(automation_id, index)]["time"]
        deadline = entry["time"] + 4.0
        assert answered <= deadline + 1.0, f"step {index} answered {answered - deadline:.2f}s late"
    assert task["state"] == "done"      # the worker handled the failures itself
    assert appended > 0


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_hanging_request_times_out_and_the_late_answer_loses(cluster, store, tmp_path):
    """t1 is alive and claims each step, but its pre hook outlasts the
    deadline: the initiator writes `timeout` within deadline + 1 s, the
    worker goes on, and t1's answer, when it finally comes, is refused."""
    deadline, hang = 2.0, 4.0
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, sleep=hang)
    start_peers(cluster, store, ["t1"], hooks=hooks)
    start_peers(cluster, store, ["m1"], env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS})
    automation_id = start_automation(store, "steps", {"target": "t1", "count": 2,
                                                           "deadline": deadline},
                                          members=1, prefer=["m1"])
    task = finished(store, automation_id, timeout=30)
    assert task["state"] == "done", task["error"]      # the worker handled the timeouts
    assert [o["status"] for o in task["result"]["outcomes"]] == ["timeout", "timeout"]
    assert all(e["executor"] is None for e in task["log"])
    first = {kv.key: kv for kv in store.range(keys.auto(automation_id, "resp/"))[0]}
    for entry in task["log"]:
        answered = first[keys.response(automation_id, entry["index"])].value["time"]
        late = answered - (entry["time"] + deadline)
        assert 0 <= late <= 1.0, f"step {entry['index']} timed out {late:+.2f}s after its deadline"
    # Both steps did run on t1 (claimed before the deadline), and t1 tried
    # to answer each once its hook returned: create-if-absent refused it.
    wait_for(lambda: cluster.log("t1").count("response_superseded") >= 2,
             timeout=hang + 10, what="t1's late answers")
    now = {kv.key: kv for kv in store.range(keys.auto(automation_id, "resp/"))[0]}
    assert {k: (kv.mod_revision, kv.value["status"]) for k, kv in now.items()} == \
        {k: (kv.mod_revision, "timeout") for k, kv in first.items()}
    assert api.get_task(store, automation_id)["result"]["outcomes"] == task["result"]["outcomes"]


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_etcd_down_longer_than_the_ttl_mid_automation(own_etcd, tmp_path):
    """etcd is killed mid-automation and stays down until every peer has
    given its lease up; when it is back the peers make new sessions, their
    watches resume, and the automation completes, without a double run,
    within a bound after etcd's return."""
    cluster = Cluster(own_etcd.url, "restart", tmp_path)
    store = Store(own_etcd.url, "restart")
    hosts = ["h1", "h2", "h3"]
    try:
        hooks = str(tmp_path / "hooks")
        runs_log = counting_hook(hooks, sleep=0.1)
        start_peers(cluster, store, hosts, hooks=hooks)
        automation_id = api.start_automation(store, "ping", {"hosts": hosts, "rounds": 12})
        before = wait_until(lambda: api.get_task(store, automation_id),
                            lambda t: len(t["log"]) >= 9, what="3 rounds")
        own_etcd.kill()
        assert before["state"] == "running" and len(before["log"]) < 36
        # Down for longer than the TTL: every peer sees its lease go.
        wait_for(lambda: all("lease_lost" in cluster.log(h) for h in hosts), timeout=15,
                 what="every peer to give its lease up")
        own_etcd.start()
        back = time.time()
        task = finished(store, automation_id, timeout=60)
        took = time.time() - back
        assert task["state"] == "done", task["error"]
        assert took <= ETCD_RETURN_BOUND, f"done {took:.1f}s after etcd came back"
        appended_after = [e for e in task["log"] if e["time"] > back]
        assert appended_after, "nothing appended after etcd came back: it had finished before"
        assert len(task["result"]["replies"]) == 36
        assert len(assert_each_index_ran_once(runs_log, automation_id)) == 36
        for host in hosts:
            assert cluster.peers[host].poll() is None, f"{host} died with etcd"
            assert cluster.log(host).count("session_started") >= 2, f"{host} kept its old session"
    finally:
        cluster.close()
        store.close()


VERSIONED = """
from engine.core.registry import automation
from engine.core.replay import Request
{versions}
"""
VERSION = """
@automation("versioned", version={v})
def versioned_v{v}(ctx, target, count):
    for i in range(count):
        yield Request("ping", {{"version": {v}, "step": i}}, target=target)
    return {{"version": {v}}}
"""


def versioned_code(directory, versions):
    """A directory of automation code registering ``versioned`` at ``versions``."""
    directory.mkdir()
    (directory / "versioned.py").write_text(
        VERSIONED.format(versions="".join(VERSION.format(v=v) for v in versions)))
    return {"PEERCTL_AUTOMATIONS_PATH": str(directory)}


def start_versioned(store, code_env, args, **options):
    return start_automation(store, "versioned", args,
                            code=code_env["PEERCTL_AUTOMATIONS_PATH"], **options)


def logged_versions(store, automation_id):
    return {kv.value["args"]["version"] for kv in store.range(keys.auto(automation_id, "log/"))[0]}


def test_an_automation_keeps_its_version_after_a_newer_one_is_registered(cluster, store,
                                                                        tmp_path):
    """Started under v1; its member restarts with code holding v1 and v2:
    the running one replays and goes on with v1, a new one records v2."""
    old_code = versioned_code(tmp_path / "v1", [1])
    new_code = versioned_code(tmp_path / "v1v2", [1, 2])
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, sleep=0.2)
    start_peers(cluster, store, ["t1"], hooks=hooks)
    start_peers(cluster, store, ["m1"], env=old_code)
    old = start_versioned(store, old_code, {"target": "t1", "count": 12}, members=1,
                          prefer=["m1"])
    wait_for(lambda: len(api.get_task(store, old)["log"]) >= 3, what="3 steps under v1")
    cluster.kill("m1")
    cluster.start_peer("m1", env=new_code)          # the upgrade
    new = start_versioned(store, new_code, {"target": "t1", "count": 3}, members=1,
                          prefer=["m1"])
    old_task, new_task = finished(store, old), finished(store, new)
    assert (old_task["state"], old_task["version"], old_task["result"]) == ("done", 1, {"version": 1})
    assert (new_task["state"], new_task["version"], new_task["result"]) == ("done", 2, {"version": 2})
    assert logged_versions(store, old) == {1} and len(old_task["log"]) == 12
    assert logged_versions(store, new) == {2}
    assert "initiator_leads" in cluster.log("m1").split("session_started")[-1], \
        "the upgraded peer did not lead the v1 automation"


def test_a_peer_without_the_version_steps_aside_for_one_that_has_it(cluster, store, tmp_path):
    """Rolling upgrade: the automation is v2; the older member, which only
    knows v1, wins the election first.  It must step aside, not declare the
    automation stuck, so that the upgraded member leads it to the end."""
    old_code = versioned_code(tmp_path / "v1", [1])
    new_code = versioned_code(tmp_path / "v1v2", [1, 2])
    start_peers(cluster, store, ["old"], env=old_code)
    start_peers(cluster, store, ["new"], env=new_code, ttl=10)
    cluster.kill("new", signal.SIGSTOP)     # so that "old" campaigns first
    try:
        automation_id = start_versioned(store, new_code, {"target": "old", "count": 3},
                                        members=2, prefer=["old", "new"])
        waiting = wait_until(lambda: api.get_task(store, automation_id), lambda t: t["error"],
                             timeout=8, what="the older peer to step aside, saying why")
        assert waiting["state"] == "running"
        assert waiting["error"].startswith("waiting for a peer that can run it:"), waiting
        assert "version 2" in waiting["error"]
        assert "initiator_steps_aside" in cluster.log("old")
    finally:
        cluster.kill("new", signal.SIGCONT)
    task = finished(store, automation_id)
    assert (task["state"], task["version"], task["result"], task["error"]) == \
        ("done", 2, {"version": 2}, None), task["error"]
    writers = {kv.value["initiator"] for kv in store.range(keys.auto(automation_id, "log/"))[0]}
    assert writers == {"new"}
    assert [e["status"] for e in task["log"]] == ["ok"] * 3     # "old" still executes requests


def test_hooks_see_the_request_and_a_failing_pre_hook_fails_it(cluster, store, tmp_path):
    """CONTRACT.md "Hooks": the post hook gets the payload plus the
    response on stdin; a pre hook exiting non-zero fails the request, with
    the hook's stderr as the error, and the handler does not run."""
    hooks = str(tmp_path / "hooks")
    refusal = "maintenance window: step 1 refused"
    recording_hook(hooks, "ping", "pre", script=(
        "if event['args']['step'] == 1:\n"
        f"    sys.stderr.write({refusal!r} + '\\n')\n"
        "    sys.exit(3)"))
    posts = recording_hook(hooks, "ping", "post")
    start_peers(cluster, store, ["t1"], hooks=hooks)
    start_peers(cluster, store, ["m1"], env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS})
    automation_id = start_automation(store, "steps", {"target": "t1", "count": 3},
                                          members=1, prefer=["m1"])
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    outcomes = task["result"]["outcomes"]
    assert [(o["status"], o["error"]) for o in outcomes] == \
        [("ok", None), ("error", refusal), ("ok", None)]
    seen = wait_until(lambda: recorded(posts), lambda r: len(r) == 3, what="three post hooks")
    by_index = {event["index"]: event for event in seen}
    for index in range(3):
        event = by_index[index]
        assert {k: event[k] for k in ("automation", "index", "request", "host", "args")} == \
            {"automation": automation_id, "index": index, "request": "ping", "host": "t1",
             "args": {"step": index}}
    assert by_index[0]["response"]["status"] == "ok"
    assert by_index[0]["response"]["value"]["host"] == "t1"     # the handler's answer
    assert by_index[1]["response"] == {"status": "error", "error": refusal}
    responses = {kv.key: kv.value for kv in store.range(keys.auto(automation_id, "resp/"))[0]}
    assert "value" not in responses[keys.response(automation_id, 1)], "the handler ran"


def test_abort_stops_a_running_automation(cluster, store, tmp_path):
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, sleep=0.2)
    start_peers(cluster, store, ["h1", "h2"], hooks=hooks)
    automation_id = api.start_automation(store, "ping", {"hosts": ["h1", "h2"], "rounds": 50})
    wait_for(lambda: len(api.get_task(store, automation_id)["log"]) >= 2, what="first round")
    assert api.abort(store, automation_id)["state"] == "aborted"
    task = api.get_task(store, automation_id)
    assert task["state"] == "aborted" and len(task["log"]) < 100
    assert store.range("member/")[0] == []


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_sigkill_during_steps_run_on_the_initiator(cluster, store, tmp_path):
    """Untargeted steps run on the initiator, whose response rides on the
    next append.  Killing it mid-way loses at most the step in flight, and
    runs nothing twice."""
    hooks = str(tmp_path / "hooks")
    runs_log = counting_hook(hooks, request="noop", sleep=0.05)
    env = {"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS}
    start_peers(cluster, store, ["m1", "m2"], hooks=hooks, env=env)
    automation_id = start_automation(store, "local_steps", {"count": 40}, members=2,
                                     prefer=["m1", "m2"])
    task = wait_until(lambda: api.get_task(store, automation_id), lambda t: len(t["log"]) >= 10,
                      what="10 steps")
    first = task["initiator"]
    cluster.kill(first)
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    outcomes = task["result"]["outcomes"]
    assert [o["step"] for o in outcomes] == list(range(40))
    lost = [o for o in outcomes if o["status"] != "ok"]
    assert len(lost) <= 1 and all(o["status"] == "lost" for o in lost)
    runs = assert_each_index_ran_once(runs_log, automation_id)
    answered_ok = {e["index"] for e in task["log"] if e["status"] == "ok"}
    assert answered_ok <= {int(i) for _, i in runs}, "an answer without an execution"
    assert {o["executor"] for o in outcomes if o["status"] == "ok"} == {"m1", "m2"}


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_running_tasks_summary_counts_steps_without_a_write_per_step(cluster, store, tmp_path):
    """tasks/<id> names its leader from the first step and counts steps as
    they go, but is rewritten at most every SUMMARY_INTERVAL, not with each
    append (a write and a watch event less on most steps)."""
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, request="noop")       # a process per step: a run of seconds
    start_peers(cluster, store, ["m1"], hooks=hooks,
                env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS})
    started = time.monotonic()
    automation_id = start_automation(store, "local_steps", {"count": 150}, members=1,
                                     prefer=["m1"])
    counted = set()

    def summary_once_done():
        summary = store.get(keys.task(automation_id)).value
        counted.add(summary.get("steps"))
        return summary if summary["state"] in keys.TERMINAL_STATES else None
    summary = wait_for(summary_once_done, timeout=120, what="the automation to finish")
    elapsed = time.monotonic() - started
    assert (summary["state"], summary["steps"], summary["initiator"]) == ("done", 150, "m1")
    assert len({n for n in counted if n and 0 < n < 150}) >= 2, "no count while running"
    writes = store.get(keys.task(automation_id)).version
    assert writes <= 3 + elapsed / SUMMARY_INTERVAL, (writes, elapsed)
    assert writes < 150 / 2


@pytest.mark.slow       # a long scenario: members killed one after another
def test_members_that_die_are_replaced_so_the_automation_outlives_them(cluster, store, tmp_path):
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, sleep=0.15)
    start_peers(cluster, store, ["t1"], hooks=hooks)
    start_peers(cluster, store, ["m1", "m2", "m3", "x1"])
    automation_id = api.start_automation(store, "ping", {"hosts": ["t1"], "rounds": 40},
                                         prefer=["m1", "m2", "m3"])
    leader = wait_for(lambda: api.get_task(store, automation_id)["initiator"], what="a leader")
    for member in {"m1", "m2", "m3"} - {leader}:
        cluster.kill(member)
    spec = wait_until(lambda: store.get(keys.spec(automation_id)).value,
                      lambda s: "x1" in s["members"], what="x1 recruited")
    assert set(spec["members"]) >= {"m1", "m2", "m3", "x1"}
    cluster.kill(leader)
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    assert task["initiator"] in ("x1", "t1")
    assert len(task["result"]["replies"]) == 40
    assert store.range("member/")[0] == [], "members keep duties of a finished automation"


def test_finished_automations_are_compacted_after_the_retention(cluster, store, tmp_path):
    conf = tmp_path / "peerctl.conf"
    conf.write_text("[peerctl]\nretention = 2s\n")
    start_peers(cluster, store, ["h1", "h2"], env={"PEERCTL_CONF": str(conf)})
    done = api.start_automation(store, "ping", {"hosts": ["h1", "h2"], "rounds": 2})
    assert finished(store, done)["state"] == "done"
    assert api.list_tasks(store, include_finished=True)[0]["id"] == done   # kept for a while
    hooks = str(tmp_path / "hooks")
    counting_hook(hooks, sleep=30)      # keep a second automation running
    cluster.start_peer("slow", extra_args=["--hooks", hooks], env={"PEERCTL_CONF": str(conf)})
    wait_for(lambda: "slow" in api.live_hosts(store), what="slow alive")
    running = api.start_automation(store, "ping", {"hosts": ["slow"], "rounds": 1})
    wait_for(lambda: store.range(keys.auto(done))[0] == [], what="the finished one compacted")
    assert store.get(keys.task(done)) is None
    with pytest.raises(api.UnknownTask):
        api.get_task(store, done)
    assert api.get_task(store, running)["state"] == "running"


def test_a_peer_paused_past_its_ttl_starts_a_new_session_when_it_wakes(cluster, store):
    """SIGSTOP a peer until its lease expires, then SIGCONT it: whichever
    notices first (its keepalive, or a lease-bound write refused with
    'lease not found', now a StoreUnavailable) ends the session; the same
    process makes a new one and is alive again."""
    start_peers(cluster, store, ["h1"], ttl=2)
    process = cluster.peers["h1"]
    process.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "h1" not in api.live_hosts(store), timeout=30,
                 what="the paused peer's lease to expire")
    finally:
        process.send_signal(signal.SIGCONT)
    wait_for(lambda: api.live_hosts(store).get("h1", {}).get("pid") == process.pid,
             timeout=30, what="the same process alive again in hosts/")
    assert process.poll() is None, cluster.log("h1")[-2000:]
