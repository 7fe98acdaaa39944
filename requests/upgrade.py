"""The requests of an upgrade (``automations/upgrade.py``).

- ``upgrade_host`` ``{release, rollback, automation, deadline}``, run by the
  host being upgraded: already running that release -> ``{state:
  "running", version, pid}``; otherwise it installs the release under its
  state directory (:func:`engine.releases.install.install`, which checks
  the sha256 read from etcd), asks its peer to hand the host over to it
  once this request has answered (``engine/releases/handover.py``) and
  answers ``{state: "replacing", from, to, release, pid, vms}``: the
  process that answered and the VMs the host has now (``release`` is what
  the host's record will say it runs: None for a tree that is no
  release).  With ``rollback`` the release is
  the one the host ran before (``current.json``'s ``previous``), refused
  once the cluster's feature level is above what that release supports.
  Idempotent: sent again after the hand-over, the new process answers
  ``running``.
- ``upgrade_wait`` ``{host, release, to, pid, vms, since, deadline}``, run by
  another host: polls the host's record until the host serves again from
  ``release`` (a process other than ``pid`` that says it serves, having
  published its VMs once, its guard found when it needs one, no VM of
  ``vms`` listed ``missing`` there: one no longer listed there left, moved
  or destroyed meanwhile) ->
  ``{version, pid, out_of_service_s}``.  A host whose record says its
  peer rolled back to the old release since ``since``, or that is not back
  within ``deadline`` seconds, is an error saying why.
"""
import os
import time

from engine.core import features, keys
from engine.core.handlers import handler
from engine.core.hosts import is_live_record
from engine.errors import RequestError

POLL = 0.1


def _vms_here(host) -> list[str]:
    kvs, _ = host.store.range(keys.vm(host.host))
    return sorted(keys.suffix(kv.key, keys.vm(host.host)) for kv in kvs
                  if isinstance(kv.value, dict) and kv.value.get("state") != "missing")


@handler("upgrade_host")
def upgrade_host(host, args: dict) -> dict:
    from engine.releases import current
    from engine.releases.version import describe
    if host.replace is None:
        raise RequestError("this host's peer cannot be replaced (no peer process)")
    rollback = bool(args.get("rollback"))
    running = current.running_code(host.state_dir)
    running_release = running["release"]
    if rollback:
        target = running["previous"]
        if not target:
            raise RequestError(f"{host.host} has no previous release to go back to")
        level = features.cluster_level(host.store)
        if (target.get("feature_level") or features.BASE) < level:
            raise RequestError(f"the cluster's feature level is {level}: {host.host}'s previous "
                               f"release {target.get('release') or target.get('version')} "
                               f"supports up to {target.get('feature_level')}")
        release = target.get("release")
        if os.path.realpath(target["path"]) == running["path"]:
            return {"state": "running", "version": running["version"], "pid": os.getpid()}
        choice = {k: v for k, v in target.items() if k != "previous"}
    else:
        release = args.get("release")
        if not isinstance(release, str) or not release:
            raise RequestError("upgrade_host needs the release to run")
        if running_release == release:
            return {"state": "running", "version": running["version"], "pid": os.getpid()}
        from engine.releases.install import install
        path = install(host.store, host.state_dir, release)
        choice = {**describe(path), "release": release}
    plan = {"choice": choice, "deadline": args.get("deadline"),
            "automation": args.get("automation")}
    if not host.replace(plan):
        raise RequestError(f"{host.host} is being handed over already")
    return {"state": "replacing", "from": running_release or running["version"],
            "to": release or choice.get("version"), "release": release, "pid": os.getpid(),
            "vms": _vms_here(host)}


def _missing(host, record: dict | None, args: dict) -> str | None:
    """What keeps the host from counting as back (None: it is)."""
    if record is None:
        return "its peer holds no host record"
    if record.get("pid") == args.get("pid"):
        return "the old process still serves"
    if record.get("release") != args.get("release"):
        return f"it runs {record.get('version')}"
    if ((record.get("handover") or {}).get("time") or 0) < float(args.get("since") or 0):
        return "its new process has not said it serves"
    if record.get("guarded") is False:
        return "its guard is not running"
    kvs, _ = host.store.range(keys.vm(args["host"]))
    listed = {keys.suffix(kv.key, keys.vm(args["host"])): kv.value for kv in kvs}
    # a VM no longer listed here left (moved, destroyed); one listed
    # missing is one the new process did not find
    gone = [uuid for uuid in args.get("vms") or []
            if isinstance(listed.get(uuid), dict) and listed[uuid].get("state") == "missing"]
    if gone:
        return f"{len(gone)} of its VMs missing ({', '.join(sorted(gone)[:3])})"
    return None


@handler("upgrade_wait")
def upgrade_wait(host, args: dict) -> dict:
    name = args.get("host")
    if not isinstance(name, str):
        raise RequestError("upgrade_wait needs the host")
    deadline = float(args.get("deadline") or 60.0)
    since = float(args.get("since") or 0.0)
    until = time.monotonic() + deadline
    why = "not looked at yet"
    while True:
        kv = host.store.get(keys.host(name))
        record = kv.value if kv is not None and is_live_record(kv) else None
        rolled = (record or {}).get("rolled_back")
        if isinstance(rolled, dict) and (rolled.get("time") or 0) >= since:
            raise RequestError(f"{name} was rolled back to {record.get('version')}: "
                               f"{rolled.get('why')}")
        why = _missing(host, record, args)
        if why is None:
            came = record.get("handover") or {}
            return {"version": record.get("version"), "pid": record.get("pid"),
                    "out_of_service_s": came.get("out_of_service_s")}
        if time.monotonic() >= until:
            raise RequestError(f"{name} did not come back on "
                               f"{args.get('to') or args.get('release')} within {deadline:g} s: "
                               f"{why}")
        time.sleep(POLL)
