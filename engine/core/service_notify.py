"""systemd's notify protocol (sd_notify(3)), spoken here and nowhere else.

A service of ``Type=notify`` tells its manager how it is doing by sending
datagrams of ``KEY=value`` lines to the AF_UNIX socket named in
``$NOTIFY_SOCKET`` (a path, or an abstract name written ``@name``).  What
this module promises:

- without ``$NOTIFY_SOCKET`` (a peer started by hand, by ``up``, by a test
  that did not ask) every call does nothing and costs nothing;
- a send never raises: a manager that went away, a full socket buffer or a
  bad address costs the message, never the caller (``False`` says so);
- :func:`watchdog` pings at most every half of ``$WATCHDOG_USEC`` (what
  systemd asks), and only from the process the ping is meant for:
  ``$WATCHDOG_PID`` unset or ours.  A process that makes itself the main
  one (:func:`main_pid`) takes the watchdog over.

The peer uses it for ``READY=1`` once its host serves, ``STATUS=`` lines an
administrator reads in ``systemctl status``, ``WATCHDOG=1`` from its main
loop, ``STOPPING=1`` on SIGTERM and ``MAINPID=`` when an upgrade hands the
host to a new process (docs/install.md, Units).  No dependency: the
protocol is one ``sendto``.
"""
from __future__ import annotations

import os
import socket
import threading
import time

__all__ = ["notify", "ready", "status", "stopping", "main_pid", "watchdog",
           "watchdog_interval", "enabled", "child_environ"]

NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"

_lock = threading.Lock()
_last_ping = [0.0]      # monotonic time of the last WATCHDOG=1 sent


def enabled() -> bool:
    """A service manager listens (``$NOTIFY_SOCKET`` is set)."""
    return bool(os.environ.get(NOTIFY_SOCKET))


def _address(name: str) -> str:
    # "@name" is Linux's abstract namespace, spelt with a leading NUL
    return "\0" + name[1:] if name.startswith("@") else name


def notify(*lines: str) -> bool:
    """Send ``lines`` (``KEY=value`` each) as one message; whether it went."""
    name = os.environ.get(NOTIFY_SOCKET)
    if not name or not lines:
        return False
    message = "\n".join(line.replace("\n", " ") for line in lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, _address(name))
        return True
    except (OSError, ValueError):
        return False


def _status(text: str | None) -> list[str]:
    return [f"STATUS={text}"] if text else []


def ready(text: str | None = None) -> bool:
    """The service is up (``READY=1``), with a status line if given."""
    return notify("READY=1", *_status(text))


def status(text: str) -> bool:
    """The one line ``systemctl status`` shows for the service."""
    return notify(*_status(text))


def stopping(text: str | None = None) -> bool:
    """The service is shutting down (``STOPPING=1``)."""
    return notify("STOPPING=1", *_status(text))


def main_pid(pid: int | None = None, text: str | None = None) -> bool:
    """Make ``pid`` (this process by default) the service's main process,
    and say it is ready: what a process an upgrade started sends itself,
    so that the message comes from a process that is still there.  This
    process then owns the watchdog."""
    pid = os.getpid() if pid is None else pid
    sent = notify(f"MAINPID={pid}", "READY=1", *_status(text))
    if sent and pid == os.getpid() and os.environ.get(WATCHDOG_USEC):
        os.environ[WATCHDOG_PID] = str(pid)
    return sent


def watchdog_interval() -> float | None:
    """Seconds between two pings (half of ``$WATCHDOG_USEC``), or None when
    no watchdog is asked of this process."""
    if not enabled():
        return None
    try:
        usec = int(os.environ.get(WATCHDOG_USEC, ""))
    except ValueError:
        return None
    owner = os.environ.get(WATCHDOG_PID)
    if usec <= 0 or (owner and owner != str(os.getpid())):
        return None
    return usec / 2e6


def watchdog() -> bool:
    """Ping the watchdog (``WATCHDOG=1``) if one is asked of this process
    and half its interval has passed since the last ping; whether it was
    sent.  Cheap enough to call from every turn of a loop."""
    interval = watchdog_interval()
    if interval is None:
        return False
    now = time.monotonic()
    with _lock:
        if now - _last_ping[0] < interval:
            return False
        _last_ping[0] = now
    return notify("WATCHDOG=1")


def child_environ() -> dict:
    """This process's environment without what lets a process speak for
    the service: for a child that is not the service (the HA guard)."""
    return {k: v for k, v in os.environ.items()
            if k not in (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID)}
