"""One disk of a pull-mode backup, copied from its NBD export into a qcow2
file of this host, checksummed as it passes: the data is read once, over
the network, and written once.

:func:`pull` connects to the export (``(address, port)``, export name) a
libvirt pull-mode backup job serves on the VM's host, and serves the
destination file itself with a ``qemu-nbd`` of its own on a UNIX socket
(QEMU writes the qcow2 format; no other tool is needed).  It asks the
export's block status first, then copies:

- a **full** backup (no ``bitmap``): every extent that is not known zero
  (``base:allocation``); zeros and holes are not sent, and the fresh
  destination reads them as zeros;
- an **incremental** one (``bitmap``: the export's
  ``qemu:dirty-bitmap:NAME``): only the dirty extents, their zeros written
  as zeros (``NBD_CMD_WRITE_ZEROES``: the qcow2 file marks them, no data
  crosses); what is clean stays unallocated, so that the increment holds
  exactly the changed clusters (:func:`engine.hypervisor.storage.qcow2.apply_increment`).

The checksum (:class:`~engine.hypervisor.storage.checksum.ContentHash`) is
of the destination's *content* as a reader of its virtual disk sees it
(what ``qemu-img convert -O raw`` of it gives: what was skipped reads as
zeros): read data is hashed as it is written, what was skipped or zeroed
counts as holes; a thread of its own hashes while the next reads land and
the last ones are written.  :func:`content_checksum` computes the same value from a
qcow2 file, by reading its data extents, for whoever must check the file
later (a restore).

Writes are flushed (``NBD_CMD_FLUSH``: durable) before :func:`pull`
returns.  A pull that fails or is stopped leaves the file as it was
written so far: its caller deletes it.
"""
from __future__ import annotations

import contextlib
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque

from engine.errors import RequestError
from engine.hypervisor.storage import nbd
from engine.hypervisor.storage.checksum import ContentHash

__all__ = ["pull", "content_checksum", "dirty_context", "sweep_sockets", "Interrupted"]

CHUNK = 4 << 20             # bytes per read request
DEPTH = 4                   # read requests in flight
START_TIMEOUT = 30.0
EXIT_TIMEOUT = 60.0
SOCKETS = "peerctl-nbd-"     # + the peer's pid: the directories of qemu-nbd's sockets


class Interrupted(RequestError):
    """The pull was asked to stop (an abort)."""


def sweep_sockets() -> list[str]:
    """The socket directories of :func:`served` whose peer died before it
    could remove them (``peerctl-nbd-<pid>-*``, that pid gone), removed."""
    removed = []
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        if not name.startswith(SOCKETS):
            continue
        pid = name[len(SOCKETS):].split("-", 1)[0]
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(name)
    return removed


def dirty_context(bitmap: str) -> str:
    return f"qemu:dirty-bitmap:{bitmap}"


@contextlib.contextmanager
def served(path: str, fmt: str = "qcow2", read_only: bool = False):
    """A ``qemu-nbd`` serving ``path`` on a UNIX socket of its own, for one
    client; yields the socket's path; the server is gone after."""
    directory = tempfile.mkdtemp(prefix=f"{SOCKETS}{os.getpid()}-")
    socket_path = os.path.join(directory, "s")
    # setpriv: SIGKILLed when the peer's thread that started it dies (no
    # preexec_fn: a fork of the threaded peer must exec at once)
    command = ["setpriv", "--pdeathsig", "KILL", "qemu-nbd", "-f", fmt, "--cache=writeback",
               "--aio=threads", "-k", socket_path, *(["-r"] if read_only else []), path]
    try:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise RequestError(f"qemu-nbd: {exc}") from None
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(socket_path):
            if server.poll() is not None or time.monotonic() > deadline:
                why = server.stderr.read().decode(errors="replace").strip().splitlines()
                raise RequestError(f"qemu-nbd could not serve {path}: "
                                   f"{why[-1] if why else 'it did not start'}")
            time.sleep(0.002)
        yield socket_path
        try:
            server.wait(EXIT_TIMEOUT)       # it ends when its one client leaves
        except subprocess.TimeoutExpired:
            pass
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stderr.close()
        shutil.rmtree(directory, ignore_errors=True)


def _plan(source: nbd.Client, bitmap: str | None):
    """``[(offset, length, what)]`` over the whole disk, in order; what:
    ``data`` (read and write), ``zero`` (write zeros), ``skip``."""
    allocation = source.extents(nbd.ALLOCATION, 0, source.size)
    if bitmap is None:
        return [(offset, length, "skip" if flags & nbd.STATE_ZERO else "data")
                for offset, length, flags in allocation]
    dirty = source.extents(dirty_context(bitmap), 0, source.size)
    plan, i, j, at = [], 0, 0, 0
    while i < len(allocation) and j < len(dirty):
        a_off, a_len, a_flags = allocation[i]
        d_off, d_len, d_flags = dirty[j]
        end = min(a_off + a_len, d_off + d_len)
        if not d_flags & nbd.STATE_DIRTY:
            what = "skip"
        else:
            what = "zero" if a_flags & nbd.STATE_ZERO else "data"
        if plan and plan[-1][2] == what and plan[-1][0] + plan[-1][1] == at:
            plan[-1] = (plan[-1][0], plan[-1][1] + end - at, what)
        else:
            plan.append((at, end - at, what))
        at = end
        if end == a_off + a_len:
            i += 1
        if end == d_off + d_len:
            j += 1
    return plan


