"""Keeps ``vms/<host>/<uuid>`` in line with what libvirt has, so that
``vmlist`` is one range read instead of a fan-out to every host.

Promises:
- a publisher never makes a VM exist nor forgets one: the automations'
  requests write a VM's record when they make it on a host (``build``, a
  move's ``adopt``, :func:`publish_domain` with ``create``) and delete it
  when they end it there (``destroy``, :func:`forget`; a confirmed move or
  an HA restart elsewhere drops the source's).  After
  :meth:`VmPublisher.reconcile` returns, every record of ``vms/<host>/``
  shows its domain as libvirt has it (with what the cluster decided kept,
  see :mod:`engine.hypervisor.domain.records`), or ``missing`` when libvirt has no
  such domain and no automation holds the VM.  A domain with no record is
  reported once and left alone; a key is written only when its value
  changed;
- an HA VM found missing or crashed is asked a restart (``restart/<uuid>``,
  created if absent, each time it is looked at);
- every write is fenced by what was read: etcd is read first, libvirt
  second, and each put or delete carries a compare on the key's mod
  revision (or its absence) as read.  A writer whose etcd view is older
  than another's write is refused and reads again, so an older view of
  libvirt never overwrites a newer one.  :func:`publish_domain` (the
  ``build`` handler, before it replies) and the reconcile pass both write
  this way;
- a publisher given its peer's lease writes only while ``hosts/<host>``
  holds that lease: a peer thawed after a hang, or back from a partition,
  publishes nothing before it notices that its lease is gone (its VMs may
  have been recovered elsewhere meanwhile);
- once started, a libvirt lifecycle event (start, stop, suspend, undefine...)
  reaches etcd within a reconcile's time (it waits :data:`EVENT_SETTLE` for
  the events that follow it, to publish them together), and a periodic
  reconcile repairs whatever an event could not (etcd away, libvirtd
  restarted, events lost, a record changed behind its back): every
  ``interval`` seconds (:data:`DEFAULT_INTERVAL`), or every
  ``heard_interval`` (:data:`HEARD_INTERVAL`, longer) while its memo is
  armed, that is while both kinds of events are heard, which leaves the
  period only records changed in etcd by others to repair; but every
  ``interval`` again while its last look left a VM unsettled (gone here
  while an automation holds it, or an HA VM down or missing, whose restart
  request the recoverer serves, refuses or gives up on), so that its fate
  is looked at soon: the request is asked again if it went.
  An event re-publishes only the domains it names (one read and at most
  one write each), not the whole host: a host booting its 250th VM does
  not read and compare the other 249 on each of its events.  Nor does it
  read etcd for a domain that libvirt shows just as the record this
  process last wrote or read for it (a ``build`` that recorded its VM
  before the events of its define and start came): that look costs
  libvirt's answer only, or nothing when the record came from a look at
  libvirt after the event.  A record another process changed meanwhile is
  thus corrected by the next reconcile, not by the event;
- the host's foreign domains (no peerctl metadata, see
  :mod:`engine.hypervisor.host.foreign`) are published too, apart, as
  ``foreign/<host>/<uuid>`` under the peer's lease (they vanish with it):
  seen, never acted on (an event on a peerctl domain leaves them be).
  Each key is written only when it changed, guarded like a VM record, so a
  look older than an adoption never brings back the foreign record the
  adoption removed;
- a running VM with interfaces but no address yet is looked at every
  :data:`ADDRESS_INTERVAL` seconds until its guest has one (DHCP takes a
  few seconds after the start event), so ``boot --wait-ip`` is not held up
  by the period;
- while it hears libvirt's lifecycle and metadata-change events, it keeps
  each domain's metadata (:attr:`VmPublisher.memo`, see
  :mod:`engine.hypervisor.domain.metadata_memo`): a reconcile, and the
  peer's stats tick, read only the domains an event named since;
- libvirt's event loop is registered once per process
  (:func:`ensure_event_loop`); each publisher listens on a connection of its
  own, opened after that registration, because a remote connection opened
  before it never delivers events.
"""
from __future__ import annotations

import os
import threading
import time

import libvirt
import structlog

