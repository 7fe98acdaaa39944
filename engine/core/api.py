"""What the command line does with automations: start, inspect, follow, abort.

Starting an automation is one transaction: its spec, its status, its summary
and a member key for each chosen peer.  From then on the members carry it;
the command that started it may die without consequence.
"""
from __future__ import annotations

import os
import random
import time
from typing import Iterator

from engine.errors import NoPeers, UnknownTask

from . import hosts, keys
from .record import AutomationRecord
from .registry import latest
from .replay import TIMER
from .store import Delete, Put, Store, StoreUnavailable, absent, modified_at
from .values import readable
from .watch import PrefixWatch

__all__ = ["start_automation", "automation_ops", "nudge", "get_task", "list_tasks", "abort",
           "follow", "running_kinds",
           "UnknownTask", "NoPeers", "TERMINAL_STATES", "live_hosts", "DEFAULT_MEMBERS"]

TERMINAL_STATES = keys.TERMINAL_STATES
DEFAULT_MEMBERS = 3


def live_hosts(store: Store) -> dict[str, dict]:
    """``{host: record}`` of the live hosts (:mod:`engine.core.hosts`)."""
    return hosts.live_hosts(store)


def new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()


def start_automation(store: Store, kind: str, args: dict, members: int = DEFAULT_MEMBERS,
                     prefer: list[str] | None = None) -> str:
    """Create an automation, once even when etcd loses the reply (a member
    dying with the write in flight); its members pick it up from etcd.  An
    id another automation took first (made in the same second with the same
    three random bytes: about one in a hundred among 500 started in one
    second) is drawn again."""
    for _ in range(_ID_DRAWS):
        automation_id, compares, ops = automation_ops(store, kind, args, members, prefer)
        if store.txn_once(compares, ops, proof=keys.spec(automation_id)):
            return automation_id
    raise RuntimeError(f"automation id {automation_id} already exists ({_ID_DRAWS} drawn)")


_ID_DRAWS = 5


def automation_ops(store: Store, kind: str, args: dict, members: int = DEFAULT_MEMBERS,
                   prefer: list[str] | None = None) -> tuple[str, list, list]:
    """``(id, compares, ops)`` that create an automation when written, for a
    caller that writes it in one transaction with something else (a lease
    and the automation that carries it)."""
    from . import features
    version, _ = latest(kind, features.cluster_level(store))
    hosts = sorted(live_hosts(store))
    if not hosts:
        raise NoPeers("no live peers in this cluster: start some with "
                      "'peerctl.py peer' or 'peerctl.py up'")
    preferred = [h for h in (prefer or []) if h in hosts]
    others = [h for h in hosts if h not in preferred]
    random.shuffle(others)
    chosen = (preferred + others)[:max(1, members)]
    automation_id = new_id()
    now = time.time()
    spec = {"id": automation_id, "kind": kind, "version": version, "args": args,
            "created": now, "members": chosen, "wanted_members": len(chosen)}
    ops = [Put(keys.spec(automation_id), spec),
           Put(keys.status(automation_id), {"state": "running", "updated": now}),
           Put(keys.task(automation_id), {"id": automation_id, "kind": kind, "state": "running",
                                           "created": now, "members": chosen, "steps": 0})]
    ops += [Put(keys.member(host, automation_id), {"since": now}) for host in chosen]
    return automation_id, [absent(keys.spec(automation_id))], ops


def nudge(store: Store, automation_id: str, why: str = "") -> None:
    """Wake the automation's sleeping timers (``ctx.sleep_until``) now, or
    its next one if none sleeps: its workers look again at what changed.
    Harmless on a finished automation."""
    store.put(keys.wake(automation_id, f"{time.time():.6f}-{os.urandom(3).hex()}"),
              {"why": why, "time": time.time()})


def _record(store: Store, automation_id: str) -> AutomationRecord:
    kvs, revision = store.range(keys.auto(automation_id))
    record = AutomationRecord.parse(automation_id, kvs, revision)
    if record.spec is None:
        unreadable = [key for key in record.unreadable if key == keys.spec(automation_id)]
        raise UnknownTask(f"no automation with id {automation_id!r}"
                          + (f" (its spec {unreadable[0]} is unreadable)" if unreadable else ""))
    return record


def task_view(record: AutomationRecord) -> dict:
    status = record.status or {}
    log = []
    for index in sorted(record.entries):
        entry = record.entries[index]
        response = record.responses.get(index)
        claim = record.claims.get(index)
        if response is not None:
            state = response.value.get("status")
            executor = response.value.get("executor")
        elif entry.get("request") == TIMER:
            state, executor = "sleeping", None
        elif claim is not None:
            state, executor = "running", (claim.value or {}).get("executor")
        else:
            state, executor = "queued", None
        item = {"index": index, "request": entry["request"], "target": entry["target"],
                "status": state, "executor": executor, "label": entry.get("label"),
                "time": entry.get("time")}
        if response is not None and response.value.get("error"):
            item["error"] = response.value["error"]
        if index in record.progress and state == "running":
            item["progress"] = record.progress[index]
        log.append(item)
    state = record.state
    return {"id": record.id, "kind": record.spec["kind"], "version": record.spec.get("version", 1),
            "state": state,
            "initiator": record.initiator if state == "running" else status.get("initiator"),
            "members": record.spec.get("members", []), "created": record.spec.get("created"),
            "args": record.spec.get("args"), "result": status.get("result"),
            "error": status.get("error"), "log": log}