def _chunks(plan):
    for offset, length, what in plan:
        if what != "data":
            yield offset, length, what
            continue
        for at in range(offset, offset + length, CHUNK):
            yield at, min(CHUNK, offset + length - at), what


def pull(address, export: str, bitmap: str | None, destination: str,
         tick=lambda done, total: None, stop=lambda: False) -> tuple[int, str]:
    """Export ``export`` at ``address`` into the qcow2 file ``destination``
    (made already, of the export's size).  ``(bytes of data sent, checksum)``."""
    contexts = (nbd.ALLOCATION,) + ((dirty_context(bitmap),) if bitmap else ())
    try:
        source = nbd.connect(address, export, contexts)
    except nbd.NbdError as exc:
        raise RequestError(f"backup export {export!r}: {exc}") from None
    try:
        with served(destination) as socket_path:
            target = nbd.connect(socket_path, refused_for=START_TIMEOUT)
            try:
                if target.size < source.size:
                    raise RequestError(f"{destination} holds {target.size} bytes, the "
                                       f"export {source.size}")
                sent, checksum = _copy(source, target, bitmap, tick, stop)
                target.flush()
            finally:
                target.close()
    except nbd.NbdError as exc:
        raise RequestError(f"backup export {export!r}: {exc}") from None
    finally:
        source.close()
    return sent, checksum


class _Hashing:
    """The checksum computed beside the copy, by a thread of its own (the
    hash releases the GIL): pieces are hashed in the order given, and each
    data buffer is handed back once hashed."""

    def __init__(self, buffers: int):
        self.hasher = ContentHash()
        self.free: queue.Queue = queue.Queue()
        self.unmade = buffers           # made when first needed: a small copy needs few
        self.todo: queue.Queue = queue.Queue()
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="nbd-hash", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            piece = self.todo.get()
            if piece is None:
                return
            buffer, view, hole = piece
            try:
                if view is None:
                    self.hasher.hole(hole)
                else:
                    self.hasher.data(view)
            except BaseException as exc:       # noqa: BLE001  (given to the copy)
                self.failed = exc
            if buffer is not None:
                self.free.put(buffer)

    def buffer(self) -> bytearray:
        """A free buffer; waits while the hash is behind."""
        if self.unmade and self.free.empty():
            self.unmade -= 1
            return bytearray(CHUNK)
        return self.free.get()

    def data(self, buffer, view) -> None:
        self.todo.put((buffer, view, 0))

    def hole(self, length: int) -> None:
        self.todo.put((None, None, length))

    def close(self) -> None:
        self.todo.put(None)
        self.thread.join()
        if self.failed is not None:
            raise self.failed


def _copy(source, target, bitmap, tick, stop) -> tuple[int, str]:
    """Reads kept in flight (DEPTH), each written as it lands, and hashed by
    :class:`_Hashing` meanwhile."""
    plan = _plan(source, bitmap)
    total = sum(length for _, length, what in plan if what == "data")
    hashing = _Hashing(2 * DEPTH)
    in_flight: deque = deque()
    chunks = _chunks(plan)
    done = 0

    def send_next() -> None:
        for offset, length, what in chunks:
            if what == "data":
                buffer = hashing.buffer()
                view = memoryview(buffer)[:length]
                in_flight.append((source.send_read(offset, view), offset, length,
                                  (buffer, view)))
            else:
                in_flight.append((None, offset, length, what))
            return

    try:
        for _ in range(DEPTH):
            send_next()
        while in_flight:
            if stop():
                raise Interrupted("stopped: asked to abort")
            cookie, offset, length, landing = in_flight.popleft()
            if cookie is None:
                hashing.hole(length)
                if landing == "zero":
                    for at in range(offset, offset + length, 1 << 30):
                        target.write_zeroes(at, min(1 << 30, offset + length - at))
            else:
                buffer, view = landing
                source.finish_read(cookie)
                target.write(offset, view)
                hashing.data(buffer, view)
                done += length
                tick(done, total)
            send_next()
    finally:
        hashing.close()
    return hashing.hasher.data_bytes, hashing.hasher.hexdigest()


def content_checksum(path: str, fmt: str = "qcow2", stop=lambda: False) -> tuple[str, int]:
    """The checksum :func:`pull` gives, of the qcow2 file ``path``'s content
    (its data extents read, the rest counted as holes), and the bytes read."""
    with served(path, fmt, read_only=True) as socket_path:
        try:
            client = nbd.connect(socket_path, "", (nbd.ALLOCATION,),
                                 refused_for=START_TIMEOUT)
        except nbd.NbdError as exc:
            raise RequestError(f"reading {path}: {exc}") from None
        try:
            hasher, buffer = ContentHash(), bytearray(CHUNK)
            for offset, length, what in _chunks(_plan(client, None)):
                if stop():
                    raise Interrupted("stopped: asked to abort")
                if what != "data":
                    hasher.hole(length)
                    continue
                view = memoryview(buffer)[:length]
                client.read_into(offset, view)
                hasher.data(view)
        except nbd.NbdError as exc:
            raise RequestError(f"reading {path}: {exc}") from None
        finally:
            client.close()
    return hasher.hexdigest(), hasher.data_bytes
