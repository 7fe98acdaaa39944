"""A small client of the NBD protocol (https://github.com/NetworkBlockDevice/nbd,
doc/proto.md), enough to read a backup export and write a volume: no
dependency beyond the standard library.

- :func:`connect` opens ``(host, port)`` or a UNIX socket path, negotiates
  the fixed newstyle handshake, structured replies and the meta contexts
  asked for (``base:allocation``, ``qemu:dirty-bitmap:NAME``), and enters
  the export: a :class:`Client` of ``size`` bytes;
- :meth:`Client.extents` answers block status of one meta context as
  ``[(offset, length, flags)]`` over a range, in order, covering it;
- :meth:`Client.read_into` reads a range into a buffer, in order, waiting
  for nothing else: several reads may be in flight (:meth:`Client.send_read`
  / :meth:`Client.finish_read`);
- :meth:`Client.write`, :meth:`Client.write_zeroes` keep up to
  ``window`` requests in flight and check their replies as they come;
  :meth:`Client.flush` waits for every reply and then for the data to be
  durable; :meth:`Client.close` says goodbye.

Every protocol or server error raises :class:`NbdError` with the server's
message when it gave one.
"""
from __future__ import annotations

import socket
import struct
import time

__all__ = ["connect", "Client", "NbdError", "STATE_HOLE", "STATE_ZERO", "STATE_DIRTY",
           "ALLOCATION"]

ALLOCATION = "base:allocation"
STATE_HOLE, STATE_ZERO = 1, 2           # base:allocation's flags
STATE_DIRTY = 1                         # qemu:dirty-bitmap:*'s flag

_NBDMAGIC, _IHAVEOPT, _REPLY_MAGIC = b"NBDMAGIC", b"IHAVEOPT", 0x3e889045565a9
_FLAG_FIXED, _FLAG_NO_ZEROES = 1, 2
_OPT_GO, _OPT_STRUCTURED, _OPT_META = 7, 8, 10
_REP_ACK, _REP_INFO, _REP_META = 1, 3, 4
_REQUEST, _SIMPLE, _STRUCTURED = 0x25609513, 0x67446698, 0x668e33ef
_READ, _WRITE, _DISC, _FLUSH, _WRITE_ZEROES, _BLOCK_STATUS = 0, 1, 2, 3, 6, 7
_CMD_DF = 4
_DONE = 1
_CHUNK_NONE, _CHUNK_DATA, _CHUNK_HOLE, _CHUNK_STATUS = 0, 1, 2, 5
_HEADER = struct.Struct(">IHHQQI")
_MAX_STATUS = 1 << 30


class NbdError(OSError):
    """The NBD server refused, answered wrong, or went away."""


def connect(address, export: str = "", contexts: tuple[str, ...] = (),
            timeout: float | None = 60.0, refused_for: float = 0.0) -> "Client":
    """``address``: ``(host, port)`` or a UNIX socket's path; a refused
    connection is tried again for ``refused_for`` seconds (a server that
    has bound its socket but does not listen yet)."""
    deadline = time.monotonic() + refused_for
    while True:
        try:
            sock = _socket(address, timeout)
            break
        except ConnectionRefusedError as exc:
            if time.monotonic() > deadline:
                raise NbdError(f"cannot reach the NBD server at {address}: {exc}") from None
            time.sleep(0.002)
        except OSError as exc:
            raise NbdError(f"cannot reach the NBD server at {address}: {exc}") from None
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, 4 << 20)
    client = Client(sock)
    try:
        client._handshake(export, contexts)
    except BaseException:
        sock.close()
        raise
    return client


