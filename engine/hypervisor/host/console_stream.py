"""An attached console's libvirt stream, pumped to and from an asyncio
loop: what the API's console websocket (:mod:`engine.web.console`) reads
and writes, so that libvirt's streams stay in the hypervisor room.

Promises: every stream call is made on libvirt's event loop thread;
:attr:`StreamPump.output` gets the guest's bytes in order, then None once
the stream has ended; :meth:`StreamPump.send` waits while more than
``BACKLOG`` bytes wait for the guest; :meth:`StreamPump.close` lets the
stream and its connection go."""
from __future__ import annotations

import asyncio
import threading
import time

import libvirt

__all__ = ["StreamPump", "why_ended", "STOPPED", "CHUNK", "BACKLOG", "SETTLE"]

STOPPED = "console closed: the VM stopped"
CHUNK = 65536                   # bytes read from the stream at once
BACKLOG = 1 << 20               # bytes waiting on either side before it pauses or ends
SETTLE = 3.0                    # seconds for libvirt to see a stopped guest stopped


def why_ended(attached, settle: float = SETTLE) -> tuple[str, str]:
    """Why an attached console's stream ended: ``("stopped", line)`` when
    the guest stopped (libvirt may take up to ``settle`` seconds to see
    QEMU gone), ``("lost", line)`` when its host's libvirt was lost, or
    ``("taken", line)`` when the guest still runs (another client took the
    console over).  Blocks."""
    deadline = time.monotonic() + settle
    while True:
        try:
            if not attached.dom.isActive():
                return "stopped", STOPPED
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return "stopped", STOPPED
            return "lost", f"lost {attached.host}'s libvirt at {attached.uri}"
        if time.monotonic() >= deadline:
            return "taken", (f"the console of VM {attached.name} on {attached.host} closed "
                             "while the VM runs (another client may have taken it over)")
        time.sleep(0.1)


class StreamPump:
    """Bytes between an attached console's stream and the asyncio loop,
    every stream call made on libvirt's event loop thread: ``output`` gets
    the guest's bytes, then None once the stream has ended."""

    def __init__(self, attached, loop: asyncio.AbstractEventLoop):
        self.libvirt = libvirt
        self.attached, self.stream, self.loop = attached, attached.stream, loop
        self.output: asyncio.Queue = asyncio.Queue()
        self.queued = 0                 # bytes in ``output`` (the loop's side counts)
        self._lock = threading.Lock()
        self._pending = b""             # typed bytes the stream did not take yet
        self._drained = asyncio.Event()
        self._drained.set()
        self._ended = False

    def start(self) -> None:
        self.stream.eventAddCallback(self._events(), self._on_stream, None)

    async def send(self, data: bytes) -> None:
        """Queue ``data`` for the guest; wait while too much already waits."""
        await self._drained.wait()
        with self._lock:
            self._pending += data
            if len(self._pending) > BACKLOG:
                self._drained.clear()
        self._on_libvirt_thread(self._write)

    def sent(self, size: int) -> None:
        self.queued -= size

    def close(self) -> None:
        """Let the console go (blocking): the stream on libvirt's thread,
        then the connection."""
        done = threading.Event()

        def stop():
            self._ended = True
            for call in (self.stream.eventRemoveCallback, self.stream.abort):
                try:
                    call()
                except self.libvirt.libvirtError:
                    pass
            done.set()
        self._on_libvirt_thread(stop)
        done.wait(5.0)
        try:
            self.attached.conn.close()
        except self.libvirt.libvirtError:
            pass

    # -- libvirt's event loop thread -----------------------------------------------

    def _on_libvirt_thread(self, call) -> None:
        def once(timer, _opaque):
            self.libvirt.virEventRemoveTimeout(timer)
            call()
        self.libvirt.virEventAddTimeout(0, once, None)

    def _events(self) -> int:
        lv = self.libvirt
        events = (lv.VIR_STREAM_EVENT_READABLE | lv.VIR_STREAM_EVENT_ERROR
                  | lv.VIR_STREAM_EVENT_HANGUP)
        return events | (lv.VIR_STREAM_EVENT_WRITABLE if self._pending else 0)

    def _on_stream(self, _stream, events, _opaque) -> None:
        lv = self.libvirt
        if self._ended:
            return
        try:
            if events & lv.VIR_STREAM_EVENT_READABLE and not self._read():
                return
            if events & lv.VIR_STREAM_EVENT_WRITABLE:
                self._write()
            if events & (lv.VIR_STREAM_EVENT_ERROR | lv.VIR_STREAM_EVENT_HANGUP):
                self._read()
                self._end()
        except lv.libvirtError:
            self._end()

    def _read(self) -> bool:
        """Hand over what the guest sent; False once the stream ended."""
        while True:
            data = self.stream.recv(CHUNK)
            if isinstance(data, int):       # -2: nothing more for now
                return True
            if not data:
                self._end()
                return False
            self._deliver(bytes(data))

    def _write(self) -> None:
        if self._ended:
            return
        try:
            with self._lock:
                while self._pending:
                    sent = self.stream.send(self._pending)
                    if sent == -2:          # full for now: WRITABLE says when
                        break
                    self._pending = self._pending[sent:]
                drained = len(self._pending) <= BACKLOG
            self.stream.eventUpdateCallback(self._events())
        except self.libvirt.libvirtError:
            self._end()
            return
        if drained:
            self._call_soon(self._drained.set)

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._deliver(None)

    def _deliver(self, data: bytes | None) -> None:
        def put():
            self.queued += len(data or b"")
            self.output.put_nowait(data)
        self._call_soon(put)

    def _call_soon(self, call) -> None:
        try:
            self.loop.call_soon_threadsafe(call)
        except RuntimeError:            # the server's loop is gone: nobody listens
            pass