from engine.core import keys, locks
from engine.core.store import Delete, Put, absent, lease_is, modified_at
from engine.core.values import readable
from engine.errors import RequestError, StoreUnavailable
from engine.hypervisor.domain import shapes  # noqa: F401  (declares the vms/ record's shape)
from engine.hypervisor.domain.metadata_memo import MetadataMemo
from engine.hypervisor.host.known_records import known_of as _known_of, remember as _remember
from engine.hypervisor.host.libvirt_events import ensure_event_loop, own_state_per_open
from engine.hypervisor.host.foreign import foreign_domains, foreign_record, is_foreign, scan
from engine.hypervisor.domain.records import merged, missing, owned_by, vm_record, wants_restart
from engine.hypervisor.host.vm_home import arrive, leave

__all__ = ["VmPublisher", "ensure_event_loop", "publish_domain", "publish_new", "forget",
           "DEFAULT_INTERVAL", "HEARD_INTERVAL"]

log = structlog.get_logger("peerctl.vmpublish")

DEFAULT_INTERVAL = float(os.environ.get("PEERCTL_PUBLISH_INTERVAL", "10"))
# The period while lifecycle and metadata events are both heard (at least the above).
HEARD_INTERVAL = float(os.environ.get("PEERCTL_PUBLISH_HEARD_INTERVAL", "60"))
# "0": no lifecycle events, the period only (tests use it to show that a
# finished boot does not depend on the publisher; see publish_domain).
EVENTS = os.environ.get("PEERCTL_PUBLISH_EVENTS", "1") != "0"
ADDRESS_INTERVAL = 1.0
EVENT_SETTLE = 0.05         # seconds an event waits for those that follow it
_BATCH = 64                 # etcd allows 128 operations per transaction
_TRIES = 20                 # fenced writes refused in a row before giving up

def _awaits_address(record: dict) -> bool:
    return bool(record.get("networks")) and record["state"] == "running" \
        and not record.get("addresses")


def _guard(key: str, kv) -> "object":
    """The compare that holds while ``key`` is as it was read."""
    return modified_at(key, kv.mod_revision) if kv is not None else absent(key)


def _publish_uuid(store, host: str, conn, uuid: str, fence: tuple = (),
                  since: float | None = None) -> tuple[bool, dict | None]:
    """Bring the existing record of the domain ``uuid`` of ``conn`` up to
    date; a domain gone (or not this host's) makes it ``missing``, unless
    an automation holds the VM (a move away, a destroy: it settles the
    record itself).  No record: nothing is written.  (whether the key
    changed, the record or None).  ``since``: when the event that asks came
    (a record this process made from a later look at libvirt stands)."""
    key = keys.vm(host, uuid)
    unchanged = _unchanged(store, key, conn, host, uuid, since)
    if unchanged is not None:
        return False, unchanged

    def seen(previous: dict) -> dict | None:
        try:
            dom = conn.lookupByUUIDString(uuid)
            if owned_by(dom, host):
                return merged(vm_record(host, dom), previous)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise
        return None if _acted_on(store, uuid) else missing(previous, time.time())
    return _write_seen(store, key, seen, fence)


def _unchanged(store, key: str, conn, host: str, uuid: str,
               since: float | None = None) -> dict | None:
    """The record this process last wrote or read for ``key``, if it was
    made from a look at libvirt after ``since`` or libvirt shows the domain
    just so now (and it asks no restart); else None: look at etcd.  Reads
    libvirt at most."""
    remembered = _known_of(store).get(key)
    if remembered is None:
        return None
    if since is not None and remembered[2] >= since and not wants_restart(remembered[1]):
        return remembered[1]
    try:
        dom = conn.lookupByUUIDString(uuid)
        if not owned_by(dom, host):
            return None
        record = merged(vm_record(host, dom), remembered[1])
    except libvirt.libvirtError:
        return None             # gone, most likely: the usual path says what it is
    if record != remembered[1] or wants_restart(record):
        return None
    return record


def _acted_on(store, uuid: str) -> bool:
    """An automation holds the VM (or a failed move left it held)."""
    return locks.in_force(store, f"vm/{uuid}")


