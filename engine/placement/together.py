"""Claims of new consumers made by several threads of one process, written
together: one provider read and one transaction for all of them; releases
likewise (:func:`release`: one read and one transaction for all).

A peer runs its requests in a pool of threads; a bulk boot gives its
initiator hundreds of ``claim`` requests, several at a time.  Claimed one by
one, each reads what changed among the providers, then writes its own
transaction, and concurrent claims pick the same least loaded host and lose
races to each other.  Here the first thread to arrive takes every claim
waiting (up to :data:`LIMIT`), places them one after the other on the same
provider documents (each placement sees the usages of the ones before it),
and writes them in one transaction
(:meth:`~engine.placement.etcd.EtcdPlacement.claim_new_together`); the
threads that arrived meanwhile wait for their result, and the next batch is
taken by one of them.  A ``claim_vms`` step hands all its claims over at
once from its one thread (:func:`claim_many`): no thread per claim.

Promises:
- the same guarantees as a single claim: the transaction compares the mod
  revision of every provider it read and the absence of every consumer, so
  nothing is ever overcommitted and no consumer is claimed twice;
- a claim the batch could not make (no candidate left, a consumer that
  already holds something, the write refused or its outcome unknown) comes
  back as None: its caller claims it alone, the usual way, on a fresh read.
  Nothing is concluded from the batch but success.
"""
from __future__ import annotations

import fnmatch
import threading
import weakref
from dataclasses import dataclass
from typing import Callable

import structlog

__all__ = ["NewClaim", "owner_of", "query_of", "hosts_allowed", "claim_new", "claim_many",
           "release", "LIMIT"]

log = structlog.get_logger("placement")

LIMIT = 32      # claims per transaction: two keys each at most (etcd allows 128 operations)


@dataclass
class NewClaim:
    """One consumer to place: ``allowed(host)`` filters the candidates;
    ``prefer``: a host to take first when it fits (a plan's choice)."""
    consumer: str
    query: str
    required: str | None
    allowed: Callable[[str], bool]
    owner: dict
    prefer: str | None = None

    @classmethod
    def of_request(cls, args: dict, query: str, required: str | None) -> "NewClaim":
        """The ``claim`` request's ``args`` (``consumer``, ``exclude``,
        ``hosts``, ``prefer``, ``project``, ``user``, ``consumer_type``) as
        a claim: ``query`` its resources, ``required`` its traits with the
        reserved hosts' leases ruled out."""
        return cls(args.get("consumer"), query, required,
                   hosts_allowed(args.get("exclude") or (), args.get("hosts")),
                   owner_of(args), args.get("prefer"))


def hosts_allowed(excluded, pattern: str | None) -> Callable[[str], bool]:
    """Whether a claim may go to a host: one not in ``excluded`` whose
    name matches the glob ``pattern`` (None: any)."""
    excluded, pattern = set(excluded), pattern or "*"
    return lambda name: name not in excluded and fnmatch.fnmatchcase(name, pattern)


def query_of(args: dict) -> str | None:
    """A claim request's ``resources`` as a query (``{RC: n}`` joined as
    ``RC:n,...``), or None when it gives none."""
    resources = args.get("resources")
    if isinstance(resources, dict):
        resources = ",".join(f"{rc}:{n}" for rc, n in resources.items())
    return resources if isinstance(resources, str) and resources else None


def owner_of(args: dict) -> dict:
    """A claim request's owner: ``project``, ``user``, ``consumer_type``."""
    return {"project": args.get("project") or "peerctl", "user": args.get("user") or "peerctl",
            "consumer_type": args.get("consumer_type") or "INSTANCE"}


@dataclass
class _Slot:
    item: object
    result: object = None
    done: bool = False


class _Together:
    def __init__(self, store, write):
        self._store = weakref.ref(store)
        self._write_batch = write       # fn(placement, batch) -> results
        self._lock = threading.Condition()
        self._waiting: list[_Slot] = []
        self._leading = False

    def submit(self, items: list) -> list:
        """Each of ``items``' results, once batches holding them were written:
        the calling thread leads as long as any of its items waits (a
        ``claim_vms`` step hands its whole list over from one thread)."""
        slots = [_Slot(item) for item in items]
        with self._lock:
            self._waiting.extend(slots)
            while True:
                while self._leading and not all(slot.done for slot in slots):
                    self._lock.wait()
                if all(slot.done for slot in slots):
                    return [slot.result for slot in slots]
                # Lead: take what waits, first come first placed.
                self._leading = True
                batch, self._waiting = self._waiting[:LIMIT], self._waiting[LIMIT:]
                self._lock.release()
                results: list = [None] * len(batch)
                try:
                    results = self._write([slot.item for slot in batch])
                finally:
                    self._lock.acquire()
                    for slot, result in zip(batch, results):
                        slot.result, slot.done = result, True
                    self._leading = False
                    self._lock.notify_all()

    def _write(self, batch: list) -> list:
        from engine.placement.etcd import EtcdPlacement
        store = self._store()
        if store is None:
            return [None] * len(batch)
        try:
            return self._write_batch(EtcdPlacement(store), batch)
        except Exception as exc:    # each goes alone, and meets the error itself
            log.info("placement_together_refused", items=len(batch), error=str(exc))
            return [None] * len(batch)


def _claims(placement, batch: list[NewClaim]) -> list:
    return placement.claim_new_together(batch)


def _releases(placement, batch: list[str]) -> list:
    placement.release_together(batch)
    return [True] * len(batch)


_queues: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_queues_lock = threading.Lock()


def _queue(store, write) -> _Together:
    with _queues_lock:
        queues = _queues.setdefault(store, {})
        if write not in queues:
            queues[write] = _Together(store, write)
        return queues[write]


def claim_new(store, item: NewClaim) -> dict | None:
    """Claim ``item`` together with what other threads claim now; None when
    it must be claimed alone."""
    return _queue(store, _claims).submit([item])[0]


def claim_many(store, items: list[NewClaim]) -> list[dict | None]:
    """:func:`claim_new` for each of ``items``, handed over at once from
    the calling thread (no thread per claim): they go, with what other
    threads claim now, in batches of :data:`LIMIT`, first come first
    placed.  Each result as :func:`claim_new`'s."""
    return _queue(store, _claims).submit(items) if items else []


def release(store, consumer: str) -> bool:
    """Release ``consumer``'s allocations together with what other threads
    release now (one transaction); False when it must be released alone."""
    return bool(_queue(store, _releases).submit([consumer])[0])