def running_kinds(store: Store, kinds: tuple) -> list[str]:
    """The ids of the automations of ``kinds`` that have not ended, oldest
    first (one read of their summaries)."""
    running = []
    for kv in store.range(keys.task())[0]:
        task = readable(kv)
        if task is not None and task["kind"] in kinds \
                and task["state"] not in keys.TERMINAL_STATES:
            running.append((task.get("created") or 0, task["id"]))
    return [automation for _, automation in sorted(running)]


def get_task(store: Store, automation_id: str) -> dict:
    return task_view(_record(store, automation_id))


def list_tasks(store: Store, include_finished: bool = False) -> list[dict]:
    kvs, _ = store.range(keys.task())
    rows = []
    for kv in kvs:
        task = readable(kv)
        if task is None:
            continue
        if not include_finished and task.get("state") in TERMINAL_STATES:
            continue
        rows.append({"id": task.get("id"), "kind": task.get("kind"), "state": task.get("state"),
                     "initiator": task.get("initiator"), "created": task.get("created"),
                     "steps": task.get("steps", 0)})
    return sorted(rows, key=lambda r: (r["created"] if isinstance(r["created"], (int, float))
                                       else 0, r["id"]))


ABORT_WAIT = 15.0    # seconds abort waits for the leader; $PEERCTL_ABORT_WAIT (tests) says otherwise


def abort(store: Store, automation_id: str, wait: float | None = None,
          cleanup_wait: float = 600.0) -> dict:
    """Ask the initiator to abort; if no member is alive to hear it, abort
    directly.  An automation that cleans up on abort (its leader logged
    ``aborting``) is waited for up to ``cleanup_wait`` seconds in all.
    ``wait``: how long the leader has to act (default :data:`ABORT_WAIT`)."""
    if wait is None:
        wait = float(os.environ.get("PEERCTL_ABORT_WAIT") or ABORT_WAIT)
    record = _record(store, automation_id)
    if record.state in TERMINAL_STATES:
        return {"id": automation_id, "state": record.state}
    store.put(keys.abort(automation_id), {"requested": time.time()})
    started = time.monotonic()
    deadline = started + wait
    while time.monotonic() < deadline:
        record = _record(store, automation_id)
        if record.state in TERMINAL_STATES:
            return {"id": automation_id, "state": record.state}
        if record.aborting is not None:
            deadline = max(deadline, started + cleanup_wait)
        if not record.candidates:
            status_kv = store.get(keys.status(automation_id))
            ops = [Put(keys.status(automation_id), {"state": "aborted", "error": "aborted by request",
                                                    "result": None, "updated": time.time()}),
                   Put(keys.task(automation_id), {**(store.get(keys.task(automation_id)).value or {}),
                                                   "state": "aborted", "finished": time.time()})]
            ops += [Delete(keys.member(m, automation_id)) for m in record.spec.get("members", [])]
            if store.txn([modified_at(keys.status(automation_id), status_kv.mod_revision)],
                         ops).succeeded:
                return {"id": automation_id, "state": "aborted"}
        time.sleep(0.1)
    return {"id": automation_id, "state": _record(store, automation_id).state}


def follow(store: Store, automation_id: str, timeout: float | None = None,
           min_interval: float = 0.1, idle_read: float = 1.0,
           unreachable_after: float = 3.0) -> Iterator[dict]:
    """Yield the task view at every change, ending after a terminal state.

    The watch alone cannot tell a quiet automation from a dead etcd (it
    reconnects silently), so after ``idle_read`` seconds without an event the
    task is read again: that read refreshes the view and proves etcd is there.
    When etcd has not answered for ``unreachable_after`` seconds the last
    :class:`StoreUnavailable` is raised; the automation itself goes on."""
    record = _record(store, automation_id)
    yield task_view(record)
    if record.state in TERMINAL_STATES:
        return
    watch = PrefixWatch(store, keys.auto(automation_id), record.revision).start()
    deadline = None if timeout is None else time.monotonic() + timeout
    last_answer = time.monotonic()
    try:
        while deadline is None or time.monotonic() < deadline:
            batch = watch.get(timeout=idle_read)
            if batch is not None:
                time.sleep(min_interval)        # let a burst of steps land together
            try:
                view = get_task(store, automation_id)
            except StoreUnavailable:
                if time.monotonic() - last_answer >= unreachable_after:
                    raise
                continue
            last_answer = time.monotonic()
            yield view
            if view["state"] in TERMINAL_STATES:
                return
    finally:
        watch.stop()
