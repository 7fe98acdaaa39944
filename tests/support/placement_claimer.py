"""A claiming process, for the concurrency and crash tests and the bench.

    python tests/support/placement_claimer.py BACKEND SPEC MODE [GO_FILE]

BACKEND is ``etcd:<endpoints>:<cluster>`` or a Placement URL.  Creates
``GO_FILE.ready.<pid>`` once connected and waits for GO_FILE to exist (so that
every process starts together), then:

- MODE ``until-refused``: new consumer after new consumer, each takes the
  best candidate for SPEC (alternates on capacity_exceeded), until there is
  no candidate left; prints ``{"claimed": [...], "capacity_exceeded": n,
  "concurrent_update": n, "seconds": s, "started": t, "ended": t, "cpu": s}``
  (``cpu``: this process's CPU seconds while claiming);
  ``races_lost`` counts the backend's transactions lost to another claimer
  (retried inside ``claim``): the evidence that the processes really raced;
- MODE ``placed-until-refused`` (etcd only): the same, each consumer placed
  and claimed by ``claim_new_together``, the path a peer's ``claim``
  request takes (engine/placement/together.py; a batch of one here), and by
  the candidates-then-claim loop above when that returns None;
- MODE ``forever``: claims SPEC's best candidate and releases every second
  consumer, without end;
- MODE ``churn``: takes SPEC's best candidate once, then claims it for new
  consumers and releases every second one, without end, so that nearly all
  its time is spent inside claims and releases.  Before every transaction
  that writes a consumer it prints ``txn claim|release CONSUMER`` (flushed):
  the crash test SIGKILLs it right after such a line.
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from engine.placement import Conflict, open_placement  # noqa: E402


def open_backend(spec: str):
    if spec.startswith("etcd:"):
        from engine.core.store import Store
        _, rest = spec.split(":", 1)
        endpoints, cluster = rest.rsplit(":", 1)
        return open_placement("etcd", Store(endpoints, cluster))
    return open_placement(spec)


def claim_one(placement, spec: str, stats: dict) -> str | None:
    """Claim ``spec`` for a new consumer; None when nothing fits any more."""
    consumer = str(uuid.uuid4())
    while True:
        candidates = placement.candidates(spec, limit=10)
        if not candidates:
            return None
        for candidate in candidates:
            try:
                placement.claim(consumer, candidate["allocations"], project="bench",
                                user="bench", consumer_generation=None)
                return consumer
            except Conflict as exc:
                stats[exc.reason] += 1      # capacity: next alternate; race: next too


def place_one(placement, spec: str, stats: dict) -> str | None:
    """``claim_one`` through the path a peer's claim request takes."""
    from engine.placement.together import NewClaim, owner_of
    consumer = str(uuid.uuid4())
    try:
        [done] = placement.claim_new_together([NewClaim(
            consumer, spec, None, lambda host: True, owner_of({"project": "bench",
                                                              "user": "bench"}))])
    except Conflict as exc:
        stats[exc.reason] += 1
        done = None
    if done is not None:
        return consumer
    return claim_one(placement, spec, stats)


def churn(placement, spec: str) -> int:
    """Claim and release on one candidate forever, announcing each write."""
    from engine.core.store import Delete, Put
    store = placement.store
    real_txn = store.txn

    def announced_txn(compares, success=(), *args, **kwargs):
        success = list(success)
        for op in success:
            if isinstance(op, (Put, Delete)) and op.key.startswith("placement/consumer/"):
                kind = "claim" if isinstance(op, Put) else "release"
                sys.stdout.write(f"txn {kind} {op.key.rsplit('/', 1)[1]}\n")
                sys.stdout.flush()
                break
        return real_txn(compares, success, *args, **kwargs)
    store.txn = announced_txn
    allocations = placement.candidates(spec, limit=1)[0]["allocations"]
    count = 0
    while True:     # the crash test kills us
        consumer = str(uuid.uuid4())
        placement.claim(consumer, allocations, project="churn", user="churner",
                        consumer_generation=None)
        count += 1
        if count % 2:
            placement.release(consumer)


def main(argv) -> int:
    backend, spec, mode = argv[1], argv[2], argv[3]
    go = argv[4] if len(argv) > 4 else None
    placement = open_backend(backend)
    if go:      # tell the starter we are up, then wait for everyone's start
        with open(f"{go}.ready.{os.getpid()}", "w"):
            pass
    deadline = time.monotonic() + 60
    while go and not os.path.exists(go):
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.005)
    stats = {"claimed": [], "capacity_exceeded": 0, "concurrent_update": 0}
    if mode == "churn":
        return churn(placement, spec)
    start, stats["started"], cpu = time.monotonic(), time.time(), time.process_time()
    if mode in ("until-refused", "placed-until-refused"):
        one = place_one if mode == "placed-until-refused" else claim_one
        while (consumer := one(placement, spec, stats)) is not None:
            stats["claimed"].append(consumer)
        stats["seconds"], stats["ended"] = time.monotonic() - start, time.time()
        stats["cpu"] = time.process_time() - cpu
        stats["races_lost"] = placement.races_lost
        print(json.dumps(stats), flush=True)
        return 0
    count = 0
    while True:     # forever: the crash test kills us
        consumer = claim_one(placement, spec, stats)
        count += 1
        if consumer and count % 2:
            placement.release(consumer)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
