"""The copy of a moving VM, run on its source host: libvirt's peer-to-peer
migration with non-shared storage (QEMU/KVM only).

:func:`migrate` is the handler ``requests/moves.py`` registers as
``move_migrate``; ``automations/moves.py`` sends it after ``move_prepare``
made the destination's volumes and XML.  One call moves one VM:

- ``live`` (the VM runs, or is paused): the disks are mirrored over NBD,
  then memory is copied while the guest runs; it carries on on the
  destination, persistently defined there and undefined here.
- cold (``live`` false, the VM shut off): the domain is started *paused*
  here, so that no guest code runs, moved the same way (same disk copy),
  then destroyed on the destination: it is left shut off and persistently
  defined there, and undefined here.

Promises:
- idempotent by VM uuid: before copying anything it looks at both
  hypervisors.  The VM gone from here and held by the destination (running
  for a live move, defined for a cold one) is a move already done: success,
  nothing started.  A migration job still running here (an earlier run
  whose caller died) is waited for, not doubled.  A copy already running on
  the destination while this host still has the VM is refused: a second
  copy is never started;
- ``max_downtime_ms`` (for a live move; QEMU's own 300 ms when not given)
  is the ceiling of the pause QEMU may plan for the switch-over (its
  ``downtime-limit``), never a floor: the plan starts at
  :data:`FIRST_DOWNTIME_MS` (or the ceiling, if lower), set on the source
  before the job starts, and doubles with each memory pass after
  :data:`PASSES_AT_FIRST` that did not let QEMU switch over, up to the
  ceiling (as Proxmox raises its own).  QEMU switches over once what is left
  fits the limit at the rate it measured; with the ceiling from the start,
  an idle guest's pause carried the tail of the first pass (4 to 11 MB of a
  256 MiB guest), and that copy stretches on a loaded machine;
- the result's ``downtime_ms`` is libvirt's own figure, read from the
  completed job statistics the destination keeps: from the moment the
  source's CPUs stopped to the moment the destination's resumed;
- progress: ``engine.core.steps.progress`` every half second while the job
  runs (``phase`` disk, memory or switch-over, ``percent``, remaining and
  transferred bytes);
- abort: the libvirt job is aborted when ``abort`` is asked for the step's
  automation, when the destination's peer has been gone from etcd
  (``hosts/<destination>``) for :data:`PEER_GONE_AFTER` seconds, or past
  ``timeout_per_gib`` seconds per GiB of RAM and disk to copy (with
  ``postcopy``, post-copy is started instead, once; after that nothing can
  abort it, as QEMU then holds the only current copy of some memory on each
  side).  The request then fails with one line saying why;
- an abort that comes too late (the job ended first) finds the move done,
  and reports it done;
- on failure or abort the VM stays here as it was (a live one runs: libvirt
  resumes it, and so does this module if it finds it paused by the
  migration; a cold one is destroyed back to shut off) and the destination
  holds no running copy (libvirt removes the incoming domain); its
  prepared volumes are left for the caller's revert;
- every libvirt failure is a :class:`~engine.errors.RequestError` of one
  line (libvirt's message), never a traceback;
- the VM's checkpoints go along: their bitmaps with the disks, their
  definitions in the destination's XML (:mod:`~engine.hypervisor.moves.checkpoints`).

Transport: libvirt's own (peer to peer: this host's libvirtd opens the
destination's URI, ``qemu+tls://`` between machines), and QEMU's memory and
disk streams over TCP (ports 49152 and up) to the destination's migration
address: ``migration_uri`` (``tcp://ADDR``) when the request names one, else
``tcp://`` the ``migration_address`` the destination publishes in its host
record (its ``migration_network`` address, docs/deploy.md) when it publishes
one, else the address the destination's libvirtd names (qemu.conf's
``migration_host``), as before.  The URI is libvirt's
``VIR_MIGRATE_PARAM_URI``; the disks' NBD stream follows its host (libvirt's
default when ``VIR_MIGRATE_PARAM_DISKS_URI`` is not set).  When the destination's
URI is ``qemu+tls://``, those streams go over TLS too (``VIR_MIGRATE_TLS``:
both hosts need QEMU's certificates, ``migrate_tls_x509_cert_dir``, which
``tls certs --libvirt`` writes in ``qemu/``), so that nothing of a guest
crosses the network in clear.  The rack in a box
(:mod:`engine.hypervisor.local.rack`) moves guests this way between network
namespaces, as between machines.
"""
from __future__ import annotations