def _socket(address, timeout):
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Client:
    def __init__(self, sock):
        self.sock = sock
        # Acknowledge headers at once: a server that writes a reply in pieces
        # (QEMU's header, then payload) otherwise waits out our delayed ACK
        # (40 ms); bulk data is acknowledged as TCP likes (fewer packets)
        self.quickack = sock.family != socket.AF_UNIX and hasattr(socket, "TCP_QUICKACK")
        self.size = 0
        self.contexts: dict[str, int] = {}
        self.structured = False
        self._cookie = 0
        self._pending: dict = {}           # cookie -> what, of writes in flight
        self._reads: dict = {}             # cookie -> (offset, view) of reads in flight
        self.window = 16

    # -- the handshake -------------------------------------------------------

    def _recv(self, count: int) -> bytes:
        """A header or a small answer, acknowledged at once (``quickack``)."""
        data = bytearray(count)
        self._recv_into(memoryview(data))
        return bytes(data)

    def _recv_into(self, view: memoryview) -> None:
        while view:
            if self.quickack:       # Linux drops it after a while: asked before each read
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            try:
                got = self.sock.recv_into(view)
            except OSError as exc:
                raise NbdError(f"the NBD connection broke: {exc}") from None
            if not got:
                raise NbdError("the NBD server closed the connection")
            view = view[got:]

    def _option(self, option: int, data: bytes) -> None:
        try:
            self.sock.sendall(_IHAVEOPT + struct.pack(">II", option, len(data)) + data)
        except OSError as exc:
            raise NbdError(f"the NBD connection broke: {exc}") from None

    def _reply(self, option: int) -> tuple[int, bytes]:
        magic, echoed, kind, length = struct.unpack(">QIII", self._recv(20))
        if magic != _REPLY_MAGIC or echoed != option:
            raise NbdError("the NBD server answered an option wrong")
        data = self._recv(length)
        if kind & 0x80000000:
            raise NbdError(f"the NBD server refused option {option}: "
                           f"{data.decode(errors='replace') or hex(kind)}")
        return kind, data

    def _handshake(self, export: str, contexts) -> None:
        magic, opt, flags = struct.unpack(">8s8sH", self._recv(18))
        if magic != _NBDMAGIC or opt != _IHAVEOPT or not flags & _FLAG_FIXED:
            raise NbdError("not a fixed newstyle NBD server")
        self.sock.sendall(struct.pack(">I", _FLAG_FIXED | (flags & _FLAG_NO_ZEROES)))
        name = export.encode()
        if contexts:
            self._option(_OPT_STRUCTURED, b"")
            self._reply(_OPT_STRUCTURED)
            self.structured = True
            queries = b"".join(struct.pack(">I", len(c.encode())) + c.encode()
                               for c in contexts)
            self._option(_OPT_META, struct.pack(">I", len(name)) + name
                         + struct.pack(">I", len(contexts)) + queries)
            while True:
                kind, data = self._reply(_OPT_META)
                if kind == _REP_ACK:
                    break
                if kind == _REP_META:
                    self.contexts[data[4:].decode()] = struct.unpack(">I", data[:4])[0]
            missing = [c for c in contexts if c not in self.contexts]
            if missing:
                raise NbdError(f"the NBD export {export!r} offers no {', '.join(missing)}")
        self._option(_OPT_GO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
        while True:
            kind, data = self._reply(_OPT_GO)
            if kind == _REP_ACK:
                break
            if kind == _REP_INFO and struct.unpack(">H", data[:2])[0] == 0:
                self.size = struct.unpack(">Q", data[2:10])[0]

    # -- transmission --------------------------------------------------------

    def _send(self, command: int, offset: int, length: int, flags: int = 0,
              payload=None) -> int:
        self._cookie += 1
        header = _HEADER.pack(_REQUEST, flags, command, self._cookie, offset, length)
        try:
            self.sock.sendall(header)
            if payload is not None:
                self.sock.sendall(payload)
        except OSError as exc:
            raise NbdError(f"the NBD connection broke: {exc}") from None
        return self._cookie

    def _reply_without_data(self) -> None:
        """One reply of a command that returns no data, whichever it is
        (a server may answer in any order); its cookie leaves ``_pending``."""
        magic = struct.unpack(">I", self._recv(4))[0]
        if magic == _SIMPLE:
            error, got = struct.unpack(">IQ", self._recv(12))
            what = self._pending.pop(got, None)
            if what is None:
                raise NbdError("the NBD server answered a request never sent")
            if error:
                raise NbdError(f"{what}: the NBD server failed (error {error})")
            return
        if magic != _STRUCTURED:
            raise NbdError("the NBD server answered wrong")
        flags, kind, got, length = struct.unpack(">HHQI", self._recv(16))
        what = self._pending.get(got)
        if what is None:
            raise NbdError("the NBD server answered a request never sent")
        self._chunk_error(kind, self._recv(length), what)
        if flags & _DONE:
            del self._pending[got]

    @staticmethod
    def _chunk_error(kind: int, payload: bytes, what: str) -> None:
        if kind & 0x8000:
            error = struct.unpack(">I", payload[:4])[0]
            size = struct.unpack(">H", payload[4:6])[0]
            message = payload[6:6 + size].decode(errors="replace")
            raise NbdError(f"{what}: the NBD server failed (error {error}"
                           f"{': ' + message if message else ''})")

    def extents(self, context: str, offset: int, length: int) -> list[tuple[int, int, int]]:
        """Block status of ``context`` over ``[offset, offset + length)``."""
        context_id = self.contexts[context]
        found, at, end = [], offset, offset + length
        while at < end:
            self._drain(0)
            cookie = self._send(_BLOCK_STATUS, at, min(end - at, _MAX_STATUS))
            answered = at
            while True:
                if struct.unpack(">I", self._recv(4))[0] != _STRUCTURED:
                    raise NbdError("block status: the NBD server answered wrong")
                flags, kind, got, size = struct.unpack(">HHQI", self._recv(16))
                payload = self._recv(size)
                if got != cookie:
                    raise NbdError("block status: the NBD server answered another request")
                self._chunk_error(kind, payload, "block status")
                if kind == _CHUNK_STATUS and struct.unpack(">I", payload[:4])[0] == context_id:
                    for index in range(4, len(payload), 8):
                        extent, state = struct.unpack(">II", payload[index:index + 8])
                        extent = min(extent, end - answered)
                        if extent:
                            found.append((answered, extent, state))
                            answered += extent
                if flags & _DONE:
                    break
            if answered == at:
                raise NbdError("block status: the NBD server described nothing")
            at = answered
        return found

    def send_read(self, offset: int, view: memoryview) -> int:
        """Ask for ``len(view)`` bytes at ``offset``, to land in ``view``;
        the cookie to :meth:`finish_read` with.  A server may answer reads
        in flight in any order (QEMU's does)."""
        cookie = self._send(_READ, offset, len(view), _CMD_DF if self.structured else 0)
        self._reads[cookie] = (offset, view)
        return cookie

    def finish_read(self, cookie: int) -> None:
        """Until read ``cookie`` has landed (others may land meanwhile)."""
        while cookie in self._reads:
            self._read_reply()

    def _read_reply(self) -> None:
        magic = struct.unpack(">I", self._recv(4))[0]
        if magic == _SIMPLE:
            error, got = struct.unpack(">IQ", self._recv(12))
            offset, view = self._landing(got)
            if error:
                raise NbdError(f"read at {offset}: the NBD server failed (error {error})")
            self._recv_into(view)
            del self._reads[got]
            return
        if magic != _STRUCTURED:
            raise NbdError("read: the NBD server answered wrong")
        flags, kind, got, size = struct.unpack(">HHQI", self._recv(16))
        offset, view = self._landing(got)
        if kind == _CHUNK_DATA:
            at = struct.unpack(">Q", self._recv(8))[0] - offset
            if at < 0 or at + size - 8 > len(view):
                raise NbdError(f"read at {offset}: the NBD server sent data outside it")
            self._recv_into(view[at:at + size - 8])
        elif kind == _CHUNK_HOLE:
            at, hole = struct.unpack(">QI", self._recv(12))
            view[at - offset:at - offset + hole] = bytes(hole)
        else:
            self._chunk_error(kind, self._recv(size), f"read at {offset}")
        if flags & _DONE:
            del self._reads[got]

    def _landing(self, cookie: int):
        try:
            return self._reads[cookie]
        except KeyError:
            raise NbdError("read: the NBD server answered a request never sent") from None

    def read_into(self, offset: int, view: memoryview) -> None:
        self.finish_read(self.send_read(offset, view))

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._reply_without_data()

    def write(self, offset: int, data) -> None:
        self._drain(self.window - 1)
        self._pending[self._send(_WRITE, offset, len(data), payload=data)] = \
            f"write at {offset}"

    def write_zeroes(self, offset: int, length: int) -> None:
        self._drain(self.window - 1)
        self._pending[self._send(_WRITE_ZEROES, offset, length)] = f"zeroes at {offset}"

    def flush(self) -> None:
        self._drain(0)
        self._pending[self._send(_FLUSH, 0, 0)] = "flush"
        self._drain(0)

    def close(self) -> None:
        try:
            self._drain(0)
            self._send(_DISC, 0, 0)
        except OSError:
            pass
        finally:
            self.sock.close()