def _write_seen(store, key: str, seen, fence: tuple = (),
                create: bool = False, unless: str | None = None) -> tuple[bool, dict | None]:
    """Write ``key`` as ``seen(previous)`` has it unless it holds that
    already or ``seen`` says None (leave it); (whether it changed, the
    record).  Without ``create`` a key that does not exist stays so: a
    publisher never makes a VM exist.  The key is read before ``seen`` looks
    at libvirt and the write holds only if the key is still as read, so it
    never replaces a record written from a later view; and only while the
    ``fence`` compares hold (:class:`StoreUnavailable` once they do not).
    ``unless``: a key whose existence forbids making the record (the VM's
    ``disowned/`` mark on this host: a request that ran late, after its
    automation gave this host up, must not give the VM a second record):
    :class:`RequestError` then, nothing written.
    An HA VM found down or missing is asked a restart (:func:`_ask_restart`)."""
    for _ in range(_TRIES):
        kv = store.get(key)
        if kv is None and not create:
            _remember(store, key, 0, None)
            return False, None
        previous = readable(kv) if kv is not None else None
        if kv is not None and previous is None:
            _remember(store, key, 0, None)
            return False, None          # unreadable: left for ``peerctl scrub``
        seen_at = time.monotonic()
        record = seen(previous)
        if record is None or previous == record:
            _remember(store, key, kv.mod_revision if kv is not None else 0, record, seen_at)
            if record is not None:
                _ask_restart(store, record, fence)
            return False, record
        made = [absent(unless)] if kv is None and unless else []
        written = store.txn([_guard(key, kv), *made, *fence], [Put(key, record)])
        if written.succeeded:
            _remember(store, key, written.revision, record, seen_at)
            _ask_restart(store, record, fence)
            return True, record
        if made and store.get(unless) is not None:
            raise RequestError(f"VM {record.get('name')!r} is disowned on {record['host']}: "
                               "its automation gave this host up, no record is made here")
        _check_fence(store, fence)
    raise StoreUnavailable(f"{key}: refused {_TRIES} times in a row (concurrent writers)")


def _ask_restart(store, record: dict, fence: tuple = ()) -> bool:
    """``restart/<uuid>`` for an HA VM that is missing or crashed here, if
    none is there yet (the ``recoverer`` acts on it, see
    :mod:`engine.hypervisor.ha.recoverer`).  Asked on every look, not only on the
    change, so a publisher that died between the two writes asks next time.
    True when the VM wants one (asked now, already asked, or held by an
    automation): until it is settled, the next look comes soon."""
    if not wants_restart(record):
        return False
    if _acted_on(store, record["uuid"]):
        return True
    key = keys.restart(record["uuid"])
    request = {"uuid": record["uuid"], "host": record["host"], "name": record.get("name"),
               "why": "missing" if record["state"] == "missing" else "crashed",
               "time": time.time()}
    if store.txn([absent(key), *fence], [Put(key, request)]).succeeded:
        log.warning("vm_restart_asked", host=record["host"], uuid=record["uuid"],
                    vm=record.get("name"), why=request["why"])
    return True


def _check_fence(store, fence: tuple) -> None:
    """Raise :class:`StoreUnavailable` when a write was refused by the
    publisher's lease fence, not by a concurrent writer."""
    if fence and not store.txn(fence).succeeded:
        raise StoreUnavailable(f"{fence[0].key} no longer holds this peer's lease: "
                               "not publishing until its next session")


def publish_domain(store, host: str, dom, want: str | None = None,
                   create: bool = True) -> bool:
    """Write ``vms/<host>/<uuid>`` for ``dom`` as libvirt has it now, with
    ``want`` (the state the request that calls this left it in) when given;
    True if it changed.  For the requests of automations: ``build`` and a
    move's ``adopt`` make the record (``create``), the others bring it up to
    date.  Idempotent: a key already right is not rewritten.  Fenced like
    :meth:`VmPublisher.reconcile` (:func:`_write_seen`).  A record made
    while a move or an HA restart carries the VM arrives here from the host
    that had it, in one transaction (:func:`engine.hypervisor.host.vm_home.arrive`):
    the VM never has two records."""
    uuid = dom.UUIDString()
    if create and arrive(store, host, uuid,
                         lambda previous: merged(vm_record(host, dom), previous, want)):
        _remember(store, keys.vm(host, uuid), 0, None)
        return True
    unwanted = keys.disowned(host, uuid)
    changed, _ = _write_seen(store, keys.vm(host, uuid),
                             lambda previous: merged(vm_record(host, dom), previous, want),
                             create=create, unless=unwanted if create else None)
    return changed


