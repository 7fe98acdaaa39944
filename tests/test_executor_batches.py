"""The executor's group commits: inbox entries that arrive together are
claimed in one transaction, responses that finish together are written in
one, and a batch never changes an entry's fate: one that is taken or
answered already is left as it is while the others go on, and a peer killed
with a batch in flight runs nothing twice."""
from __future__ import annotations

import pytest

import contextlib
import threading

from engine.core import keys
from engine.core.executor import Executor
from engine.core.session import Session
from engine.core.store import Put
from tests.support import TEST_AUTOMATIONS, wait_for
from tests.support.cluster import finished, start_automation, start_peers
from tests.support.handlers import new_host
from tests.support.hooks import assert_each_index_ran_once, counting_hook, executions

WIDTH = 10
ENV = {"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS}


def log_pings(store, automation_id: str, count: int, target: str = "t1") -> None:
    """A running automation whose log holds ``count`` pings to ``target``,
    all put into its inbox by one transaction, as the initiator appends."""
    store.put(keys.spec(automation_id), {"id": automation_id, "kind": "fanout", "version": 1,
                                         "args": {}})
    store.put(keys.status(automation_id), {"state": "running"})
    store.txn([], [op for index in range(count) for op in ping_ops(automation_id, index, target)])


def ping_ops(automation_id: str, index: int, target: str = "t1") -> list[Put]:
    """The log entry and inbox key of ping number ``index``."""
    return [Put(keys.log_entry(automation_id, index),
                {"index": index, "worker": "0", "seq": index, "request": "ping",
                 "target": target, "args": {}, "fingerprint": "f"}),
            Put(keys.inbox(target, automation_id, index), {})]


def responses(store, automation_id: str):
    return {int(kv.key.rsplit("/", 1)[1]): kv
            for kv in store.range(keys.auto(automation_id, "resp/"))[0]}


class HeldWrites:
    """Wraps the executor's store: the first transaction putting a key that
    holds ``part`` (``/resp/``: a response; ``/claim/``: a claim) waits
    until ``release`` is set, so work arriving meanwhile queues."""

    def __init__(self, store, part: str = "/resp/"):
        self._store = store
        self.part = part
        self.held = threading.Event()
        self.release = threading.Event()
        self.count = 0      # such keys in the held transaction

    def __getattr__(self, name):
        return getattr(self._store, name)

    def txn(self, compares, success, failure=()):
        puts = [op for op in success if isinstance(op, Put) and self.part in op.key]
        if not self.held.is_set() and puts:
            self.count = len(puts)
            self.held.set()
            assert self.release.wait(30), "the test never released the held write"
        return self._store.txn(compares, success, failure)


@contextlib.contextmanager
def executing(store, tmp_path, hooks, held: HeldWrites | None = None):
    """An executor for host t1 taking its inbox, through ``held`` if given
    (released on the way out, whatever happened)."""
    session = Session(store, 5)
    executor = Executor(held or store, new_host(str(tmp_path), store, name="t1"), hooks,
                        workers=WIDTH + 2)
    executor.attach(session)
    try:
        yield executor
    finally:
        if held is not None:
            held.release.set()
        executor.detach()
        session.close()


@contextlib.contextmanager
def queued_behind_a_held_response(store, tmp_path):
    """WIDTH pings run by an executor whose first response is held in
    flight: yields ``(executor, held, runs)`` once every other response has
    queued behind it (``runs``: the counting hook's log)."""
    hooks = str(tmp_path / "hooks")
    runs = counting_hook(hooks)
    log_pings(store, "a1", WIDTH)
    held = HeldWrites(store)
    with executing(store, tmp_path, hooks, held) as executor:
        wait_for(held.held.is_set, what="a first response in flight")
        # The held transaction may carry a few responses that finished together.
        wait_for(lambda: len(executor._answers) == WIDTH - held.count, what="the others to queue")
        yield executor, held, runs


def test_entries_appended_together_are_claimed_in_one_transaction(store, tmp_path):
    hooks = str(tmp_path / "hooks")
    runs = counting_hook(hooks)
    log_pings(store, "a1", WIDTH)
    with executing(store, tmp_path, hooks) as executor:
        wait_for(lambda: len(responses(store, "a1")) == WIDTH, what="every ping answered")
        assert executor.wait_idle(10)
        claims = store.range(keys.auto("a1", "claim/"))[0]
        assert len(claims) == WIDTH
        assert len({kv.create_revision for kv in claims}) == 1, "claimed one by one"
        assert all(r.value["status"] == "ok" for r in responses(store, "a1").values())
        assert sorted(int(i) for _, i, _ in executions(runs)) == list(range(WIDTH))
        assert store.range(keys.inbox("t1"))[0] == []


def test_entries_appended_while_a_claim_is_in_flight_are_claimed_together(store, tmp_path):
    """Pings appended one transaction each, while the executor's claim of
    the first is in flight, reach it as separate watch batches: it claims
    them all in its next transaction."""
    hooks = str(tmp_path / "hooks")
    runs = counting_hook(hooks)
    held = HeldWrites(store, "/claim/")
    with executing(store, tmp_path, hooks, held) as executor:
        log_pings(store, "a1", 1)
        wait_for(held.held.is_set, what="the claim of the first ping in flight")
        for index in range(1, WIDTH):
            store.txn([], ping_ops("a1", index))
        wait_for(lambda: executor._watch.events.qsize() == WIDTH - 1,
                 what="each append queued as a batch of its own")
        held.release.set()
        wait_for(lambda: len(responses(store, "a1")) == WIDTH, what="every ping answered")
        assert executor.wait_idle(10)
        claims = {int(kv.key.rsplit("/", 1)[1]): kv.create_revision
                  for kv in store.range(keys.auto("a1", "claim/"))[0]}
        assert sorted(claims) == list(range(WIDTH))
        assert len({claims[i] for i in range(1, WIDTH)}) == 1, "claimed batch by batch"
        assert sorted(int(i) for _, i, _ in executions(runs)) == list(range(WIDTH))


def test_an_entry_answered_already_is_left_and_the_others_run(store, tmp_path):
    """The initiator wrote ``lost`` for index 3 before the executor came:
    the batch's transaction is refused, and each entry is claimed on its own."""
    hooks = str(tmp_path / "hooks")
    runs = counting_hook(hooks)
    log_pings(store, "a1", WIDTH)
    store.put(keys.response("a1", 3), {"status": "lost", "error": "test", "executor": None})
    with executing(store, tmp_path, hooks) as executor:
        wait_for(lambda: len(responses(store, "a1")) == WIDTH, what="every ping answered")
        assert executor.wait_idle(10)
        answers = responses(store, "a1")
        assert answers[3].value["status"] == "lost"
        assert all(answers[i].value["status"] == "ok" for i in range(WIDTH) if i != 3)
        assert sorted(int(i) for _, i, _ in executions(runs)) == \
            [i for i in range(WIDTH) if i != 3], "the answered entry ran, or another did not"
        assert store.get(keys.claim("a1", 3)) is None


def test_responses_finishing_together_land_in_one_transaction(store, tmp_path):
    """The first response is held in flight until every other request has
    finished: those queue and land together, in one transaction."""
    with queued_behind_a_held_response(store, tmp_path) as (executor, held, runs):
        assert len(executions(runs)) == WIDTH, "every ping ran"
        held.release.set()
        wait_for(lambda: len(responses(store, "a1")) == WIDTH, what="every ping answered")
        assert executor.wait_idle(10)
        revisions = sorted({kv.mod_revision for kv in responses(store, "a1").values()})
        assert len(revisions) == 2, f"written in {len(revisions)} transactions, not 2"


def test_a_timeout_written_while_a_batch_waits_stays_and_the_others_land(store, tmp_path):
    """While the queued responses wait, the initiator times one of them out: the
    batch is refused, each response is then written on its own, and the
    timeout stays (a late answer loses)."""
    with queued_behind_a_held_response(store, tmp_path) as (executor, held, runs):
        late = executor._answers[0][1]      # a queued response, not the one held
        store.put(keys.response("a1", late), {"status": "timeout", "error": "test",
                                              "executor": None})
        held.release.set()
        wait_for(lambda: len(responses(store, "a1")) == WIDTH, what="every ping answered")
        assert executor.wait_idle(10)
        answers = responses(store, "a1")
        assert answers[late].value["status"] == "timeout"
        assert [i for i, kv in answers.items() if kv.value["status"] != "ok"] == [late]
        assert len(executions(runs)) == WIDTH


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_target_killed_with_batches_in_flight_runs_nothing_twice(cluster, store, tmp_path):
    """Rounds of 12 pings at once to one peer, SIGKILLed mid-round and
    started again: every index has one answer, ok or lost, and none ran
    twice."""
    hooks = str(tmp_path / "hooks")
    runs = counting_hook(hooks, sleep=0.05)
    start_peers(cluster, store, ["p1", "p2"], hooks=hooks, env=ENV, ttl=2)
    automation_id = start_automation(store, "fanout",
                                     {"target": "p2", "width": 12, "rounds": 6},
                                     members=1, prefer=["p1"])
    wait_for(lambda: len(executions(runs)) >= 30, what="rounds under way")
    cluster.kill("p2")
    cluster.start_peer("p2", extra_args=["--hooks", hooks], env=ENV)
    task = finished(store, automation_id, timeout=120)
    assert task["state"] == "done", task["error"]
    answers = responses(store, automation_id)
    entries = store.range(keys.auto(automation_id, "log/"))[0]
    assert len(task["result"]["outcomes"]) == len(answers) == len(entries) == 72
    assert {kv.value["status"] for kv in answers.values()} <= {"ok", "lost"}
    ran = assert_each_index_ran_once(runs, automation_id)
    never_ran = {i for i, kv in answers.items() if kv.value["status"] == "ok"} - \
        {int(i) for _, i in ran}
    assert not never_ran, f"answered ok but never ran: {sorted(never_ran)}"
    assert store.range(keys.inbox("p2"))[0] == []
