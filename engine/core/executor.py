"""Runs the requests addressed to this host, each log index at most once.

A request reaches a host as a key in its inbox.  The executor claims it in one
transaction that creates the claim (bound to this peer's lease) and deletes
the inbox key, and only if no response exists yet: after that no other
incarnation of this host can pick it up again.  The handler runs in a thread
pool, between the optional pre and post hooks, and the response is written
create-if-absent: if the initiator already wrote ``timeout`` or ``lost``,
that one stays.

Both ends are group commits: the inbox entries that arrive together are
claimed in one transaction, and the responses that finish while one is
being written go in the next one.  Either falls back to one entry per
transaction when any of its entries cannot go (taken, answered, or etcd
failing mid-call), so a batch never changes what happens to an entry.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import structlog

from . import failpoints, keys, steps
from engine.errors import RequestError

from .handlers import HANDLERS
from .session import Session
from .store import Delete, Get, Put, Store, StoreRefused, StoreUnavailable, absent, exists
from .values import problem, readable, report
from .watch import PrefixWatch, Reset

__all__ = ["Executor"]

log = structlog.get_logger("peerctl.executor")

CLAIM_BATCH = 25        # inbox entries claimed per transaction (4 operations each; etcd allows 128)
RESPONSE_BATCH = 60     # responses written per transaction (2 operations each)


def _inbox_step(inbox_key: str) -> tuple[str, int] | None:
    """``inbox/<host>/<automation>/<index>`` -> (automation, index), or None."""
    parts = inbox_key.split("/")
    if len(parts) != 4 or not parts[2] or not parts[3].isdigit():
        return None
    return parts[2], int(parts[3])


class Executor:
    def __init__(self, store: Store, host, hooks_dir: str | None = None,
                 workers: int = 8):
        """``host`` is what every handler is given: any object whose
        ``host`` attribute is this host's name (the peer passes its
        :class:`~engine.hypervisor.host.hostctx.HostContext`)."""
        self.store = store
        self.host = host
        self.hooks_dir = hooks_dir
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="request")
        self.session: Session | None = None
        self._running = 0
        self._in_flight: set[tuple[str, int]] = set()    # (automation, index) running here
        self._idle = threading.Condition()
        self._watch: PrefixWatch | None = None
        self._thread: threading.Thread | None = None
        self._detached = threading.Event()
        self._unknown_claims: dict[str, str] = {}   # inbox key -> nonce, outcome unknown
        # responses waiting to be written: (automation, index, response, request name)
        self._answers: list[tuple[str, int, dict, str]] = []
        self._answers_lock = threading.Lock()
        self._answering = False     # a thread is writing _answers
        self.log = log.bind(host=host.host)

    # -- inbox -------------------------------------------------------------

    def attach(self, session: Session) -> None:
        """Start taking work from the inbox under ``session``'s lease."""
        self.session = session
        self._detached.clear()
        prefix = keys.inbox(self.host.host)
        kvs, revision = self.store.range(prefix)
        self._watch = PrefixWatch(self.store, prefix, revision, puts_only=True).start()
        unknown, self._unknown_claims = self._unknown_claims, {}
        for inbox_key, nonce in unknown.items():
            self._claim_inbox_key(inbox_key, nonce, attempt=1)
        self._take_inboxes(kvs)
        self._thread = threading.Thread(target=self._follow_inbox, daemon=True, name="inbox")
        self._thread.start()

    def detach(self) -> None:
        self._detached.set()
        if self._watch:
            self._watch.stop()
        if self._thread:
            self._thread.join(5)

    def _follow_inbox(self):
        while not self._detached.is_set():
            # Every batch queued meanwhile is claimed together.
            puts = []
            try:
                for batch in self._watch.drain(timeout=0.5):
                    if isinstance(batch, Reset):
                        self._take_inboxes(puts)
                        puts = []
                        for kv in batch.kvs:
                            self._take_inbox(kv)
                    else:
                        puts += [event.kv for event in batch if event.kind == "put"]
                self._take_inboxes(puts)
            except StoreUnavailable as exc:
                self.log.warning("inbox_unavailable", error=str(exc))

    def _take_inboxes(self, kvs) -> None:
        """Take several inbox entries, claiming the well-formed ones together
        (:meth:`_claim_together`); the others one by one."""
        together = []
        for kv in kvs:
            if _inbox_step(kv.key) is not None and readable(kv) is not None:
                together.append(kv.key)
            else:
                self._take_inbox(kv)
        for start in range(0, len(together), CLAIM_BATCH):
            self._claim_together(together[start:start + CLAIM_BATCH])

    def _claim_together(self, inbox_keys: list[str]) -> None:
        """Claim several inbox entries in one transaction (group commit), as
        :meth:`_claim_inbox_key` claims one, and run them.  If any of them
        cannot be claimed (taken, answered, gone) the transaction changes
        nothing, and each is then claimed on its own; if etcd fails
        mid-call, each is retried on its own with the nonce it was sent
        with, which recognises a claim that landed."""
        if len(inbox_keys) == 1:
            self._claim_inbox_key(inbox_keys[0])
            return
        session = self.session
        if session is None or not session.alive or self._detached.is_set():
            return
        steps_ = [_inbox_step(key) for key in inbox_keys]
        nonces = [os.urandom(8).hex() for _ in inbox_keys]
        compares, ops = [], []
        for inbox_key, (automation_id, index), nonce in zip(inbox_keys, steps_, nonces):
            claim_key = keys.claim(automation_id, index)
            compares += [exists(inbox_key), absent(claim_key),
                         absent(keys.response(automation_id, index))]
            ops += [Put(claim_key, {"executor": self.host.host, "nonce": nonce}, session.lease),
                    Delete(inbox_key), Get(keys.log_entry(automation_id, index)),
                    Get(keys.status(automation_id))]
        try:
            result = self.store.txn(compares, ops)
        except StoreUnavailable:
            for inbox_key, nonce in zip(inbox_keys, nonces):
                self._claim_inbox_key(inbox_key, nonce, attempt=1)
            return
        if not result.succeeded:
            for inbox_key in inbox_keys:
                self._claim_inbox_key(inbox_key)
            return
        ranges = list(result.ranges)
        for n, (automation_id, index) in enumerate(steps_):
            self._run_claimed(automation_id, index, keys.claim(automation_id, index),
                              ranges[2 * n], ranges[2 * n + 1])

    def _take_inbox(self, kv) -> None:
        """Claim and run an inbox entry, unless it cannot be read.  An entry
        whose key names no automation and index is left where it is, for
        ``peerctl scrub`` (reported once, never run).  One whose value cannot
        be read is answered ``error`` where its automation exists, in the
        transaction that deletes it, so its worker hears of it."""
        where = _inbox_step(kv.key)
        if where is None:
            report(kv.key, "not an inbox key: want inbox/<host>/<automation>/<index>")
            return
        if readable(kv) is None:
            self._answer_unreadable(kv.key, *where, problem(kv))
            return
        self._claim_inbox_key(kv.key)

    def _answer_unreadable(self, inbox_key: str, automation_id: str, index: int, why) -> None:
        response = keys.response(automation_id, index)
        answered = self.store.txn(
            [exists(inbox_key), exists(keys.spec(automation_id)), absent(response),
             absent(keys.claim(automation_id, index))],
            [Put(response, {"status": "error", "error": f"unreadable inbox entry: {why}",
                            "executor": self.host.host, "time": time.time()}),
             Delete(inbox_key)]).succeeded
        if answered:    # else left for inspection (reported once, by readable)
            self.log.warning("inbox_entry_answered_error", key=inbox_key, why=why)

    def _claim_inbox_key(self, inbox_key: str, nonce: str | None = None,
                         attempt: int = 0) -> None:
        """Claim and run one inbox entry.  If etcd fails mid-call the claim may
        or may not have landed: retry, and recognise our own earlier claim by
        a nonce in its value (an idempotency key, as kazoo's lock has in its
        node names).  When the session ends first (an etcd outage longer
        than the TTL ends them all) the claim is kept for the next session,
        which retries it: if it landed it is ours and never ran, so it runs
        then, instead of expiring with the old lease into `lost`."""
        automation_id, index = _inbox_step(inbox_key)
        claim_key = keys.claim(automation_id, index)
        nonce = nonce or os.urandom(8).hex()
        while True:
            session = self.session
            if session is None or not session.alive or self._detached.is_set():
                if attempt:
                    self._unknown_claims[inbox_key] = nonce
                return
            try:
                # On a retry, a refusal reads what may be our own claim.
                result = self.store.txn(
                    [exists(inbox_key), absent(claim_key), absent(keys.response(automation_id, index))],
                    [Put(claim_key, {"executor": self.host.host, "nonce": nonce}, session.lease),
                     Delete(inbox_key), Get(keys.log_entry(automation_id, index)),
                     Get(keys.status(automation_id))],
                    [Get(claim_key), Get(keys.response(automation_id, index))] if attempt else [])
            except StoreUnavailable:
                attempt += 1
                time.sleep(min(0.1 * attempt, 1.0))
                continue
            if result.succeeded:
                entry, status = (list(result.ranges) + [[], []])[:2]
                self._run_claimed(automation_id, index, claim_key, entry, status)
                return
            if not attempt:
                return      # taken or answered already
            claim, response = result.ranges
            if claim and (readable(claim[0]) or {}).get("nonce") == nonce and not response:
                # Our claim landed though its call failed: read what it would have.
                entry, status = self.store.txn([], [Get(keys.log_entry(automation_id, index)),
                                                    Get(keys.status(automation_id))]).ranges
                if self._run_claimed(automation_id, index, claim_key, entry, status):
                    self.log.info("claim_recovered", automation=automation_id, index=index)
            return

    def _run_claimed(self, automation_id: str, index: int, claim_key: str,
                     entry: list, status: list) -> bool:
        """Run a request this peer has just claimed, unless its automation has
        ended (``entry``, ``status``: the log entry and the automation's status
        as read with the claim, each a list of zero or one KV).  True if it
        was submitted."""
        state = (readable(status[0]) or {}).get("state") if status else None
        if state in keys.TERMINAL_STATES:
            # Left over from an automation that has ended: never run it.
            self.log.info("request_refused", automation=automation_id, index=index,
                          state=state)
            self._drop_claim(claim_key)
            return False
        if not entry:
            return False
        if readable(entry[0]) is None:
            self._respond_unreadable(automation_id, index, entry[0])
            self._drop_claim(claim_key)
            return False
        self.submit(automation_id, index, entry[0].value)
        return True

    def _respond_unreadable(self, automation_id: str, index: int, kv) -> None:
        """A claimed step whose log entry cannot be read: answer it ``error``
        (create-if-absent, as every response), never run it."""
        response = keys.response(automation_id, index)
        self.store.txn([absent(response)],
                       [Put(response, {"status": "error", "executor": self.host.host,
                                       "error": f"unreadable log entry {kv.key}: {problem(kv)}",
                                       "time": time.time()})])

    def _drop_claim(self, claim_key: str) -> None:
        try:
            self.store.txn([], [Delete(claim_key)])
        except StoreUnavailable:
            pass        # bound to our lease: it goes with it

    def rescan(self) -> int:
        """Claim whatever still sits in the inbox (a safety net run now and then)."""
        kvs, _ = self.store.range(keys.inbox(self.host.host))
        for kv in kvs:
            self.log.debug("inbox_rescan_claims", key=kv.key)
            self._take_inbox(kv)
        return len(kvs)

    # -- execution ------------------------------------------------------------

    def submit(self, automation_id: str, index: int, entry: dict, take=None) -> None:
        """Run an entry this peer has claimed (also used by the initiator for
        requests with no target, which it claims in the append itself).
        If ``take(index, response)`` returns True, the caller writes the
        response itself (the initiator folds it into its next transaction).
        An entry this executor runs already is not started twice."""
        with self._idle:
            if (automation_id, index) in self._in_flight:
                return
            self._in_flight.add((automation_id, index))
            self._running += 1
        self.pool.submit(self._execute, automation_id, index, entry, take)

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _execute(self, automation_id: str, index: int, entry: dict, take=None) -> None:
        name = entry["request"]
        started = time.time()
        answered = False
        hook_input = {"automation": automation_id, "index": index, "request": name,
                      "host": self.host.host, "args": entry.get("args", {})}
        try:
            try:
                self._hook(name, "pre", hook_input)
                handler = HANDLERS.get(name)
                if handler is None:
                    raise RequestError(f"host {self.host.host} has no handler for request {name!r}")
                value = self._run_handler(handler, automation_id, index, entry)
                response = {"status": "ok", "value": value}
            except RequestError as exc:
                response = {"status": "error", "error": str(exc)}
            except Exception as exc:    # a handler bug must not take the peer down
                self.log.exception("handler_crashed", request=name, index=index)
                response = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            try:
                self._hook(name, "post", {**hook_input, "response": response})
            except RequestError as exc:
                self.log.warning("post_hook_failed", request=name, error=str(exc))
            response.update(executor=self.host.host, time=time.time(),
                            duration=time.time() - started)
            failpoints.crash(f"respond {name}")     # done, but nobody will know
            if take is None or not take(index, response):
                answered = self._answer(automation_id, index, response, name)
        except Exception:
            self.log.exception("response_failed", automation=automation_id, index=index)
        finally:
            with self._idle:
                self._in_flight.discard((automation_id, index))
            if not answered:
                self._done(1)

    def _done(self, count: int) -> None:
        with self._idle:
            self._running -= count
            self._idle.notify_all()

    def _answer(self, automation_id: str, index: int, response: dict, request: str = "") -> bool:
        """Write a response, together with those of other requests finishing
        meanwhile (group commit): the first thread to arrive writes every
        response queued while its transaction is in flight, in one
        transaction per ``RESPONSE_BATCH``; the others return at once and
        their requests count as running until their response is written.
        True once this response is in the hands of the writing thread.

        When other requests are still running, the writer first gives up
        the interpreter once: requests claimed together (and quick) finish
        together, so their responses join this transaction instead of the
        next one.  Only a hint (nothing waits on it), but it turns one
        transaction per response into one per claimed batch, and the
        batches of the whole pipeline grow with it (docs/performance.md)."""
        with self._answers_lock:
            self._answers.append((automation_id, index, response, request))
            if self._answering:
                return True
            self._answering = True
            others = self._running > len(self._answers)
        if others:
            time.sleep(0)
        while True:
            with self._answers_lock:
                batch = self._answers[:RESPONSE_BATCH]
                del self._answers[:RESPONSE_BATCH]
                if not batch:
                    self._answering = False
                    return True
            try:
                self._respond_together([entry[:3] for entry in batch])
                for entry in batch:     # written: nobody will hear more of this peer
                    failpoints.crash(f"responded {entry[3]}")
            except Exception:
                self.log.exception("responses_failed", count=len(batch))
            finally:
                self._done(len(batch))

    def _respond_together(self, batch: list[tuple[str, int, dict]]) -> None:
        """Write responses create-if-absent in one transaction; if any is
        there already (the initiator wrote ``timeout`` or ``lost``) or etcd
        fails mid-call, each is written on its own (create-if-absent again,
        so one that landed stays as it is)."""
        if len(batch) > 1:
            compares = [absent(keys.response(a, i)) for a, i, _ in batch]
            ops = [Put(keys.response(a, i), response) for a, i, response in batch]
            try:
                if self.store.txn(compares, ops).succeeded:
                    return
            except StoreUnavailable:
                pass
        for automation_id, index, response in batch:
            self._respond(automation_id, index, response)

    HANDLER_STORE_RETRIES = 30

    def _run_handler(self, handler, automation_id: str, index: int, entry: dict):
        """The handler's value.  Requests are idempotent, so one that could
        not reach etcd (a member dying, a leader election) is run again
        rather than answered with an error, for a bounded while."""
        for attempt in range(self.HANDLER_STORE_RETRIES + 1):
            try:
                with steps.running(self.store, automation_id, index):
                    return handler(self.host, dict(entry.get("args") or {}))
            except StoreRefused:
                raise               # etcd answered: running it again changes nothing
            except StoreUnavailable as exc:
                if attempt == self.HANDLER_STORE_RETRIES:
                    raise
                self.log.warning("request_store_unavailable", request=entry["request"],
                                 automation=automation_id, index=index, error=str(exc))
                time.sleep(min(0.1 * (attempt + 1), 1.0))

    def _respond(self, automation_id: str, index: int, response: dict) -> int:
        """Write the response create-if-absent; its revision if it landed."""
        key = keys.response(automation_id, index)
        for attempt in range(100):      # etcd may be restarting: keep the answer
            try:
                result = self.store.txn([absent(key)], [Put(key, response)])
                if not result.succeeded:
                    self.log.info("response_superseded", automation=automation_id, index=index)
                    return 0
                return result.revision
            except StoreUnavailable:
                time.sleep(min(0.1 * (attempt + 1), 1.0))
        self.log.error("response_dropped", automation=automation_id, index=index)
        return 0

    def _hook(self, request: str, phase: str, payload: dict) -> None:
        if not self.hooks_dir:
            return
        path = os.path.join(self.hooks_dir, f"{request}.{phase}")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return
        done = subprocess.run([path], input=json.dumps(payload), capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise RequestError(done.stderr.strip() or f"{phase} hook {path} exited {done.returncode}")
