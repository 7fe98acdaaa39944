"""The one door to etcd.

Everything peerctl keeps lives under ``/peerctl/<cluster>/``; callers name
keys relative to that prefix and never see the client library, so swapping
the etcd client touches this file only.  Values are msgpack.

Promises:
- every failure to reach etcd surfaces as :class:`StoreUnavailable`;
- reading never raises on what etcd holds: a value that is not msgpack is a
  :class:`~engine.core.values.Garbled`, for readers to skip (see
  ``engine/core/values.py``);
- a transaction is all-or-nothing and reports the revision it ran at;
- reads, and requests that never left this process, are tried again on the
  next member; a guarded write through :meth:`Store.txn_once` is tried again
  after a lost reply and lands once;
- ``watch`` delivers events in revision order to a callback and reports a
  broken stream (etcd restarted, revision compacted) as one error call, so the
  caller can resume from the last revision it saw.
- ``watch_stream`` delivers the same events to the thread that iterates it,
  straight from gRPC, and ends by raising :class:`WatchBroken` or
  :class:`Compacted`.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

os.environ.setdefault("GRPC_VERBOSITY", "NONE")   # gRPC core's own stderr lines are not for users
import grpc  # noqa: E402
import msgpack
import pyetcd
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exceptions
from pyetcd import utils as etcd_utils

from engine.errors import Compacted, StoreRefused, StoreUnavailable, WatchBroken

from . import values
from .credentials import Credentials
from .grpc_failures import CONNECT_WITHIN, Failures
from .validate import endpoint_scheme, parse_endpoints   # shared with the command line

__all__ = [
    "Store", "WatchStream", "KV", "Event", "TxnResult", "StoreUnavailable", "StoreRefused",
    "WatchBroken", "Compacted", "Put", "Delete", "Get", "absent", "exists", "created_at",
    "modified_at", "value_is", "lease_is", "untouched_since", "parse_endpoints",
    "wake_blocked_streams_every",
]


class LeaseGone(StoreUnavailable, KeyError):
    """A write bound to a lease that etcd no longer has (it expired while
    this process was paused or cut off): whoever holds a session must start
    a new one, as for any interruption of the store."""

    def __str__(self):
        return str(self.args[0]) if self.args else "lease not found"


def _encode(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


_decode = values.decode      # never raises: bytes that are not msgpack are Garbled


@dataclass(frozen=True)
class KV:
    key: str            # relative to the cluster prefix
    value: Any
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class Event:
    kind: str           # "put" or "delete"
    kv: KV


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    ranges: list        # list[list[KV]] for Get ops, in order
    # per Get, the keys in its range: all of them, modified since or not
    counts: list = field(default_factory=list)


# -- transaction operations and comparisons ---------------------------------

@dataclass(frozen=True)
class Put:
    key: str
    value: Any
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True)
class Get:
    """A read in a transaction; with ``since``, only the keys modified at
    or after that revision (the result's ``counts`` still counts them all)."""
    key: str
    prefix: bool = False
    since: int = 0


@dataclass(frozen=True)
class Compare:
    key: str
    target: str         # "version" | "create" | "mod" | "value" | "lease"
    op: str             # "==" | "!=" | "<" | ">"
    operand: Any
    range_end: str | None = None    # compare every key in [key, range_end)


def absent(key: str) -> Compare:
    return Compare(key, "version", "==", 0)


def exists(key: str) -> Compare:
    return Compare(key, "version", ">", 0)


def created_at(key: str, revision: int) -> Compare:
    """The fencing compare: the key still is the one created at ``revision``."""
    return Compare(key, "create", "==", revision)


def modified_at(key: str, revision: int) -> Compare:
    return Compare(key, "mod", "==", revision)


def value_is(key: str, value: Any) -> Compare:
    return Compare(key, "value", "==", value)


def lease_is(key: str, lease: int) -> Compare:
    return Compare(key, "lease", "==", lease)


def untouched_since(start: str, end: str, revision: int) -> Compare:
    """No key in ``[start, end)`` was created or modified after ``revision``
    (a range read at ``revision`` is still what etcd holds, deletions aside).
    An empty range holds."""
    return Compare(start, "mod", "<", revision + 1, range_end=end)


_OPS = {"==": etcdrpc.Compare.EQUAL, "!=": etcdrpc.Compare.NOT_EQUAL,
        "<": etcdrpc.Compare.LESS, ">": etcdrpc.Compare.GREATER}


# gRPC's default reconnect backoff grows to two minutes; a restarted etcd must
# be found again within a fraction of a lease TTL.
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                    # a new connection has CONNECT_WITHIN to be answered (grpc_failures)
                    ("grpc.min_reconnect_backoff_ms", int(CONNECT_WITHIN * 1000)),
                    ("grpc.max_reconnect_backoff_ms", 500),
                    # gRPC's 4 MiB default would refuse a page of large values
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    # A unary-stream call (watch_stream) is read on its caller's
                    # thread, not handed over by the channel's spin thread.
                    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
_WATCH = "/etcdserverpb.Watch/Watch"
_SHA256 = 32        # bytes of the sum etcd appends to a snapshot
_DELETE = etcdrpc.kv_pb2.Event.DELETE


def wake_blocked_streams_every(seconds: float) -> None:
    """How often gRPC wakes a thread blocked on a stream's next message.

    gRPC Python wakes every such thread each 0.1 s (its private
    ``grpc._common.MAXIMUM_WAIT_TIMEOUT``), so that a main thread waiting
    there still runs its signal handlers.  A peer keeps several threads
    there for its whole life (its watches, its lease's keep-alive stream)
    and its main thread never waits there, so it asks for 1 s: ten times
    fewer wake-ups of an idle peer.  A gRPC without that knob is left as
    it is (nothing but the idle cost depends on it)."""
    common = getattr(grpc, "_common", None)
    if common is not None and isinstance(getattr(common, "MAXIMUM_WAIT_TIMEOUT", None), float):
        common.MAXIMUM_WAIT_TIMEOUT = seconds


class Store:
    """A cluster's keyspace in etcd."""

    def __init__(self, endpoints: str = "http://127.0.0.1:2379",
                 cluster: str = "default", timeout: float = 5.0,
                 credentials: Credentials | None = None):
        self.endpoints = endpoints
        self.cluster = cluster
        self.prefix = f"/peerctl/{cluster}/"
        self._prefix_bytes = self.prefix.encode()
        self.credentials = credentials or Credentials()
        secure = endpoint_scheme(endpoints) == "https"
        creds = grpc.ssl_channel_credentials(*self.credentials.read()) if secure else None
        self._client = pyetcd.MultiEndpointEtcd3Client(
            endpoints=[pyetcd.Endpoint(host, port, secure=secure, creds=creds,
                                       time_retry=0.5, opts=_CHANNEL_OPTIONS)
                       for host, port in parse_endpoints(endpoints)],
            timeout=timeout, failover=True)
        self._timeout = timeout
        self._failures = Failures(endpoints, secure, self.credentials, timeout)
        self._watch_lock = threading.Lock()
        self._failover_lock = threading.Lock()
        self._watch_broke = None        # the member whose watch stream broke: gone, maybe

    # -- plumbing ----------------------------------------------------------

    def _full(self, key: str) -> bytes:
        return self._prefix_bytes + key.encode(errors="surrogateescape")

    def _kv(self, raw) -> KV:
        return KV(raw.key[len(self._prefix_bytes):].decode(errors="surrogateescape"),
                  _decode(raw.value),
                  raw.create_revision, raw.mod_revision, raw.version, raw.lease)

    _READS = frozenset({"Range", "Status"})

    def _call(self, stub: str, method: str, request, read: bool | None = None):
        """One RPC; the stub is looked up inside the try because pyetcd raises
        there too while it considers the endpoint failed.  With several
        endpoints, a failure moves to the next member, and a read (``read``,
        by default the methods in ``_READS``), or a request that never left
        this process, is tried again there."""
        read = method in self._READS if read is None else read
        members = len(self._client.endpoints)
        for attempt in range(members):
            try:
                answer = getattr(getattr(self._client, stub), method)(request, self._timeout)
                self._failures.answered = True
                return answer
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.NOT_FOUND:
                    raise LeaseGone(f"etcd: {exc.details()}") from None
                refusal = self._failures.refusal(exc)
                if refusal is not None and not (members > 1 and attempt + 1 < members
                                                and self._failures.handshake(exc)):
                    raise refusal from None
                if self._failures.is_answer(code):      # an answer: no failover
                    details = (exc.details() or "").removeprefix("etcdserver: ")
                    raise StoreRefused(f"etcd at {self.endpoints} refused: {details}") from None
                if members > 1:
                    self._failover()
                    if attempt + 1 < members and (read or self._failures.unsent(exc)):
                        continue
                raise self._failures.unavailable(exc) from None
            except (etcd_exceptions.Etcd3Exception, ValueError) as exc:
                raise self._failures.unavailable(exc) from None

    def _failover(self) -> None:
        """Leave the member in use for the next one that has not failed."""
        with self._failover_lock:
            endpoint = self._client.endpoint_in_use
            if endpoint is not None and not endpoint.is_failed():
                endpoint.fail()
                self._client._clear_old_stubs()

    def _range_request(self, key: str, prefix: bool, keys_only=False,
                       revision: int = 0, limit: int = 0):
        full = self._full(key)
        request = etcdrpc.RangeRequest(key=full, keys_only=keys_only,
                                       revision=revision, limit=limit)
        if prefix:
            request.range_end = etcd_utils.prefix_range_end(full)
        return request

    # -- reads -------------------------------------------------------------

    def get(self, key: str) -> KV | None:
        response = self._call("kvstub", "Range", self._range_request(key, False))
        return self._kv(response.kvs[0]) if response.kvs else None

    PAGE = 5000         # keys per range call: a page stays far below gRPC's message limit

    def range(self, prefix: str, keys_only: bool = False,
              revision: int = 0) -> tuple[list[KV], int]:
        """All keys under ``prefix`` and the revision of the read: read in
        pages of :attr:`PAGE` keys, all at the first page's revision (one
        consistent snapshot, however many keys)."""
        request = self._range_request(prefix, True, keys_only, revision, self.PAGE)
        kvs = []
        while True:
            response = self._call("kvstub", "Range", request)
            kvs.extend(self._kv(kv) for kv in response.kvs)
            if not response.more or not response.kvs:
                return kvs, request.revision or response.header.revision
            request.revision = request.revision or response.header.revision
            request.key = response.kvs[-1].key + b"\0"

    def has_history_from(self, revision: int) -> bool:
        """Whether etcd can still answer as of ``revision``: not compacted
        away, not in the future."""
        try:
            self._call("kvstub", "Range", self._range_request("", False, True, revision))
        except StoreRefused as exc:
            if "compacted" in str(exc) or "future revision" in str(exc):
                return False
            raise
        return True

    def changed_since(self, prefix: str, revision: int) -> tuple[list[KV], int, int]:
        """The keys under ``prefix`` modified at or after ``revision``, how
        many keys there are under ``prefix`` now, and the revision of this
        one read: a cache of the prefix is brought up to date by decoding
        only what changed (a count below what it holds means deletions).

        One range: etcd counts the keys of a range before it drops those
        modified before ``min_mod_revision`` (tests/test_placement_view.py
        holds it to that)."""
        request = self._range_request(prefix, True)
        request.min_mod_revision = revision
        response = self._call("kvstub", "Range", request)
        return [self._kv(kv) for kv in response.kvs], response.count, response.header.revision

    def revision(self) -> int:
        response = self._call("kvstub", "Range", self._range_request("", False, True, 0, 1))
        return response.header.revision

    # -- writes ------------------------------------------------------------

    def put(self, key: str, value: Any, lease: int = 0) -> int:
        request = etcdrpc.PutRequest(key=self._full(key), value=_encode(value),
                                     lease=lease)
        return self._call("kvstub", "Put", request).header.revision

    def delete(self, key: str, prefix: bool = False) -> int:
        return self.txn([], [Delete(key, prefix)]).revision

    def _op(self, op) -> etcdrpc.RequestOp:
        if isinstance(op, Put):
            return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(
                key=self._full(op.key), value=_encode(op.value), lease=op.lease))
        if isinstance(op, Delete):
            full = self._full(op.key)
            request = etcdrpc.DeleteRangeRequest(key=full)
            if op.prefix:
                request.range_end = etcd_utils.prefix_range_end(full)
            return etcdrpc.RequestOp(request_delete_range=request)
        if isinstance(op, Get):
            request = self._range_request(op.key, op.prefix)
            request.min_mod_revision = op.since
            return etcdrpc.RequestOp(request_range=request)
        raise TypeError(f"not a transaction operation: {op!r}")

    def _compare(self, compare: Compare) -> etcdrpc.Compare:
        message = etcdrpc.Compare(key=self._full(compare.key), result=_OPS[compare.op])
        if compare.range_end is not None:
            message.range_end = self._full(compare.range_end)
        if compare.target == "version":
            message.target = etcdrpc.Compare.VERSION
            message.version = compare.operand
        elif compare.target == "create":
            message.target = etcdrpc.Compare.CREATE
            message.create_revision = compare.operand
        elif compare.target == "mod":
            message.target = etcdrpc.Compare.MOD
            message.mod_revision = compare.operand
        elif compare.target == "value":
            message.target = etcdrpc.Compare.VALUE
            message.value = _encode(compare.operand)
        elif compare.target == "lease":
            message.target = etcdrpc.Compare.LEASE
            message.lease = compare.operand
        else:
            raise ValueError(compare.target)
        return message

    def txn(self, compares: Iterable[Compare], success: Iterable = (),
            failure: Iterable = ()) -> TxnResult:
        request = etcdrpc.TxnRequest(
            compare=[self._compare(c) for c in compares],
            success=[self._op(op) for op in success],
            failure=[self._op(op) for op in failure])
        read = all(isinstance(op, Get) for op in (*success, *failure))
        response = self._call("kvstub", "Txn", request, read=read)
        answers = [r.response_range for r in response.responses
                   if r.WhichOneof("response") == "response_range"]
        return TxnResult(response.succeeded, response.header.revision,
                         [[self._kv(kv) for kv in r.kvs] for r in answers],
                         [r.count for r in answers])

    def txn_once(self, compares: Iterable[Compare], success: Iterable, proof: str,
                 within: float | None = None) -> bool:
        """A guarded write that survives losing its reply: True once it is
        written, False when its guard fails and no attempt of this call wrote it.

        A member that dies with the transaction in flight (or an election
        that outlasts the deadline) leaves its outcome unknown.  The write is
        then tried again, for ``within`` seconds (twice the timeout by
        default).  Whenever the guard fails, the key ``proof``, put by
        ``success`` with a value unique to this call, tells whether an
        attempt of this call wrote it: a lost reply may also hide behind a
        failover that judged the write unsent and sent it to another member
        (:meth:`_call`).  Raises StoreUnavailable when etcd stays
        unreachable."""
        success, compares = list(success), list(compares)
        (mine,) = [_decode(_encode(op.value)) for op in success
                   if isinstance(op, Put) and op.key == proof]
        deadline = time.monotonic() + (2 * self._timeout if within is None else within)
        while True:
            try:
                if self.txn(compares, success).succeeded:
                    return True
                kv = self.get(proof)
                return kv is not None and kv.value == mine
            except LeaseGone:
                raise
            except StoreUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def create(self, key: str, value: Any, lease: int = 0) -> bool:
        """Create-if-absent; True when this call created the key."""
        return self.txn([absent(key)], [Put(key, value, lease)]).succeeded

    # -- leases ------------------------------------------------------------

    def grant(self, ttl: int) -> int:
        request = etcdrpc.LeaseGrantRequest(TTL=int(ttl), ID=0)
        return self._call("leasestub", "LeaseGrant", request).ID

    def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; returns its TTL, 0 or less when it has expired."""
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease)
        try:
            for response in self._call("leasestub", "LeaseKeepAlive", iter([request])):
                return response.TTL
        except grpc.RpcError as exc:
            raise (self._failures.refusal(exc) or self._failures.unavailable(exc)) from None
        return 0

    def keepalive_stream(self, lease: int):
        """``lease`` renewed on one stream kept open between renewals
        (:class:`engine.core.lease_stream.KeepAliveStream`): a session's."""
        from .lease_stream import KeepAliveStream
        return KeepAliveStream(self, lease)

    def revoke(self, lease: int) -> None:
        try:
            self._call("leasestub", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease))
        except LeaseGone:
            pass    # already gone

    def lease_alive(self, lease: int) -> bool:
        return self.lease_ttl(lease) > 0

    def lease_ttl(self, lease: int) -> int:
        """The seconds ``lease`` has left; 0 or less once it has ended."""
        return self._call("leasestub", "LeaseTimeToLive",
                          etcdrpc.LeaseTimeToLiveRequest(ID=lease)).TTL

    def compact(self, revision: int) -> None:
        """Drop history before ``revision`` (the whole etcd, not just this cluster)."""
        self._call("kvstub", "Compact", etcdrpc.CompactionRequest(revision=revision, physical=True))

    # -- maintenance ---------------------------------------------------------

    def status(self) -> dict:
        """The answering member's ``{db_size, leader, member, version,
        revision}`` and the cluster's active ``alarms`` (``["NOSPACE"]``)."""
        status = self._call("maintenancestub", "Status", etcdrpc.StatusRequest())
        alarms = self._call("maintenancestub", "Alarm", etcdrpc.AlarmRequest(
            action=etcdrpc.AlarmRequest.GET, memberID=0, alarm=etcdrpc.NONE), read=True)
        names = {value: name for name, value in etcdrpc.AlarmType.items()}
        return {"db_size": status.dbSize, "leader": status.leader,
                "member": status.header.member_id, "version": status.version,
                "revision": status.header.revision,
                "alarms": sorted({names.get(a.alarm, str(a.alarm)) for a in alarms.alarms
                                  if a.alarm != etcdrpc.NONE})}

    def members(self) -> list[dict]:
        """etcd's members as the answering one knows them: ``[{id, name,
        client_urls, peer_urls}]`` (a member added but not started yet has
        no name and no client URL)."""
        answer = self._call("clusterstub", "MemberList", etcdrpc.MemberListRequest(), read=True)
        return [{"id": m.ID, "name": m.name, "client_urls": list(m.clientURLs),
                 "peer_urls": list(m.peerURLs)} for m in answer.members]

    def snapshot(self, out, timeout: float = 600.0, on_chunk=None) -> dict:
        """etcd's whole backend (as ``etcdctl snapshot save``; root only)
        streamed into the binary file ``out``: ``{bytes, revision}`` (the
        revision just before it began: it holds that one or a later one).  A
        stream short of, or not matching, its closing SHA-256 raises
        :class:`StoreUnavailable`.  ``on_chunk(n)``: after each piece, bytes so far."""
        digest, tail, written = hashlib.sha256(), b"", 0
        revision = self.revision()
        try:
            stream = self._client.maintenancestub.Snapshot(etcdrpc.SnapshotRequest(), timeout)
            for piece in stream:
                out.write(piece.blob)
                written += len(piece.blob)
                # all but the last 32 bytes are the data, those the sum of it
                tail += piece.blob
                digest.update(tail[:-_SHA256])
                tail = tail[-_SHA256:]
                if on_chunk is not None:
                    on_chunk(written)
        except grpc.RpcError as exc:
            raise (self._failures.refusal(exc) or self._failures.unavailable(exc)) from None
        except (etcd_exceptions.Etcd3Exception, ValueError) as exc:
            raise self._failures.unavailable(exc) from None
        if len(tail) < _SHA256 or digest.digest() != tail:
            raise StoreUnavailable(f"etcd at {self.endpoints} sent a snapshot whose checksum "
                                   f"does not match ({written} bytes): take it again")
        return {"bytes": written, "revision": revision}

    def auth_setup(self, users: dict[str, str], roles: dict[str, list],
                   password: Callable[[], str]) -> None:
        """etcd's RBAC: ``roles`` ({role: [(perm, key, range_end)]}) granted,
        ``users`` ({user: role}) made with ``password()`` and granted,
        authentication enabled.  What already exists is kept."""
        auth = etcdrpc.auth_pb2
        permissions = {"READ": auth.Permission.READ, "WRITE": auth.Permission.WRITE,
                       "READWRITE": auth.Permission.READWRITE}

        def tolerate(method, request, *already):
            try:
                self._call("authstub", method, request)
            except StoreRefused as exc:
                if not any(text in str(exc) for text in already):
                    raise
        for role, grants in roles.items():
            tolerate("RoleAdd", etcdrpc.AuthRoleAddRequest(name=role), "already exists")
            for perm, key, range_end in grants:
                self._call("authstub", "RoleGrantPermission",
                           etcdrpc.AuthRoleGrantPermissionRequest(name=role, perm=auth.Permission(
                               permType=permissions[perm], key=key, range_end=range_end)))
        for user, role in users.items():
            tolerate("UserAdd", etcdrpc.AuthUserAddRequest(name=user, password=password()),
                     "already exists")
            self._call("authstub", "UserGrantRole",
                       etcdrpc.AuthUserGrantRoleRequest(user=user, role=role))
        self._call("authstub", "AuthEnable", etcdrpc.AuthEnableRequest())

    def auth_user_delete(self, user: str, *, dry_run: bool = False) -> bool:
        """Delete etcd user ``user`` (``dry_run``: look only); False: none (needs root)."""
        for method in ("UserGet",) if dry_run else ("UserGet", "UserDelete"):
            request = getattr(etcdrpc, f"Auth{method}Request")(name=user)
            try:
                getattr(self._client.authstub, method)(request, self._timeout)
            except grpc.RpcError as exc:
                if "user name not found" in (exc.details() or ""):  # that user's, not ours
                    return False
                raise (self._failures.refusal(exc) or self._failures.unavailable(exc)) from None
        return True

    # -- watches -----------------------------------------------------------

    def watch(self, prefix: str, start_revision: int,
              callback: Callable[[list[Event] | Exception, int], None],
              exact: bool = False, puts_only: bool = False) -> Callable[[], None]:
        """Watch ``prefix`` from ``start_revision``.

        ``callback(events, header_revision)`` runs on the client's watch
        thread: keep it short.  A broken stream calls ``callback(error, 0)``
        once with :class:`WatchBroken` or :class:`Compacted`.  ``exact``
        watches the one key ``prefix`` names; ``puts_only``: etcd sends no
        delete events.  Returns cancel.
        """
        filters = [etcdrpc.WatchCreateRequest.NODELETE] if puts_only else None
        full = self._full(prefix)
        broken = threading.Event()

        def on_response(response):
            if broken.is_set():
                return
            if isinstance(response, etcd_exceptions.RevisionCompactedError):
                broken.set()
                callback(Compacted(response.compacted_revision), 0)
            elif isinstance(response, BaseException) or response is None:
                broken.set()
                self._watch_broke = member
                callback(WatchBroken(str(response)), 0)
            else:
                events = [Event("put" if isinstance(e, pyetcd.events.PutEvent) else "delete",
                                self._kv(e._event.kv)) for e in response.events]
                callback(events, response.header.revision)

        with self._watch_lock:
            member = self._watch_member()
            try:
                if exact:
                    watch_id = self._client.add_watch_callback(
                        full, on_response, start_revision=start_revision, filters=filters)
                else:
                    watch_id = self._client.add_watch_prefix_callback(
                        full, on_response, start_revision=start_revision, filters=filters)
            except etcd_exceptions.RevisionCompactedError as exc:
                raise Compacted(exc.compacted_revision) from None
            except grpc.RpcError as exc:
                refusal = self._failures.refusal(exc)
                if refusal is not None:
                    raise refusal from None
                if len(self._client.endpoints) > 1:
                    self._failover()
                raise self._failures.unavailable(exc) from None
            except (etcd_exceptions.Etcd3Exception, ValueError) as exc:
                raise self._failures.unavailable(exc) from None

        def cancel():
            broken.set()
            try:
                self._client.cancel_watch(watch_id)
            except Exception:   # the stream may already be gone
                pass
        return cancel

    def _watch_member(self):
        """The member a new watch goes to (under ``_watch_lock``): another
        one when the last watch broke on the current one."""
        if len(self._client.endpoints) > 1 and self._watch_broke is not None \
                and self._watch_broke == self._client._current_endpoint_label:
            self._failover()        # watch from another member
        self._watch_broke = None
        return self._client._current_endpoint_label

    def watch_stream(self, prefix: str, start_revision: int, exact: bool = False,
                     puts_only: bool = False) -> "WatchStream":
        """Watch ``prefix`` from ``start_revision`` on a gRPC call of its
        own, read on the thread that iterates it: each etcd message's events
        (a list, in revision order) reach that thread straight from gRPC,
        where :meth:`watch` passes them through two client threads first.
        See :class:`WatchStream` for how it ends."""
        filters = [etcdrpc.WatchCreateRequest.NODELETE] if puts_only else []
        full = self._full(prefix)
        request = etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=full, range_end=b"" if exact else etcd_utils.prefix_range_end(full),
            start_revision=start_revision, filters=filters))
        with self._watch_lock:
            member = self._watch_member()
            try:
                channel = self._client.channel
            except (etcd_exceptions.Etcd3Exception, ValueError) as exc:
                raise self._failures.unavailable(exc) from None
        # Sent whole (create, then half-close): etcd keeps the stream open.
        call = channel.unary_stream(_WATCH,
                                    request_serializer=etcdrpc.WatchRequest.SerializeToString,
                                    response_deserializer=etcdrpc.WatchResponse.FromString)
        return WatchStream(self, call(request, metadata=self._client.metadata), member)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:
            pass


class WatchStream:
    """One watch's events, read by whoever iterates it (one thread at a
    time).  It ends only by raising: :class:`Compacted` when the start
    revision is gone; :class:`WatchBroken` when the stream breaks (etcd
    restarted, the member left) or :meth:`cancel` was called, from any
    thread; a refusal of this identity (:class:`PermissionDenied`) as any
    call would."""

    def __init__(self, store: Store, call, member):
        self._store = store
        self._call = call
        self._member = member
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __iter__(self):
        kv = self._store._kv
        try:
            for response in self._call:
                if response.compact_revision:
                    raise Compacted(response.compact_revision)
                if response.canceled:
                    raise WatchBroken(f"etcd canceled the watch: {response.cancel_reason}")
                if response.events:
                    yield [Event("delete" if event.type == _DELETE else "put", kv(event.kv))
                           for event in response.events]
        except grpc.RpcError as exc:
            if self._cancelled:
                raise WatchBroken("watch canceled") from None
            refusal = self._store._failures.refusal(exc)
            if refusal is not None:
                raise refusal from None
            self._store._watch_broke = self._member     # gone, maybe: watch elsewhere next
            raise WatchBroken(self._store._failures.why(exc)) from None
        raise WatchBroken("etcd ended the watch stream")
