"""``upgrade``: hosts handed over to another release of peerctl, a few at a
time (``parallel``, 1 by default), each checked back before the next.

For each host:

1. ``upgrade_host`` on the host: it installs the release (or, for a
   rollback, takes the one it ran before) and hands itself over to it on
   the same lease (``requests/upgrade.py``, ``engine/releases/handover.py``);
2. ``upgrade_wait`` on another live host (``watchers``: the live hosts
   when the upgrade was planned, those outside the batch): until the host serves again from the
   release (new process, guard, its VMs listed), or its record says the old
   process took it back (a rollback), or the deadline passed.

A host that fails stops the upgrade: hosts not started yet are ``skipped``
and the automation fails saying which host and why.  A host already on the
release is ``done`` at once.  Every step is idempotent, so a new initiator
resumes from the log.

The result: ``{release, rollback, hosts: [{host, from, to, state,
out_of_service_s, error}]}``, ``state`` one of ``upgraded``, ``current``
(it ran that release already), ``failed``, ``skipped``.
"""
from engine.core.registry import automation
from engine.core.replay import Request
from engine.errors import Failed

from automations._steps import resend

SETTLE = 10.0       # seconds on top of the hand-over's own deadline for the wait


def _row(host, state, came_from=None, to=None, out=None, error=None):
    return {"host": host, "from": came_from, "to": to, "state": state,
            "out_of_service_s": out, "error": error}


def _watchers(host, watchers, batch):
    """The hosts to run the wait on, each in turn while the one before is
    gone: those outside the batch (never the host being replaced: its
    hand-over waits for its running requests), starting at a place that
    depends on the host so that waits spread out; the initiator itself when
    there is none."""
    others = [h for h in watchers if h not in batch]
    if not others:
        return [None]
    start = sum(map(ord, host)) % len(others)
    return others[start:] + others[:start]


def upgrade_one(ctx, host, release, rollback, deadline, watchers, batch):
    asked = yield from resend(Request("upgrade_host", {
        "release": release, "rollback": rollback, "automation": ctx.automation_id,
        "deadline": deadline}, target=host, deadline=deadline + 600.0, label=host))
    if not asked.ok:
        return _row(host, "failed", to=release,
                    error=asked.error or f"no answer ({asked.status})")
    answer = asked.value
    if answer["state"] == "running":
        return _row(host, "current", answer["version"], answer["version"], 0.0)
    wait = {"host": host, "release": answer["release"], "to": answer["to"],
            "pid": answer["pid"], "vms": answer["vms"], "since": asked.time - 1.0,
            "deadline": deadline + SETTLE}
    for watcher in _watchers(host, watchers, batch):
        waited = yield Request("upgrade_wait", wait, target=watcher,
                               deadline=deadline + SETTLE + 30.0, label=host)
        if waited.status != "lost":         # lost: that host is gone; ask the next
            break
    if not waited.ok:
        return _row(host, "failed", answer["from"], answer["to"],
                    error=waited.error or f"no answer ({waited.status})")
    return _row(host, "upgraded", answer["from"], waited.value["version"],
                waited.value["out_of_service_s"])


@automation("upgrade", version=1)
def upgrade(ctx, hosts, release=None, rollback=False, parallel=1, deadline=60.0,
            watchers=None):
    rows, failed = [], None
    for start in range(0, len(hosts), parallel):
        batch = hosts[start:start + parallel]
        if failed:
            rows += [_row(h, "skipped", to=release, error=f"not upgraded: {failed} failed")
                     for h in batch]
            continue
        done = yield ctx.all([ctx.worker(upgrade_one, h, release, rollback, deadline,
                                         watchers or hosts, batch, label=h) for h in batch])
        rows += done
        broken = [r["host"] for r in done if r["state"] == "failed"]
        failed = failed or (", ".join(broken) if broken else None)
    result = {"release": release, "rollback": rollback, "hosts": rows}
    if failed:
        reasons = "; ".join(f"{r['host']}: {r['error']}" for r in rows if r["state"] == "failed")
        raise Failed(f"upgrade stopped: {reasons}", result)
    return result
