"""What a host does for ``cluster verify``'s pair checks: open its migration
port to the others' probes for a while, TCP-connect to the others'
endpoints, and read its wall clock.

Promises:
- :func:`probe` connects to every target at once (one thread each, up to
  :data:`PARALLEL`), each with ``timeout`` seconds, so a host's answer takes
  about one timeout however many hosts the cluster has; each target's
  result is the target itself (``{address, port, ...}``, whatever else it
  names kept) with ``ok`` and ``error``, ``error`` in words an operator
  reads ("connection refused", "no answer within 1 s");
- :func:`listen` opens a listener on ``address:port`` that accepts and
  closes connections for ``hold`` seconds, then closes itself.  Asked again
  while open, it only lasts longer (the request is idempotent).  A port
  something else listens on (QEMU taking a migration) counts as open: the
  probes reach it all the same.  An address that is not this host's, or a
  port it may not take, is said in one line;
- :func:`clock` is this host's wall clock, plus ``$PEERCTL_TEST_CLOCK_OFFSET``
  seconds when that variable is set: a test hook, like the failpoints
  (:mod:`engine.core.failpoints`), read once, that lets a test stand a peer
  with a wrong clock beside the others; production leaves it unset.
"""
from __future__ import annotations

import concurrent.futures
import errno
import ipaddress
import os
import socket
import threading
import time

__all__ = ["probe", "listen", "clock", "CONNECT_TIMEOUT", "CLOCK_OFFSET_ENV", "PARALLEL"]

CONNECT_TIMEOUT = 1.0
PARALLEL = 64
CLOCK_OFFSET_ENV = "PEERCTL_TEST_CLOCK_OFFSET"


def _offset() -> float:
    """The test hook's seconds, read once (not a number: none)."""
    try:
        return float(os.environ.get(CLOCK_OFFSET_ENV) or 0.0)
    except ValueError:
        return 0.0


_OFFSET = _offset()
_ACCEPT_WAKE = 0.2          # how often an open listener looks at its end
_listeners: dict[tuple[str, int], float] = {}     # (address, port) -> monotonic end
_lock = threading.Lock()


def clock() -> float:
    """This host's wall clock as it reports it (see the module's promises)."""
    return time.time() + _OFFSET


def _why(exc: OSError, timeout: float) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"unknown address ({exc.strerror})"
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def _connect(target: dict, timeout: float) -> dict:
    result = dict(target, ok=True, error=None)
    try:
        with socket.create_connection((target["address"], int(target["port"])), timeout=timeout):
            pass
    except OSError as exc:
        result.update(ok=False, error=_why(exc, timeout))
    return result


def probe(targets: list[dict], timeout: float = CONNECT_TIMEOUT) -> list[dict]:
    """``[{address, port, ..., ok, error}]`` for ``targets`` (``[{address,
    port, ...}]``), in their order."""
    if not targets:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(PARALLEL, len(targets))) as pool:
        return list(pool.map(lambda target: _connect(target, timeout), targets))


def _serve(sock: socket.socket, key: tuple[str, int]) -> None:
    sock.settimeout(_ACCEPT_WAKE)
    try:
        while True:
            with _lock:
                if time.monotonic() >= _listeners[key]:
                    del _listeners[key]
                    return
            try:
                conn, _ = sock.accept()
                conn.close()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                with _lock:
                    _listeners.pop(key, None)
                return
    finally:
        sock.close()


def _bound(address: str) -> str:
    """Where to listen: the address itself when it is one (an address that
    is not this host's then says so), every address for a name (which this
    host may resolve to another address than the others do: Debian's
    ``127.0.1.1``)."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return ""
    return address


def listen(address: str, port: int, hold: float) -> str | None:
    """Keep ``address:port`` open to probes for ``hold`` seconds from now;
    None, or why it cannot be opened (one line)."""
    key = (address, int(port))
    with _lock:
        if key in _listeners:
            _listeners[key] = max(_listeners[key], time.monotonic() + hold)
            return None
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_bound(address), int(port)))
            sock.listen(16)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                return None         # something listens there: QEMU taking a migration
            return f"cannot listen on {address}:{port}: {(exc.strerror or str(exc)).lower()}"
        _listeners[key] = time.monotonic() + hold
    threading.Thread(target=_serve, args=(sock, key), daemon=True,
                     name=f"probe-listener-{port}").start()
    return None