def publish_new(store, host: str, dom, want: str, together: dict) -> bool:
    """Write ``vms/<host>/<uuid>`` for ``dom``, a domain just made, with
    ``want``, and the keys of ``together`` ({key: value}) in the same
    transaction, which holds only while none of them exists; False,
    writing nothing, otherwise (then :func:`publish_domain` is the way), or
    while any automation's lock names the VM (a VM being restarted is no
    new one: its record arrives from where it was)."""
    key = keys.vm(host, dom.UUIDString())
    seen_at = time.monotonic()
    record = merged(vm_record(host, dom), None, want=want)
    written = store.txn([absent(key), absent(keys.lock(f"vm/{dom.UUIDString()}")),
                         *(absent(other) for other in together)],
                        [Put(key, record), *(Put(k, v) for k, v in together.items())])
    if written.succeeded:
        _remember(store, key, written.revision, record, seen_at)
    return written.succeeded


def _foreign_domain_or_none(conn, uuid: str) -> bool:
    """The domain ``uuid`` is foreign or gone: its ``foreign/`` record may
    need a change (a peerctl domain's never does)."""
    try:
        return is_foreign(conn.lookupByUUIDString(uuid))
    except libvirt.libvirtError:
        return True


def _foreign_domain(conn, uuid: str):
    """The foreign domain ``uuid`` of ``conn``, or None (none, or peerctl's)."""
    try:
        dom = conn.lookupByUUIDString(uuid)
        return dom if is_foreign(dom) else None
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
            raise
        return None


def _foreign_change(host: str, uuid: str, kv, dom, lease: int, offer: dict) -> list:
    """The write that brings ``foreign/<host>/<uuid>`` (read as ``kv``) in
    line with the foreign domain ``dom`` (None: there is none): a put, a
    delete, or nothing."""
    key = keys.foreign(host, uuid)
    try:
        record = foreign_record(host, dom, offer) if dom is not None else None
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
            raise
        record = None                   # undefined meanwhile
    if record is None:
        return [Delete(key)] if kv is not None else []
    if kv is not None and readable(kv) == record and kv.lease == lease:
        return []
    return [Put(key, record, lease)]     # (a new session's lease, too: the old one ends)


def forget(store, host: str, uuid: str) -> None:
    """Delete ``vms/<host>/<uuid>``: for ``destroy``, once the VM is gone
    from ``host``; unless a move or an HA restart carries the VM (its copy
    here is one it cleans up: its unlock settles the record)."""
    _remember(store, keys.vm(host, uuid), 0, None)
    leave(store, host, uuid)