import math
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.core import keys, steps
from engine.core.hosts import is_live_record
from engine.core.store import StoreUnavailable
from engine.errors import RequestError
from engine.hypervisor.domain.domain_xml import read_metadata
from engine.hypervisor.domain.records import vm_state
from engine.hypervisor.domain.lookup import find_domain, uuid_arg, vm_label, vm_lock
from engine.hypervisor.moves import checkpoints

__all__ = ["migrate", "planned", "published_migration_uri", "downtime_limit",
           "DEFAULT_TIMEOUT_PER_GIB", "PEER_GONE_AFTER",
           "FIRST_DOWNTIME_MS", "PASSES_AT_FIRST", "QEMU_DOWNTIME_MS"]

log = structlog.get_logger("peerctl.migration")

DEFAULT_TIMEOUT_PER_GIB = 120.0     # Nova's 800 is for real disks over real networks
PEER_GONE_AFTER = 5.0               # seconds without hosts/<destination> before aborting
POLL = 0.5
GiB = 1 << 30
MiB = 1 << 20
# The switch-over's pause is planned low first and raised only for a guest
# whose passes do not converge (see downtime_limit).
FIRST_DOWNTIME_MS = 20
PASSES_AT_FIRST = 3         # QEMU's dirty-bitmap syncs: setup, after the first pass, one more
QEMU_DOWNTIME_MS = 300      # QEMU's default downtime-limit: the ceiling when none is given


def downtime_limit(ceiling_ms: int, passes: int) -> int:
    """The maximum downtime to plan once QEMU has made ``passes`` syncs of
    its dirty bitmap (libvirt's ``memory_iteration``): :data:`FIRST_DOWNTIME_MS`
    while an idle guest would have switched over, then doubled with each
    further pass, never above ``ceiling_ms``."""
    extra = max(0, passes - PASSES_AT_FIRST)
    return min(ceiling_ms, FIRST_DOWNTIME_MS << min(extra, 16))


# -- arguments ---------------------------------------------------------------

