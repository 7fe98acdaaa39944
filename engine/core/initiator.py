"""The elected initiator of one automation: replays its log, then leads it.

Only the initiator appends to the log, and every write it makes carries the
election fence, so a deposed initiator cannot write.  It also decides the
fate of requests nobody will answer: past its deadline a request gets a
``timeout`` response; when its executor died (claim gone with no answer, or
target host gone before claiming) it gets ``lost``.  Both are written
create-if-absent, racing the executor's own response: whichever lands first
is final, and every member sees the same one.  Nothing is ever re-run.

Durable timers (``ctx.sleep_until``) are steps no executor runs: the
initiator answers each at its logged time, or at once when a new leader
finds it overdue, or earlier when the automation is nudged
(``auto/<id>/wake/``, deleted with the answer) or told of an abort.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from engine.errors import Deposed

from . import failpoints, keys
from .election import Candidacy
from .hosts import live_host_names
from .record import AutomationRecord, response_from
from .registry import UnknownAutomation, lookup
from .replay import TIMER, LoggedStep, NewRequest, NonDeterminism, Replayer
from .session import Session
from .store import KV, Delete, Put, Store, StoreUnavailable, absent, lease_is
from .values import readable
from .watch import PrefixWatch, Reset

__all__ = ["Initiator", "Outcome"]

log = structlog.get_logger("peerctl.initiator")

APPEND_BATCH = 40           # requests per transaction (etcd allows 128 operations)
LEFTOVER_PATIENCE = 10.0    # seconds to keep trying to write taken responses on exit
HOST_CHECK_INTERVAL = 0.5
FINISH_TXN_OPS = 100        # operations in the finishing transaction (etcd allows 128)
SUMMARY_INTERVAL = 0.5      # seconds between updates of a running task's summary (its steps)


class Outcome:
    FINISHED = "finished"       # terminal state written (or found)
    DEPOSED = "deposed"         # leadership lost: stop, another member leads
    RESTART = "restart"         # local view no longer trusted: replay again
    STEP_ASIDE = "step_aside"   # this peer lacks the worker's code: let another lead


class _Restart(Exception):
    """A write failed though we still lead: re-read etcd before going on."""


@dataclass(frozen=True)
class _Taken:
    """A request run on this peer whose response the initiator will write."""
    index: int
    response: dict


class Initiator:
    def __init__(self, store: Store, session: Session, host: str, automation_id: str,
                 candidacy: Candidacy, run_local, stop):
        self.store = store
        self.session = session
        self.host = host
        self.id = automation_id
        self.candidacy = candidacy
        self.run_local = run_local      # fn(automation_id, index, entry, take=): runs it here
        self.stop = stop
        self.log = log.bind(automation=automation_id, host=host)
        self._summary_at: float | None = None       # when this leader last wrote tasks/<id>

    # -- fenced writes ------------------------------------------------------

    def _txn(self, compares, success) -> bool:
        """Fenced (:meth:`Candidacy.txn`): raises :class:`Deposed` once we lead
        no more; False when only ``compares`` refused it."""
        return self.candidacy.txn(compares, success).succeeded

    # -- main loop ----------------------------------------------------------

    def run(self) -> str:
        self._closed = False
        self._carry: list[tuple[int, dict]] = []     # responses to write with the next txn
        try:
            return self._run()
        except Deposed:
            self.log.info("initiator_deposed")
            return Outcome.DEPOSED
        except _Restart:
            return Outcome.RESTART
        finally:
            self._closed = True
            self._write_leftover_responses()

    def _run(self) -> str:
        kvs, revision = self.store.range(keys.auto(self.id))
        record = AutomationRecord.parse(self.id, kvs, revision)
        if record.spec is None and record.status is None:
            return Outcome.FINISHED         # compacted away (or never an automation)
        self.spec = record.spec or {}
        if record.state in keys.TERMINAL_STATES:
            return Outcome.FINISHED
        if record.unreadable:
            # A step, response or the spec itself cannot be read: replaying
            # around it could run something twice or never; end it, saying so.
            return self._finish("failed", None, f"unreadable key {record.unreadable[0]} "
                                "(see peerctl scrub)", record)
        try:
            worker = lookup(self.spec["kind"], self.spec.get("version", 1))
            self.cleans_up = getattr(worker, "cleans_up", False)
            if record.abort and not self.cleans_up:
                return self._finish("aborted", None, "aborted by request", record)
            replayer = Replayer(self.id, worker, self.spec.get("args", {}),
                                self.spec.get("version", 1), self.spec.get("created", 0.0),
                                logged=record.logged_steps())
            told = record.aborting.mod_revision if record.aborting is not None else None
            for index, response in record.responses_in_order():
                if told is not None and response.revision > told:
                    replayer.deliver_abort()
                    told = None
                replayer.deliver(index, response)
            if told is not None:
                replayer.deliver_abort()
        except UnknownAutomation as exc:
            # Older code during a rolling upgrade: a member that knows this
            # kind and version may lead it; this one must not declare it stuck.
            self.log.warning("initiator_steps_aside", error=str(exc))
            self._note_waiting(record, f"waiting for a peer that can run it: {exc}")
            return Outcome.STEP_ASIDE
        except NonDeterminism as exc:
            return self._finish("stuck", None, str(exc), record)

        self._note_waiting(record, None)
        self.entries = dict(record.entries)
        self.answered = set(record.responses)     # responses seen and delivered
        # Unanswered requests whose fate is still ours to watch: index -> deadline.
        self.open = {i: self.entries[i]["deadline"] for i in record.pending()
                     if self.entries[i].get("request") != TIMER}
        # Sleeping timers: index -> when to wake it.  A nudge or an abort
        # told wakes them all (``_fire_timers``).
        self.timers = {i: float((self.entries[i].get("args") or {}).get("until", 0))
                       for i in record.pending() if self.entries[i].get("request") == TIMER}
        self.wakes = {kv.key: kv.value for kv in record.wakes}
        self.wake_all = "abort" if record.aborting is not None else None
        self.claimed = {i: kv.value for i, kv in record.claims.items()}
        self.telling_abort = record.aborting is not None
        self.next_index = max(self.entries, default=-1) + 1
        self._gone_since: dict[str, float] = {}    # target host -> first seen not alive
        self._summary_at = None
        self.log.info("initiator_leads", replayed=len(self.entries), pending=len(record.pending()))
        watch = PrefixWatch(self.store, keys.auto(self.id), revision,
                            quiet=self._heard_late).start()
        self._watch = watch
        try:
            # Requests whose executor died while nobody led.
            for index in record.pending():
                if index not in self.claimed and index not in self.timers:
                    self._mark_lost_if_abandoned(index)
            self._run_own_claims(record)
            return self._lead(replayer, watch, record)
        finally:
            watch.stop()

    def _run_own_claims(self, record) -> None:
        """Run again the steps with no target that this very session claimed
        in an append and may never have started: the append landed but its
        reply was lost (an etcd member restarted), so the leader before this
        one, in this process, stopped before it ran them.  Nobody else
        would: the claim lives as long as this session, so the step is
        neither ``lost`` nor anyone's work.  Steps are idempotent, and the
        executor does not start one it already runs."""
        for index in record.pending():
            claim = record.claims.get(index)
            entry = self.entries.get(index) or {}
            if claim is not None and entry.get("local") and entry.get("request") != TIMER \
                    and claim.lease == self.session.lease \
                    and (readable(claim) or {}).get("executor") == self.host:
                self.log.info("own_claim_run_again", index=index, request=entry["request"])
                self.run_local(self.id, index, entry, take=self._take)

    def _lead(self, replayer: Replayer, watch: PrefixWatch, record) -> str:
        last_host_check = 0.0
        while True:
            if self.stop.is_set() or not self.session.alive:
                return Outcome.DEPOSED
            if replayer.finished:
                state = "failed" if replayer.error else "done"
                error = replayer.error
                if replayer.aborted:
                    state, error = "aborted", error or "aborted by request"
                return self._finish(state, replayer.result, error, record)
            if record.abort and self.cleans_up and not self.telling_abort:
                self._tell_abort()
            try:
                new = replayer.take_new()
                if new:
                    self._append(replayer, new)
                    continue
            except NonDeterminism as exc:
                return self._finish("stuck", None, str(exc), record)
            self._flush_carry()
            # Everything that arrived meanwhile, before the next append: the
            # responses of several batches lead to one transaction.
            for batch in watch.drain(timeout=self._next_wakeup()):
                if isinstance(batch, Reset):
                    return Outcome.RESTART
                outcome = self._apply(batch, replayer, record)
                if outcome:
                    return outcome
            now = time.time()
            self._expire_deadlines(now)
            self._fire_timers(now)
            if now - last_host_check >= HOST_CHECK_INTERVAL:
                last_host_check = now
                alive = live_host_names(self.store)
                self._check_targets(alive)
                self._replenish_members(alive)

    def _heard_late(self, event) -> bool:
        """Events that need no action now (watch thread): this leader's own
        log entries, claims taken, progress.  Not waking the leader for
        them leaves the CPU to the executor whose step is under way; they
        reach it with the next batch, in order, within a wake-up interval
        (a claim's delete, which may mean `lost`, is never among them)."""
        part, _, rest = event.kv.key[len(keys.auto(self.id)):].partition("/")
        if part == "progress":
            return True
        return event.kind == "put" and part in ("log", "claim") and rest.isdigit() \
            and readable(event.kv) is not None

    def _next_wakeup(self) -> float:
        due = [*self.open.values(), *self.timers.values()]
        if self.timers and (self.wakes or self.wake_all == "abort"):
            return 0.0
        until = (min(due) - time.time()) if due else HOST_CHECK_INTERVAL
        return max(0.0, min(until, HOST_CHECK_INTERVAL))

    def _take(self, index: int, response: dict) -> bool:
        """Executor thread: may the initiator write this local response itself?

        Only when it is the one open request (a sequential stretch of the
        worker): then no other response can come before it, so the worker
        may see it at once and the initiator writes it in the same
        transaction as the next step's append: one transaction per step
        instead of two.  Otherwise the executor writes it as usual.
        """
        try:
            # A sleeping timer may be answered at any moment: not sequential.
            sole = not self._closed and list(self.open) == [index] and not self.timers \
                and not self.entries.get(index, {}).get("at_once")
        except RuntimeError:        # open changed under us: not a sequential stretch
            sole = False
        if sole:
            self._watch.events.put(_Taken(index, response))
        return sole

    def _write_leftover_responses(self) -> None:
        """Responses taken but not written when this initiator stops: they are
        the executor's answers, so write them create-if-absent, unfenced."""
        leftovers = list(self._carry)
        watch = getattr(self, "_watch", None)
        while watch is not None and not watch.events.empty():
            item = watch.events.get_nowait()
            if isinstance(item, _Taken):
                leftovers.append((item.index, item.response))
        deadline = time.monotonic() + LEFTOVER_PATIENCE
        for index, response in leftovers:
            key = keys.response(self.id, index)
            while True:
                try:
                    self.store.txn([absent(key)], [Put(key, response)])
                    break
                except StoreUnavailable:
                    if time.monotonic() > deadline or not self.session.alive:
                        self.log.warning("response_dropped", index=index)
                        break
                    time.sleep(0.1)

    def _apply(self, events, replayer: Replayer, record) -> str | None:
        if isinstance(events, _Taken):
            index = events.index
            if index in self.answered:
                return None                     # we timed it out first
            entry = self.entries.get(index, {})
            if list(self.open) != [index] or self.timers:   # cannot happen: write it plainly
                key = keys.response(self.id, index)
                self._txn([absent(key)], [Put(key, events.response)])
                return None
            self.answered.add(index)
            self.open.pop(index, None)
            self._carry.append((index, events.response))
            kv = KV(keys.response(self.id, index), events.response, 0, 0, 1, 0)
            try:
                replayer.deliver(index, response_from(kv, entry.get("time", 0.0)))
            except NonDeterminism as exc:
                return self._finish("stuck", None, str(exc), record)
            return None
        for event in events:
            part, _, rest = event.kv.key[len(keys.auto(self.id)):].partition("/")
            if event.kind == "put" and part in ("spec", "status", "log", "resp", "claim") and (
                    readable(event.kv) is None
                    or part in ("log", "resp", "claim") and not rest.isdigit()):
                return self._finish("failed", None, f"unreadable key {event.kv.key} "
                                    "(see peerctl scrub)", record)
            if part == "resp" and event.kind == "put":
                index = int(rest)
                if index in self.answered:
                    continue
                self.answered.add(index)
                self.open.pop(index, None)
                entry = self.entries.get(index, {})
                try:
                    replayer.deliver(index, response_from(event.kv, entry.get("time", 0.0)))
                except NonDeterminism as exc:
                    return self._finish("stuck", None, str(exc), record)
            elif part == "claim":
                index = int(rest)
                if event.kind == "put":
                    self.claimed[index] = event.kv.value
                else:
                    self.claimed.pop(index, None)
                    if index not in self.answered:
                        self._mark_lost_if_abandoned(index)
            elif part == "abort" and event.kind == "put":
                if not self.cleans_up:
                    return self._finish("aborted", None, "aborted by request", record)
                record.abort = event.kv.value
            elif part == "aborting" and event.kind == "put":
                replayer.deliver_abort()
                self.wake_all = "abort"
            elif part == "wake":
                if event.kind == "put":        # even garbage wakes: it is deleted then
                    self.wakes[event.kv.key] = event.kv.value
                else:
                    self.wakes.pop(event.kv.key, None)
            elif part == "status" and event.kind == "put" and \
                    (event.kv.value or {}).get("state") in keys.TERMINAL_STATES:
                return Outcome.FINISHED
            elif event.kv.key == self.candidacy.key and event.kind == "delete":
                return Outcome.DEPOSED
        return None

    # -- appending ------------------------------------------------------------

    def _append(self, replayer: Replayer, new: list[NewRequest]) -> None:
        for start in range(0, len(new), APPEND_BATCH):
            chunk = new[start:start + APPEND_BATCH]
            compares, ops, appended = [], [], []
            now = time.time()
            for item in chunk:
                index = self.next_index + len(appended)
                request = item.request
                local = request.target is None
                timer = request.name == TIMER
                entry = {"index": index, "worker": item.worker, "seq": item.seq,
                         "worker_name": item.worker_name, "request": request.name,
                         "target": request.target or self.host, "args": request.args,
                         "fingerprint": item.fingerprint, "time": now,
                         "deadline": now + request.deadline, "label": request.label,
                         "local": local, "initiator": self.host}
                if request.write_at_once:
                    entry["at_once"] = True
                compares.append(absent(keys.log_entry(self.id, index)))
                ops.append(Put(keys.log_entry(self.id, index), entry))
                if timer:
                    pass        # answered by the initiator (_fire_timers)
                elif local:
                    ops.append(Put(keys.claim(self.id, index), {"executor": self.host},
                                   self.session.lease))
                else:
                    ops.append(Put(keys.inbox(request.target, self.id, index), {}))
                appended.append(entry)
            # The summary (tasks/<id>: who leads, how many steps) with the
            # first append of each leader, then at most every SUMMARY_INTERVAL:
            # a write and a watch event less on most steps.
            summarised = self._summary_at is None or \
                time.monotonic() - self._summary_at >= SUMMARY_INTERVAL
            if summarised:
                ops.append(Put(keys.task(self.id),
                               self._summary("running", self.next_index + len(appended))))
            compares, ops = self._with_carry(compares, ops)
            for entry in appended:
                failpoints.crash(f"append {entry['index']}")
                failpoints.crash(f"append {entry['request']}")
            if not self._txn(compares, ops):
                raise _Restart()    # someone else wrote our indices: never continue blind
            for entry in appended:
                failpoints.crash(f"appended {entry['request']}")
            if summarised:
                self._summary_at = time.monotonic()
            for entry in appended:
                self.entries[entry["index"]] = entry
                if entry["request"] == TIMER:
                    self.timers[entry["index"]] = float(entry["args"]["until"])
                    continue
                self.open[entry["index"]] = entry["deadline"]
                if entry["local"]:
                    self.claimed[entry["index"]] = {"executor": self.host}
                self.next_index = entry["index"] + 1
            for entry, item in zip(appended, chunk):
                replayer.bind(LoggedStep(entry["index"], item.worker, item.seq, item.fingerprint))
            for entry in appended:
                if entry["local"] and entry["request"] != TIMER:
                    self.run_local(self.id, entry["index"], entry, take=self._take)

    def _tell_abort(self) -> None:
        """Log the point at which the workers learn of the abort: responses
        taken but unwritten land first, so that they come before it on
        every replay; the workers are told when the marker comes back
        through the watch, in revision order with everything else."""
        self.telling_abort = True
        compares, ops = self._with_carry([absent(keys.aborting(self.id))],
                                         [Put(keys.aborting(self.id), {"time": time.time()})])
        self._txn(compares, ops)

    def _with_carry(self, compares, ops):
        """Add the taken responses to a transaction (they land with it)."""
        carry, self._carry = self._carry, []
        for index, response in carry:
            key = keys.response(self.id, index)
            compares = [*compares, absent(key)]
            ops = [Put(key, response), *ops]
        return compares, ops

    def _flush_carry(self) -> None:
        if self._carry:
            compares, ops = self._with_carry([], [])
            if not self._txn(compares, ops):
                raise _Restart()

    def _note_waiting(self, record, why: str | None) -> None:
        """Say in the running status why nobody leads (``task ID`` shows it as
        ``error``), or clear that once a peer that can lead does."""
        if (record.status or {}).get("error") == why:
            return
        self._txn([], [Put(keys.status(self.id), {"state": "running", "error": why,
                                                  "updated": time.time()})])

    def _summary(self, state: str, steps: int) -> dict:
        return {"id": self.id, "kind": self.spec["kind"], "state": state,
                "created": self.spec.get("created"), "members": self.spec.get("members", []),
                "steps": steps, "initiator": self.host}

    # -- fates of unanswered requests ---------------------------------------

    def _respond(self, index: int, status: str, error: str, compares=(), extra_ops=()):
        entry = self.entries[index]
        ops = [Put(keys.response(self.id, index),
                   {"status": status, "error": error, "executor": None, "time": time.time()}),
               *extra_ops]
        if not entry.get("local"):
            ops.append(Delete(keys.inbox(entry["target"], self.id, index)))
        return self._txn([absent(keys.response(self.id, index)), *compares], ops)

    def _mark_lost_if_abandoned(self, index: int) -> None:
        """Claimed once, claim gone, no answer: the executor died mid-request."""
        entry = self.entries[index]
        compares = [absent(keys.claim(self.id, index))]
        if not entry.get("local"):
            compares.append(absent(keys.inbox(entry["target"], self.id, index)))
        if self._respond(index, "lost", f"executor on {entry['target']} died before answering",
                         compares):
            self.log.info("request_lost", index=index, target=entry["target"])

    def _fire_timers(self, now: float) -> None:
        """Answer the timers that are due; all of them when the automation
        was nudged (the wake keys go with the answer) or told of an abort
        (once: timers yielded afterwards sleep)."""
        if not self.timers:
            return
        if self.wake_all == "abort":
            woke, why, due = "abort", ["aborted by request"], sorted(self.timers)
            self.wake_all = "told"
        elif self.wakes:
            woke, due = "nudge", sorted(self.timers)
            why = [str(value.get("why", "")) if isinstance(value, dict) else "?"
                   for value in self.wakes.values()]
        else:
            woke, why = "time", []
            due = sorted(i for i, until in self.timers.items() if until <= now)
        wakes = list(self.wakes) if woke == "nudge" else []
        for index in due:
            key = keys.response(self.id, index)
            response = {"status": "ok", "value": {"woke": woke, "at": now, "why": why},
                        "error": None, "executor": None, "time": now}
            compares, ops = self._with_carry([absent(key)], [Put(key, response)])
            ops += [Delete(wake) for wake in wakes]
            failpoints.crash("wake")
            if not self._txn(compares, ops):
                raise _Restart()        # answered already: re-read before going on
            wakes = []
            del self.timers[index]
            self.log.info("timer_woke", index=index, woke=woke)
        if woke == "nudge":
            self.wakes.clear()

    def _expire_deadlines(self, now: float) -> None:
        for index, deadline in list(self.open.items()):
            if deadline <= now:
                entry = self.entries[index]
                if self._respond(index, "timeout",
                                 f"no answer from {entry['target']} within "
                                 f"{entry['deadline'] - entry['time']:.1f}s"):
                    self.log.info("request_timeout", index=index, target=entry["target"])
                del self.open[index]    # whichever response landed is on its way

    def _check_targets(self, alive: set[str]) -> None:
        """An unclaimed request whose host is gone is `lost` once the host
        has stayed gone for a lease TTL.  A peer that comes back (restarted
        after a crash, or re-making its session after an etcd outage ended
        every lease at once) re-publishes its host record and claims its
        inbox within that time; its request never started, so waiting costs
        detection time only, while writing `lost` at once would fail work
        the host is about to do.  The deadline still bounds the wait."""
        now = time.monotonic()
        for host in [h for h in self._gone_since if h in alive]:
            del self._gone_since[host]
        waiting = [i for i in self.open if i not in self.claimed
                   and not self.entries[i].get("local")]
        for index in waiting:
            target = self.entries[index]["target"]
            if target in alive:
                continue
            if now - self._gone_since.setdefault(target, now) >= self.session.ttl:
                if self._respond(index, "lost", f"host {target} is not alive",
                                 [absent(keys.claim(self.id, index)),
                                  lease_is(keys.host(target), 0)]):
                    self.log.info("request_lost", index=index, target=target, reason="host dead")

    def _replenish_members(self, alive: set[str]) -> None:
        """Keep enough live members to carry on if this peer dies: when some
        have died, live non-members join (dead ones may come back and rejoin)."""
        members = list(self.spec.get("members", []))
        wanted = min(self.spec.get("wanted_members", len(members)), len(alive))
        short = wanted - len([m for m in members if m in alive])
        recruits = sorted(alive - set(members))[:max(short, 0)]
        if not recruits:
            return
        spec = {**self.spec, "members": members + recruits,
                "wanted_members": self.spec.get("wanted_members", len(members))}
        ops = [Put(keys.spec(self.id), spec)]
        ops += [Put(keys.member(host, self.id), {"since": time.time()}) for host in recruits]
        if not self._txn([], ops):
            raise _Restart()
        self.spec = spec
        self.log.info("members_recruited", recruits=recruits, members=spec["members"])

    # -- the end ---------------------------------------------------------------

    def _finish(self, state: str, result, error, record) -> str:
        members = (self.spec or {}).get("members", [])
        ops = [Put(keys.status(self.id), {"state": state, "result": result, "error": error,
                                          "initiator": self.host, "updated": time.time()}),
               Put(keys.task(self.id), {**self._summary(state, max(getattr(self, "next_index", 0),
                                                                    len(record.entries))),
                                        "finished": time.time()})]
        ops += [Delete(keys.member(m, self.id)) for m in members]
        compares, ops = self._with_carry([], ops)
        # Whatever the end (aborted, stuck, failed, or done with the losers of
        # a ctx.first unanswered), unclaimed work must not start any more:
        # its inbox keys go with the terminal status (the first ones; a long
        # tail right after, as etcd caps a transaction's operations).
        unclaimed = self._unclaimed_inbox_keys(record)
        room = max(0, FINISH_TXN_OPS - len(ops))
        ops += [Delete(key) for key in unclaimed[:room]]
        failpoints.crash("finish")
        if not self._txn(compares, ops):
            raise _Restart()
        self.log.info("automation_finished", state=state, error=error)
        rest = unclaimed[room:]
        for start in range(0, len(rest), FINISH_TXN_OPS):
            try:
                self.store.txn([], [Delete(key) for key in rest[start:start + FINISH_TXN_OPS]])
            except StoreUnavailable:
                break   # executors refuse entries of a finished automation anyway
        return Outcome.FINISHED

    def _unclaimed_inbox_keys(self, record) -> list[str]:
        entries = getattr(self, "entries", record.entries)
        answered = getattr(self, "answered", record.responses)
        claimed = getattr(self, "claimed", record.claims)
        return [keys.inbox(e["target"], self.id, i) for i, e in sorted(entries.items())
                if i not in answered and i not in claimed and not e.get("local")]
