"""A peer's duties: the automations it is a member of, and cluster singletons.

For every key under ``member/<host>/`` the peer campaigns in that
automation's election and, when it leads, runs the :class:`Initiator`.  When
the key goes (the automation finished) the candidacy is withdrawn.  A
singleton duty (the janitor, the reconciler) is the same recipe over a
cluster-wide election.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import structlog

from engine.errors import Deposed

from . import keys
from .election import Candidacy
from .initiator import Initiator, Outcome
from .session import Session
from .store import Delete, Store, StoreUnavailable
from .values import readable
from .watch import PrefixWatch, Reset

__all__ = ["Duties", "Singleton"]

log = structlog.get_logger("peerctl.duties")

STEP_ASIDE_PAUSE = 2.0     # seconds before campaigning again for a kind we lack
SINGLETON_PAUSE = 1.0      # seconds before a singleton whose duty ended campaigns again


class Duties:
    def __init__(self, store: Store, session: Session, host: str, run_local):
        self.store = store
        self.session = session
        self.host = host
        self.run_local = run_local
        self._stops: dict[str, threading.Event] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> "Duties":
        prefix = keys.member(self.host)
        kvs, revision = self.store.range(prefix)
        for kv in kvs:
            if readable(kv) is not None:
                self._join(kv.key.rsplit("/", 1)[1])
        self._watch = PrefixWatch(self.store, prefix, revision).start()
        threading.Thread(target=self._follow, daemon=True, name="duties").start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()
        with self._lock:
            for event in self._stops.values():
                event.set()
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(5)

    def _follow(self):
        while not self._stopped.is_set():
            batch = self._watch.get(timeout=0.5)
            if batch is None:
                continue
            if isinstance(batch, Reset):
                present = {kv.key.rsplit("/", 1)[1] for kv in batch.kvs
                           if readable(kv) is not None}
                for automation_id in present:
                    self._join(automation_id)
                for automation_id in set(self._stops) - present:
                    self._leave(automation_id)
                continue
            for event in batch:
                automation_id = event.kv.key.rsplit("/", 1)[1]
                if event.kind == "put":
                    if readable(event.kv) is not None:
                        self._join(automation_id)
                else:
                    self._leave(automation_id)

    def _join(self, automation_id: str):
        with self._lock:
            if automation_id in self._threads and self._threads[automation_id].is_alive():
                return
            stop = self._stops[automation_id] = threading.Event()
            thread = threading.Thread(target=self._serve, args=(automation_id, stop),
                                      daemon=True, name=f"auto:{automation_id}")
            self._threads[automation_id] = thread
        thread.start()

    def _leave(self, automation_id: str):
        with self._lock:
            stop = self._stops.get(automation_id)
        if stop:
            stop.set()

    def _serve(self, automation_id: str, stop: threading.Event):
        """Campaign; lead when elected; repeat until the automation ends.

        Whatever happens, the candidacy is resigned on the way out, so that a
        live lease never keeps an election key nobody serves.  An unexpected
        exception (an engine bug) is logged, the candidacy resigned, and the
        peer campaigns again after a pause, at the back of the line."""
        candidacy = None
        try:
            while not stop.is_set() and not self._stopped.is_set() and self.session.alive:
                try:
                    if candidacy is None:
                        candidacy = Candidacy(self.store, self.session,
                                              keys.elect(automation_id), self.host)
                    if not candidacy.wait_until_leader(stop):
                        break
                    outcome = Initiator(self.store, self.session, self.host, automation_id,
                                        candidacy, self.run_local, stop).run()
                    if outcome in (Outcome.FINISHED, Outcome.DEPOSED):
                        break
                    if outcome == Outcome.STEP_ASIDE:
                        # Go to the back of the line: a member with newer code
                        # leads; with none, the automation waits (running) for one.
                        self._resign(candidacy)
                        candidacy = None
                        stop.wait(STEP_ASIDE_PAUSE)
                except StoreUnavailable as exc:
                    log.warning("duty_unavailable", automation=automation_id, error=str(exc))
                    stop.wait(0.3)
                except Exception:
                    log.exception("duty_crashed", automation=automation_id, host=self.host)
                    self._resign(candidacy)
                    candidacy = None
                    stop.wait(STEP_ASIDE_PAUSE)
        finally:
            self._resign(candidacy)
            with self._lock:
                if self._threads.get(automation_id) is threading.current_thread():
                    self._threads.pop(automation_id, None)
                    self._stops.pop(automation_id, None)

    @staticmethod
    def _resign(candidacy) -> None:
        if candidacy is None:
            return
        try:
            candidacy.resign()
        except Exception as exc:    # the lease will take the key with it
            log.warning("resign_failed", key=candidacy.key, error=str(exc))


class Singleton:
    """Run ``duty(stop, candidacy)`` on exactly one live peer of the cluster
    at a time, for as long as this peer's session lives.

    A duty that ends while the peer still runs (deposed, or an engine bug:
    logged ``singleton_crashed``) resigns and campaigns again at the back of
    the line after a pause: a singleton's thread never dies quietly and
    leaves the cluster without its janitor, reconciler or recoverer."""

    def __init__(self, store: Store, session: Session, host: str, name: str,
                 duty: Callable[[threading.Event], None]):
        self.store, self.session, self.host = store, session, host
        self.name, self.duty = name, duty
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"singleton:{name}")

    def start(self) -> "Singleton":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        while not self._stop.is_set() and self.session.alive:
            candidacy = None
            try:
                candidacy = Candidacy(self.store, self.session, keys.singleton(self.name), self.host)
                if candidacy.wait_until_leader(self._stop):
                    log.info("singleton_leads", duty=self.name, host=self.host)
                    self.duty(self._stop, candidacy)
            except StoreUnavailable:        # keep this place in line
                self._stop.wait(0.5)
                continue
            except Exception:
                log.exception("singleton_crashed", duty=self.name, host=self.host)
            if self._stop.is_set():
                return
            Duties._resign(candidacy)
            self._stop.wait(SINGLETON_PAUSE)


def janitor(store: Store, retention: float, interval: float | None = None):
    """Drops finished automations older than ``retention`` seconds."""
    if interval is None:
        interval = max(0.5, min(10.0, retention / 4))
    def duty(stop: threading.Event, candidacy: Candidacy):
        while not stop.wait(interval):
            try:
                tasks, _ = store.range(keys.task())
                now = time.time()
                for kv in tasks:
                    task = readable(kv)
                    finished = (task or {}).get("finished", now)
                    # (the id must be the key's own: a wrong one would drop another's log)
                    if task and task["id"] == keys.suffix(kv.key, keys.task()) and \
                            task["state"] in keys.TERMINAL_STATES and \
                            isinstance(finished, (int, float)) and now - finished > retention:
                        candidacy.txn([], [Delete(keys.auto(task["id"]), prefix=True),
                                           Delete(kv.key)])
                        log.info("automation_compacted", automation=task["id"])
            except StoreUnavailable:
                continue
            except Deposed:
                return          # the new janitor carries on
    return duty
