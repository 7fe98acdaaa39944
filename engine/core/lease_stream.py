"""A lease kept alive on one gRPC stream for as long as it answers.

etcd's ``LeaseKeepAlive`` is a stream.  Opening one per renewal, as a
one-shot keep-alive does, costs gRPC two new threads each time (its
channel spinner and its request consumer), which at a renewal every TTL/3
was most of an idle peer's CPU beside its requests.  A
:class:`KeepAliveStream` opens the stream once and sends each renewal as one
message on it.

Promises:
- :meth:`KeepAliveStream.renew` sends one keep-alive of the lease and
  returns the TTL etcd answered for it (0 or less: the lease has expired),
  as :meth:`engine.core.store.Store.keepalive` does; renewals are
  serialised, so each answer is the answer to that renewal;
- no answer within the store's timeout, a broken stream, an unreachable
  etcd: :class:`~engine.errors.StoreUnavailable` (``timed_out`` set for the
  silence); a refusal of this identity as any call raises it.  Either way
  the stream is dropped (cancelled; a late answer goes with it) and the
  next renewal opens a new one, on the next member when there are several;
- :meth:`KeepAliveStream.close` ends the stream and its reader thread.
"""
from __future__ import annotations

import queue
import threading

import grpc
from pyetcd import exceptions as etcd_exceptions
from pyetcd import etcdrpc

from engine.errors import StoreUnavailable

__all__ = ["KeepAliveStream"]

_END = object()         # ends the request iterator: gRPC half-closes the stream


class KeepAliveStream:
    def __init__(self, store, lease: int):
        self._store = store
        self.lease = lease
        self._lock = threading.Lock()
        self._stream = None     # (call, requests, answers) while open
        self.opened = 0         # streams opened so far (one while etcd answers)

    def renew(self) -> int:
        with self._lock:
            if self._stream is None:
                self._stream = self._open()
            call, requests, answers = self._stream
            requests.put(etcdrpc.LeaseKeepAliveRequest(ID=self.lease))
            try:
                answer = answers.get(timeout=self._store._timeout)
            except queue.Empty:
                self._drop(failed=True)
                silent = StoreUnavailable(f"etcd at {self._store.endpoints} unreachable "
                                          "(no answer to a lease keep-alive)")
                silent.timed_out = self._store._timeout
                raise silent from None
            if isinstance(answer, grpc.RpcError):
                self._drop(failed=True)
                failures = self._store._failures
                raise (failures.refusal(answer) or failures.unavailable(answer)) from None
            if isinstance(answer, BaseException):
                self._drop(failed=True)
                raise StoreUnavailable(f"etcd at {self._store.endpoints} unreachable "
                                       f"({answer})") from None
            self._store._failures.answered = True
            return answer.TTL

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._drop(failed=False)

    def _open(self):
        requests, answers = queue.SimpleQueue(), queue.SimpleQueue()
        client = self._store._client
        try:
            stub = client.leasestub
        except (etcd_exceptions.Etcd3Exception, ValueError) as exc:
            raise self._store._failures.unavailable(exc) from None
        call = stub.LeaseKeepAlive(iter(requests.get, _END), metadata=client.metadata)
        threading.Thread(target=_read, args=(call, answers), daemon=True,
                         name=f"lease-stream:{self.lease:x}").start()
        self.opened += 1
        return call, requests, answers

    def _drop(self, failed: bool) -> None:
        call, requests, _ = self._stream
        self._stream = None
        requests.put(_END)
        call.cancel()
        if failed and len(self._store._client.endpoints) > 1:
            self._store._failover()


def _read(call, answers) -> None:
    """The stream's answers, in order, then what ended it."""
    try:
        for response in call:
            answers.put(response)
        answers.put(ConnectionError("etcd ended the keep-alive stream"))
    except grpc.RpcError as exc:
        answers.put(exc)
    except Exception as exc:        # gRPC's own failure: the renewal says so
        answers.put(exc)