class VmPublisher:
    """Publishes one host's VMs; ``conn`` is the host's libvirt connection
    (or a zero-argument callable returning it, to follow reconnections);
    ``lease``: the peer's, which ``hosts/<host>`` must hold for a write to
    land (None: no such fence, for a publisher outside a peer)."""

    def __init__(self, store, host: str, conn, interval: float = DEFAULT_INTERVAL,
                 events: bool = EVENTS, lease: int | None = None, offer: dict | None = None,
                 heard_interval: float = HEARD_INTERVAL):
        self.store = store
        self.offer = offer or {}        # the networks the host offers (foreign domains' problems)
        self.fence = (lease_is(keys.host(host), lease),) if lease is not None else ()
        self.lease = lease or 0
        self.events = events
        self.host = host
        self._conn_source = conn if callable(conn) else (lambda: conn)
        self.uri = self._conn_source().getURI()
        self.interval = interval
        self.heard_interval = max(interval, heard_interval)
        self.prefix = keys.vm(host)
        self._own_conn = None
        self._events_conn = None
        self._callback_id = self._metadata_callback_id = None
        self._wake = threading.Event()
        self._lock_events = threading.Lock()
        # uuids named by events, not yet published: when the last one came (monotonic)
        self._events: dict[str, float] = {}
        self._due = True                    # a whole reconcile is wanted (start, period)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.reconciles = 0
        self.awaiting_address = False
        # A VM the last whole look left unsettled (gone while an automation
        # holds it, an HA VM down or missing): the short period applies.
        self.held = False
        self._unrecorded: set[str] = set()     # domains without a record, reported once
        # Each domain's metadata while events say it has not changed (armed
        # while they are listened for): for the reconciles and the stats tick.
        self.memo = MetadataMemo()

    # -- one pass ----------------------------------------------------------

    def _conn(self):
        conn = self._conn_source()
        if conn.isAlive():
            return conn
        if self._own_conn is None or not self._own_conn.isAlive():
            self._own_conn = libvirt.open(self.uri)
        return self._own_conn

    def records(self, scanned: list | None = None) -> dict[str, dict]:
        """This host's VMs as libvirt has them now (its domains as
        ``scanned``: :func:`engine.hypervisor.host.foreign.scan`), by uuid."""
        records = {}
        for dom, metadata in scan(self._conn(), self.memo) if scanned is None else scanned:
            try:
                if metadata.get("host") == self.host:
                    records[dom.UUIDString()] = vm_record(self.host, dom, metadata)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                    raise
                # undefined while we were listing: the next pass sees it gone
        return records

    def reconcile(self) -> int:
        """Make ``vms/<host>/`` match libvirt, and ``foreign/<host>/`` too
        (:meth:`publish_foreign`); returns how many VM records changed."""
        with self._lock:
            changed = 0
            for _ in range(_TRIES):
                done, wanted, scanned = self._pass()
                changed += done
                if wanted is not None:
                    break
            else:
                raise StoreUnavailable(f"{self.prefix}: reconcile refused {_TRIES} times")
            self.publish_foreign(scanned=scanned)   # apart: the count is of VM records
            self.reconciles += 1
            self.awaiting_address = any(_awaits_address(r) for r in wanted.values())
            if changed:
                log.info("vms_published", host=self.host, changed=changed, vms=len(wanted))
            return changed

    def _pass(self) -> tuple[int, dict | None]:
        """One fenced pass: etcd first, then libvirt (so libvirt's view is
        the newer), each key's write guarded by its mod revision as read.
        Only records that exist are written: a domain without one is
        nobody's VM yet (a build or a move writes it); a record without a
        domain is ``missing`` (unless an automation holds the VM).
        Returns (keys written, libvirt's records, every domain with its
        metadata as read once for them), the records None when a batch was
        refused because someone else wrote in between."""
        kvs, _revision = self.store.range(self.prefix)
        present = {kv.key[len(self.prefix):]: kv for kv in kvs}
        seen_at = time.monotonic()
        scanned = scan(self._conn(), self.memo)
        seen = self.records(scanned)
        now = time.time()
        changes, after, held = [], [], False
        known = _known_of(self.store)
        for key in [k for k in list(known) if k.startswith(self.prefix)
                    and k[len(self.prefix):] not in present]:
            _remember(self.store, key, 0, None)      # deleted since
        for uuid, kv in sorted(present.items()):
            previous = readable(kv)
            if previous is None:
                _remember(self.store, kv.key, 0, None)
                continue                # unreadable: left for ``peerctl scrub``
            if uuid in seen:
                record = merged(seen[uuid], previous)
            elif _acted_on(self.store, uuid):
                held = True             # gone here while held: looked at again soon
                continue
            else:
                record = missing(previous, now)
            after.append(record)
            if record != previous:
                changes.append((uuid, Put(self.prefix + uuid, record)))
            else:
                _remember(self.store, kv.key, kv.mod_revision, record, seen_at)
        unrecorded = set(seen) - set(present) - self._unrecorded
        for uuid in sorted(unrecorded):
            log.info("vm_without_record", host=self.host, uuid=uuid,
                     vm=seen[uuid].get("name"))
        self._unrecorded = set(seen) - set(present)
        written = 0
        for start in range(0, len(changes), _BATCH):
            batch = changes[start:start + _BATCH]
            compares = [_guard(self.prefix + uuid, present.get(uuid)) for uuid, _op in batch]
            result = self.store.txn([*compares, *self.fence], [op for _uuid, op in batch])
            if not result.succeeded:
                _check_fence(self.store, self.fence)
                return written, None, scanned
            for _uuid, op in batch:
                _remember(self.store, op.key, result.revision, op.value, seen_at)
            written += len(batch)
        for record in after:
            held = _ask_restart(self.store, record, self.fence) or held
        self.held = held
        return written, seen, scanned

    def publish_foreign(self, uuids=None, scanned: list | None = None) -> int:
        """Make ``foreign/<host>/`` match the foreign domains libvirt has
        (only ``uuids`` when given; as ``scanned`` when given); how many
        keys changed.  A write refused because someone wrote in between is
        left to the next pass."""
        prefix = keys.foreign(self.host)
        kvs, _revision = self.store.range(prefix)
        present = {kv.key[len(prefix):]: kv for kv in kvs}
        conn = self._conn()
        if uuids is None:               # every one: one listing, no lookups
            seen = {}
            for dom in foreign_domains(conn, scanned):
                try:
                    seen[dom.UUIDString()] = dom
                except libvirt.libvirtError:
                    continue
            uuids = set(present) | set(seen)
        else:
            seen = {uuid: _foreign_domain(conn, uuid) for uuid in uuids}
        changes = []
        for uuid in sorted(uuids):
            for op in _foreign_change(self.host, uuid, present.get(uuid), seen.get(uuid),
                                      self.lease, self.offer):
                changes.append((_guard(op.key, present.get(uuid)), op))
        written = 0
        for start in range(0, len(changes), _BATCH):
            batch = changes[start:start + _BATCH]
            if not self.store.txn([*(guard for guard, _op in batch), *self.fence],
                                  [op for _guard, op in batch]).succeeded:
                _check_fence(self.store, self.fence)
                break
            written += len(batch)
        return written

    # -- running -----------------------------------------------------------

    def _on_lifecycle(self, _conn, dom, event, detail, _opaque):
        try:
            uuid = dom.UUIDString()
        except libvirt.libvirtError:
            uuid = None
        self.memo.forget(uuid)
        if uuid is None:
            with self._lock_events:
                self._due = True
            self._wake.set()
        else:
            self.named(uuid)

    def _on_metadata(self, _conn, dom, _kind, _namespace, _opaque):
        try:
            self.memo.forget(dom.UUIDString())
        except libvirt.libvirtError:
            self.memo.forget()

    def named(self, uuid: str) -> None:
        """A lifecycle event named domain ``uuid``, now: publish it soon."""
        with self._lock_events:
            self._events[uuid] = time.monotonic()
        self._wake.set()

    EVENT_BATCH = 32    # more domains named at once than this: one reconcile instead

    def publish_events(self) -> int:
        """Publish the domains events named since the last call (a whole
        reconcile when there are many); how many keys changed."""
        with self._lock_events:
            uuids, self._events = self._events, {}
        if len(uuids) > self.EVENT_BATCH:
            return self.reconcile()
        changed = 0
        unrecorded = set()
        with self._lock:
            conn = self._conn()
            for uuid in sorted(uuids):
                done, record = _publish_uuid(self.store, self.host, conn, uuid, self.fence,
                                             since=uuids[uuid])
                changed += done
                if record is None:
                    if _foreign_domain_or_none(conn, uuid):
                        unrecorded.add(uuid)    # foreign, perhaps
                elif _awaits_address(record):
                    self.awaiting_address = True
            if unrecorded:
                self.publish_foreign(unrecorded)
        return changed

    def _listen(self) -> None:
        """(Re)open the event connection if it is missing or dead."""
        if not self.events:
            return
        if self._events_conn is not None:
            try:
                if self._events_conn.isAlive():
                    return
            except libvirt.libvirtError:
                pass
            self.memo.disarm()          # events may have been missed
            self._events_conn = self._callback_id = self._metadata_callback_id = None
        try:
            # A test driver file gives each open a state of its own: listen
            # on the connection the requests use, or no event would come.
            conn = self._conn_source() if own_state_per_open(self.uri) else libvirt.open(self.uri)
            try:
                conn.setKeepAlive(5, 3)
            except libvirt.libvirtError:
                pass        # local drivers have no keepalive
            self._callback_id = conn.domainEventRegisterAny(
                None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._on_lifecycle, None)
            self._events_conn = conn
            self._remember_metadata(conn)
        except libvirt.libvirtError as exc:
            log.warning("vm_events_unavailable", host=self.host, error=str(exc))

    def _remember_metadata(self, conn) -> None:
        """Arm the memo once metadata changes are heard of too, and a closed
        connection disarms it (no memo where either cannot be had)."""
        try:
            self._metadata_callback_id = conn.domainEventRegisterAny(
                None, libvirt.VIR_DOMAIN_EVENT_ID_METADATA_CHANGE, self._on_metadata, None)
            if not own_state_per_open(self.uri):
                conn.registerCloseCallback(lambda *_args: self._connection_closed(), None)
        except (libvirt.libvirtError, AttributeError) as exc:
            log.info("vm_metadata_events_unavailable", host=self.host, error=str(exc))
            return
        self.memo.arm()

    def _connection_closed(self) -> None:
        """The event connection closed (libvirtd restarted, say): forget,
        and reconcile the whole host now, reopening it; events may be lost."""
        self.memo.disarm()
        with self._lock_events:
            self._due = True
        self._wake.set()

    def start(self) -> "VmPublisher":
        ensure_event_loop()
        self._listen()
        self._due = True
        self._wake.set()            # publish at once
        self._thread = threading.Thread(target=self._run, name=f"vmpublish-{self.host}",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        """A whole reconcile at start and every period (sooner while a VM
        waits for its address, or after a failure); in between, each wake
        publishes the domains events named."""
        whole_at = 0.0      # monotonic time of the next whole reconcile
        while not self._stopped.is_set():
            self._wake.wait(max(0.0, whole_at - time.monotonic()))
            self._wake.clear()
            if self._stopped.is_set():
                break
            self._listen()
            with self._lock_events:
                whole = self._due or time.monotonic() >= whole_at
                self._due = False
            try:
                if whole:
                    self.reconcile()
                    whole_at = time.monotonic() + (
                        min(ADDRESS_INTERVAL, self.interval) if self.awaiting_address
                        else self.period)
                else:
                    # Let the events of one request settle: a build's define
                    # and start come as it records the VM, from a later look.
                    self._stopped.wait(EVENT_SETTLE)
                    self.publish_events()
                    if self.awaiting_address:
                        whole_at = min(whole_at, time.monotonic()
                                       + min(ADDRESS_INTERVAL, self.interval))
            except (StoreUnavailable, libvirt.libvirtError) as exc:
                log.warning("vm_reconcile_failed", host=self.host, error=str(exc))
                self._due = True        # what the events named may be lost: all of it
                whole_at = time.monotonic() + min(1.0, self.interval)
                self._wake.clear()
            except Exception:
                log.exception("vm_reconcile_crashed", host=self.host)
                whole_at = time.monotonic() + self.interval

    @property
    def period(self) -> float:
        """Seconds between two whole reconciles now: longer while events
        are heard (the memo is armed then) and no VM waits on an
        automation, see the module docstring."""
        return self.heard_interval if self.memo.armed and not self.held else self.interval

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        self.memo.disarm()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._events_conn is not None:
            try:
                for callback_id in (self._callback_id, self._metadata_callback_id):
                    if callback_id is not None:
                        self._events_conn.domainEventDeregisterAny(callback_id)
                if not own_state_per_open(self.uri):
                    self._events_conn.close()
            except libvirt.libvirtError:
                pass
            self._events_conn = self._callback_id = self._metadata_callback_id = None
        if self._own_conn is not None:
            try:
                self._own_conn.close()
            except libvirt.libvirtError:
                pass