def _text(args: dict, key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(f"move_migrate needs {key} (a non-empty string), got {value!r}")
    return value


def _flag(args: dict, key: str, default: bool) -> bool:
    value = args.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, got {value!r}")
    return value


def _optional_positive(args: dict, key: str, kind=int):
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (kind is int and not isinstance(value, int)) \
            or not math.isfinite(value) or value <= 0:
        raise RequestError(f"{key} must be a {'whole ' if kind is int else ''}number > 0, "
                           f"got {value!r}")
    return kind(value)


class _Move:
    """What one request asks, validated."""

    def __init__(self, host, args: dict):
        self.uuid = uuid_arg(args)
        self.label = vm_label(args, self.uuid)
        self.destination = _text(args, "destination")
        self.destination_uri = _text(args, "destination_uri")
        if self.destination == host.host or host.is_me(self.destination_uri):
            raise RequestError(f"cannot move {self.label} to its own host {host.host}")
        self.xml = _text(args, "xml")
        try:
            ET.fromstring(self.xml)
        except ET.ParseError as exc:
            raise RequestError(f"xml is not a domain definition: {exc}") from None
        disks = args.get("disks") or []
        if not isinstance(disks, list) or not all(isinstance(d, str) and d for d in disks):
            raise RequestError(f"disks must be a list of target devices like ['vda'], "
                               f"got {disks!r}")
        self.disks = disks
        self.incremental = _flag(args, "incremental", False)
        self.live = _flag(args, "live", True)
        self.postcopy = _flag(args, "postcopy", False) and self.live
        self.timeout_per_gib = _optional_positive(args, "timeout_per_gib", float) \
            or DEFAULT_TIMEOUT_PER_GIB
        self.max_downtime_ms = _optional_positive(args, "max_downtime_ms")
        self.downtime_ceiling_ms = self.max_downtime_ms or QEMU_DOWNTIME_MS
        self.bandwidth_mib = _optional_positive(args, "bandwidth_mib")
        self.migration_uri = _migration_uri(args)
        self.mode = "live" if self.live else "cold"

    def flags(self) -> int:
        flags = (libvirt.VIR_MIGRATE_PEER2PEER | libvirt.VIR_MIGRATE_PERSIST_DEST
                 | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE)
        if self.disks:
            flags |= (libvirt.VIR_MIGRATE_NON_SHARED_INC if self.incremental
                      else libvirt.VIR_MIGRATE_NON_SHARED_DISK)
        if self.live:
            flags |= libvirt.VIR_MIGRATE_LIVE
            if self.postcopy:
                flags |= libvirt.VIR_MIGRATE_POSTCOPY
        else:
            flags |= libvirt.VIR_MIGRATE_PAUSED       # stays paused there: destroyed next
        if _transport(self.destination_uri) == "tls":
            flags |= libvirt.VIR_MIGRATE_TLS      # memory and disks as libvirt's own channel
        return flags

    def params(self) -> dict:
        params = {libvirt.VIR_MIGRATE_PARAM_DEST_XML: self.xml,
                  libvirt.VIR_MIGRATE_PARAM_PERSIST_XML: self.xml}
        if self.disks:
            params[libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS] = self.disks
        if self.bandwidth_mib:
            params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = self.bandwidth_mib
        if self.migration_uri:
            params[libvirt.VIR_MIGRATE_PARAM_URI] = self.migration_uri
        return params


def _migration_uri(args: dict) -> str | None:
    """``migration_uri``: ``tcp://HOST[:PORT]``, where QEMU's streams go;
    None when the request names none."""
    value = args.get("migration_uri")
    if value is None:
        return None
    parsed = urllib.parse.urlsplit(value) if isinstance(value, str) else None
    try:
        ok = parsed is not None and parsed.scheme == "tcp" and bool(parsed.hostname) \
            and parsed.path in ("", "/") and (parsed.port is None or parsed.port > 0)
    except ValueError:          # a port that is none
        ok = False
    if not ok:
        raise RequestError(f"migration_uri must be tcp://ADDRESS[:PORT], got {value!r}")
    return value


def planned(host, args: dict) -> _Move:
    """The move a request asks, checked, its migration URI the request's
    ``migration_uri``, else the one the destination publishes
    (:func:`published_migration_uri`)."""
    move = _Move(host, args)
    move.migration_uri = move.migration_uri or published_migration_uri(host.store,
                                                                       move.destination)
    return move


def published_migration_uri(store, destination: str) -> str | None:
    """``tcp://`` the ``migration_address`` host ``destination`` publishes
    in its record (``[ADDR]`` for IPv6), or None when it publishes none or
    etcd cannot tell (libvirt then uses the destination's own choice)."""
    try:
        kv = store.get(keys.host(destination)) if store is not None else None
    except StoreUnavailable:
        return None
    address = kv.value.get("migration_address") if kv is not None \
        and isinstance(kv.value, dict) else None
    if not isinstance(address, str) or not address:
        return None
    return f"tcp://[{address}]" if ":" in address else f"tcp://{address}"


# -- the handler -------------------------------------------------------------

def migrate(host, args: dict) -> dict:
    """Move VM ``args['uuid']`` from ``host`` to ``args['destination']``.

    Args: ``uuid``, ``name``, ``destination``, ``destination_uri``, ``xml``
    (the destination's domain XML), ``disks`` (target devs to copy),
    ``incremental``, ``live``, and optionally ``timeout_per_gib``,
    ``postcopy``, ``max_downtime_ms``, ``bandwidth_mib`` (MiB/s),
    ``migration_uri`` (``tcp://ADDR``: else the destination's published
    ``migration_address``, see the module's Transport).
    Returns ``{mode, downtime_ms, bytes, seconds, disk_bytes, memory_bytes}``
    and ``already: true`` when an earlier run had done the move."""
    move = planned(host, args)
    with vm_lock(host, move.uuid):
        try:
            dest = libvirt.open(move.destination_uri)
        except libvirt.libvirtError as exc:
            raise RequestError(f"cannot reach the hypervisor of {move.destination} "
                               f"({move.destination_uri}): {_line(exc)}") from None
        try:
            return _move(host, dest, move)
        except libvirt.libvirtError as exc:
            raise RequestError(f"cannot move {move.label} to {move.destination}: "
                               f"{_line(exc)}") from None
        finally:
            try:
                dest.close()
            except libvirt.libvirtError:
                pass


def _move(host, dest, move: _Move) -> dict:
    for _ in range(3):
        try:
            result = _look_and_move(host, dest, move)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
            # The domain left this host while we looked (a migration an
            # earlier run started just ended): look again.
            continue
        if result is not None:
            return result
    raise RequestError(f"{move.label}: a migration job keeps running on {host.host}")


def _look_and_move(host, dest, move: _Move) -> dict | None:
    """One look at both hypervisors, then the move or its outcome; None:
    an earlier run's job was watched to its end, look again."""
    dom = find_domain(host, move.uuid)
    if dom is None:
        return _moved_already(dest, move)
    if _job_running(dom):
        # An earlier run's job (its caller died; libvirtd carries a
        # peer-to-peer migration on by itself): watch it end, then look again.
        log.info("migration_job_found", uuid=move.uuid, destination=move.destination)
        why, _last = _watch(host, dom, move, None, _timeout(dom, move)[0])
        if why is not None:
            _restore(host, move, "running")
            raise RequestError(f"moving {move.label} to {move.destination}: {why}")
        _settle(host, move.uuid)
        return None
    there = _domain(dest, move.uuid)
    if there is not None and there.isActive():
        _restore(host, move, vm_state(dom))
        raise RequestError(f"{move.label} already runs on {move.destination} while "
                           f"{host.host} still has it ({vm_state(dom)}): not starting a "
                           "second copy")
    return _copy(host, dest, dom, move)


def _settle(host, uuid: str, wait: float = 10.0) -> None:
    """After a job ended: a domain that migrated away is shut off for a
    moment before libvirt removes it; wait until it is gone or active."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        dom = find_domain(host, uuid)
        try:
            if dom is None or dom.isActive():
                return
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
            return
        time.sleep(0.2)


def _moved_already(dest, move: _Move) -> dict:
    """The VM is gone from the source: done if the destination holds it."""
    there = _domain(dest, move.uuid)
    if there is None or read_metadata(there).get("host") not in (move.destination, None, ""):
        raise RequestError(f"{move.label} is neither on this host nor on "
                           f"{move.destination}")
    state = vm_state(there)
    if move.live and state not in ("running", "paused"):
        raise RequestError(f"{move.label} is gone from this host and {state} on "
                           f"{move.destination}")
    result = _result(move, _completed_on(there) or {}, None, None)
    if not move.live:
        _stop_there(there, move)
    log.info("migration_found_done", uuid=move.uuid, destination=move.destination)
    return {**result, "already": True}


def _copy(host, dest, dom, move: _Move) -> dict:
    state = vm_state(dom)
    if move.live and state not in ("running", "paused"):
        raise RequestError(f"{move.label} is {state}: a live move needs it running "
                           "(move it with live: false)")
    if not move.live:
        if state == "running":
            raise RequestError(f"{move.label} runs: a cold move needs it shut off")
        if state != "paused":       # paused: started so by an earlier run of this move
            dom.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)
    try:
        timeout, disk_to_copy = _timeout(dom, move)
        move.xml = checkpoints.carried_in(move.xml, checkpoints.described(dom, move.disks))
        if move.live:
            # Before the job, not once it runs: QEMU decides when to switch
            # over from its first iteration on, and a small guest's first
            # may be its last.
            dom.migrateSetMaxDowntime(downtime_limit(move.downtime_ceiling_ms, 0), 0)
    except BaseException:
        _restore(host, move, state)
        raise
    outcome: dict = {}

    def run():
        try:
            dom.migrateToURI3(move.destination_uri, move.params(), move.flags())
            outcome["ok"] = True
        except libvirt.libvirtError as exc:
            outcome["error"] = _line(exc)
        except BaseException as exc:                        # never lost in the thread
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    started = time.monotonic()
    log.info("migration_started", uuid=move.uuid, destination=move.destination,
             migration_uri=move.migration_uri, mode=move.mode, disks=move.disks,
             incremental=move.incremental)
    thread = threading.Thread(target=run, name=f"migrate-{move.uuid}", daemon=True)
    thread.start()
    try:
        why, last = _watch(host, dom, move, thread, timeout)
    finally:
        thread.join()
    seconds = time.monotonic() - started

    if "ok" not in outcome and not (find_domain(host, move.uuid) is None
                                    and _holds(dest, move)):
        _restore(host, move, state)
        error = outcome.get("error", "unknown")
        log.info("migration_failed", uuid=move.uuid, destination=move.destination,
                 why=why, error=error)
        raise RequestError(f"moving {move.label} to {move.destination}: {why}"
                           if why else
                           f"moving {move.label} to {move.destination} failed: {error}")
    there = _domain(dest, move.uuid)
    completed = (_completed_on(there) if there is not None else None) or {}
    if not completed.get("memory_processed") and last.get("memory_processed"):
        completed = {**completed, "memory_processed": last["memory_processed"]}
    result = _result(move, completed, (last.get("disk_total") or disk_to_copy) if move.disks
                     else 0, seconds)
    if not move.live and there is not None:
        _stop_there(there, move)
    steps.progress({**_progress(last, bool(move.disks), True), "percent": 100})
    log.info("migration_done", uuid=move.uuid, destination=move.destination, **result)
    return result


# -- watching the job --------------------------------------------------------

def _watch(host, dom, move: _Move, thread, timeout: float) -> tuple[str | None, dict]:
    """Poll the job until it ends (``thread`` ends, or, watching an earlier
    run's job, libvirt reports none): publish progress, abort when asked or
    due.  Returns why it was aborted (None if it was not) and the last job
    statistics, their ``disk_total`` the largest seen.

    libvirt's statistics come from a thread of their own (:class:`_Stats`):
    a busy daemon may keep a query waiting for the domain's job lock for a
    long while, and the reasons to abort (asked, peer gone, deadline) are
    checked on time all the same."""
    why, postcopy_started = None, False
    gone_since, began = None, time.monotonic()
    planned = downtime_limit(move.downtime_ceiling_ms, 0) if thread is not None and move.live \
        else None       # an earlier run's job keeps the plan that run made
    deadline = began + timeout
    poller = _Stats(dom, move)
    try:
        while True:
            # Faster at first: a small disk's copy may be over in a second.
            poll = POLL if time.monotonic() - began > 1.0 else POLL / 5
            if thread is not None:
                thread.join(poll)
                if not thread.is_alive():
                    return why, poller.last
            elif poller.ended.wait(poll):
                return why, poller.last
            stats = poller.fresh()
            if stats is not None:
                steps.progress(_progress(stats, bool(move.disks),
                                         move.live and _paused_for_migration(dom)))
                if planned is not None and not postcopy_started:
                    planned = _replan(dom, move, stats, planned)
            if why is not None or postcopy_started:
                continue
            if steps.abort_requested():
                why = "aborted by request"
            elif host.store is not None:
                if _peer_alive(host.store, move.destination) is False:
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > PEER_GONE_AFTER:
                        why = f"destination peer {move.destination} is gone"
                else:
                    gone_since = None
            if why is None and time.monotonic() > deadline:
                if move.postcopy and _phase(poller.last, bool(move.disks)) == "memory" \
                        and _try(dom.migrateStartPostCopy, 0):
                    postcopy_started = True
                    log.info("migration_postcopy_started", uuid=move.uuid)
                    continue
                why = (f"did not complete within {timeout:.3g} s "
                       f"({move.timeout_per_gib:g} s per GiB of RAM and disk)")
            if why is not None:
                log.info("migration_aborting", uuid=move.uuid, why=why)
                _try(dom.abortJob)
    finally:
        poller.stop.set()


def _replan(dom, move: _Move, stats: dict, planned: int) -> int:
    """Raise the planned downtime when QEMU's passes have not converged
    (:func:`downtime_limit`); the limit in force."""
    limit = downtime_limit(move.downtime_ceiling_ms, stats.get("memory_iteration", 0))
    if limit <= planned or not _try(dom.migrateSetMaxDowntime, limit, 0):
        return planned
    log.info("migration_downtime_raised", uuid=move.uuid, ms=limit,
             passes=stats.get("memory_iteration"))
    return limit


class _Stats:
    """The job's statistics, polled in a thread: ``fresh()`` gives the ones
    not yet seen (or None), ``last`` the latest (``disk_total`` the largest
    seen: the disk figures drop to 0 once libvirt ends the mirror jobs,
    before the job itself ends), ``ended`` is set once libvirt says no job
    runs."""

    SLOW = 5.0          # a query that took longer is logged

    def __init__(self, dom, move: _Move):
        self.dom, self.move = dom, move
        self.last: dict = {}
        self.ended, self.stop = threading.Event(), threading.Event()
        self._new = None
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name=f"jobstats-{move.uuid}", daemon=True).start()

    def fresh(self) -> dict | None:
        with self._lock:
            stats, self._new = self._new, None
            return stats

    def _run(self) -> None:
        began = time.monotonic()
        while not self.stop.is_set():
            asked = time.monotonic()
            stats = _stats(self.dom, self.move)
            took = time.monotonic() - asked
            if took > self.SLOW:
                log.info("migration_stats_slow", uuid=self.move.uuid, seconds=round(took, 1))
            if stats is None:
                self.ended.set()
            else:
                stats["disk_total"] = max(stats.get("disk_total", 0),
                                          self.last.get("disk_total", 0))
                with self._lock:
                    self.last = self._new = stats
            self.stop.wait(POLL / 5 if time.monotonic() - began < 1.0 else POLL)


def _stats(dom, move: _Move | None = None) -> dict | None:
    """The running job's statistics, or None when no job runs or libvirt
    cannot say (logged: it may hold the domain's job lock for a while)."""
    try:
        stats = dom.jobStats(0)
    except libvirt.libvirtError as exc:
        if move is not None:
            log.info("migration_stats_unavailable", uuid=move.uuid, error=_line(exc))
        return None
    if stats.get("type", libvirt.VIR_DOMAIN_JOB_NONE) == libvirt.VIR_DOMAIN_JOB_NONE:
        return None
    return stats


def _job_running(dom) -> bool:
    return _stats(dom) is not None


def _phase(stats: dict, disks: bool) -> str:
    """disk until the memory copy starts (the NBD mirror comes first), then memory."""
    if stats.get("disk_remaining") or (disks and not stats.get("memory_processed")):
        return "disk"
    return "memory"


def _progress(stats: dict, disks: bool, switching: bool) -> dict:
    disk_total = stats.get("disk_total", 0)
    memory_total = stats.get("memory_total", 0)
    done = (disk_total - stats.get("disk_remaining", 0)
            + memory_total - stats.get("memory_remaining", memory_total))
    total = disk_total + memory_total
    percent = int(100 * done / total) if total else 0
    return {"phase": "switch-over" if switching else _phase(stats, disks),
            "percent": max(0, min(99, percent)),
            "disk_remaining": stats.get("disk_remaining", 0),
            "memory_remaining": stats.get("memory_remaining", 0),
            "bytes": stats.get("data_processed",
                               stats.get("disk_processed", 0)
                               + stats.get("memory_processed", 0))}


def _paused_for_migration(dom) -> bool:
    try:
        state, reason = dom.state()
    except libvirt.libvirtError:
        return False
    return state == libvirt.VIR_DOMAIN_PAUSED and reason in (
        libvirt.VIR_DOMAIN_PAUSED_MIGRATION, libvirt.VIR_DOMAIN_PAUSED_POSTCOPY)


def _peer_alive(store, name: str) -> bool | None:
    """Whether ``name`` is a live host (:mod:`engine.core.hosts`); None
    when etcd cannot tell."""
    try:
        kv = store.get(keys.host(name))
    except StoreUnavailable:
        return None
    return kv is not None and is_live_record(kv)


def _line(exc: libvirt.libvirtError) -> str:
    """libvirt's message on one line (QEMU's may span several)."""
    return " ".join((exc.get_error_message() or str(exc)).split())


def _try(fn, *fn_args) -> bool:
    try:
        fn(*fn_args)
        return True
    except libvirt.libvirtError as exc:
        log.info("migration_call_refused", call=fn.__name__, error=_line(exc))
        return False


def _timeout(dom, move: _Move) -> tuple[float, int]:
    """(``timeout_per_gib`` seconds per GiB of RAM and disk to copy, the
    disk to copy in bytes): the disks' virtual sizes, or their top layers'
    allocation when incremental, as libvirt's mirror counts them."""
    memory, disk = dom.info()[1] * 1024, 0
    for dev in move.disks:
        try:
            capacity, allocation, _physical = dom.blockInfo(dev, 0)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                raise           # the domain left (a move ended): the caller looks again
            raise RequestError(f"{move.label} has no disk {dev}: {_line(exc)}") from None
        disk += allocation if move.incremental else capacity
    return move.timeout_per_gib * (memory + disk) / GiB, disk


# -- what is where -----------------------------------------------------------

def _domain(conn, uuid: str):
    try:
        return conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def _holds(dest, move: _Move) -> bool:
    """The destination has the VM as a finished move leaves it."""
    there = _domain(dest, move.uuid)
    return there is not None and (there.isActive() or there.isPersistent()) \
        and not _job_running(there)


def _completed_on(there) -> dict | None:
    """The statistics of the migration that brought ``there`` in, as the
    destination keeps them (kept for a later run to read again)."""
    try:
        stats = there.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED
                               | libvirt.VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED)
    except libvirt.libvirtError:
        return None
    return stats if stats.get("type") == libvirt.VIR_DOMAIN_JOB_COMPLETED else None


def _result(move: _Move, completed: dict, disk_bytes: int | None,
            seconds: float | None) -> dict:
    """The figures of a finished move.  The source cannot tell them once it
    is over: its domain is gone, with its statistics, as libvirt undefined
    it.  The destination keeps memory and downtime (how long the guest ran
    nowhere); the disks' copy is what the source's polls saw of libvirt's
    mirror (whole virtual sizes, zero areas included; the top layers'
    allocation when incremental), else what it was to be."""
    memory = completed.get("memory_processed")
    known = memory is not None and disk_bytes is not None
    return {"mode": move.mode, "downtime_ms": completed.get("downtime"),
            "bytes": memory + disk_bytes if known else None,
            "seconds": round(seconds, 3) if seconds is not None else None,
            "disk_bytes": disk_bytes, "memory_bytes": memory}


def _stop_there(there, move: _Move) -> None:
    """A cold move ends shut off on the destination: its paused copy (no
    guest code ever ran) is destroyed, its persistent definition stays.  A
    copy that runs there was started since, by someone else: left alone."""
    if vm_state(there) != "paused":
        return
    try:
        there.destroy()
    except libvirt.libvirtError as exc:
        raise RequestError(f"{move.label} moved to {move.destination} but could not be "
                           f"stopped there: {_line(exc)}") from None


def _restore(host, move: _Move, was: str) -> None:
    """After a failed copy the VM is here as it was before: a live VM runs
    (or stays paused), a cold one is shut off again."""
    dom = find_domain(host, move.uuid)
    if dom is None:
        return
    if not move.live:
        if dom.isActive():
            _try(dom.destroy)
    elif was == "running" and _paused_for_migration(dom):
        _try(dom.resume)


# -- the transport ------------------------------------------------------------

def _transport(uri: str) -> str:
    """``tls`` of ``qemu+tls://...``; "" for ``qemu:///system``."""
    return urllib.parse.urlparse(uri).scheme.partition("+")[2]
