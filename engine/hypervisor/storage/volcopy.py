"""Copying a storage volume from one libvirt to another through libvirt's
own streams, sparse, and checksumming what passed.

The bytes travel host to host as libvirt moves them (``virStorageVolDownload``
on the source's daemon, ``virStorageVolUpload`` on the destination's): no
shared filesystem, no path of one host opened on another.  Holes stay
holes: only data is sent, and :class:`~engine.hypervisor.storage.checksum.ContentHash`
sees the same content either way.

- :func:`copy_volume` makes volume ``name`` in the destination pool a copy
  of the source volume's file, byte for byte; it returns the bytes of data
  sent and the content's checksum;
- :func:`checksum_volume` reads a volume of this host back and checksums it;
- both call ``tick(done, total)`` as they go, and stop with
  :class:`Interrupted` when ``stop()`` says so.
"""
from __future__ import annotations

import libvirt

from engine.errors import RequestError
from engine.hypervisor.storage.checksum import ContentHash
from engine.hypervisor.domain.domain_xml import volume_xml
from engine.hypervisor.storage.images import lookup

__all__ = ["copy_volume", "checksum_volume", "physical_size", "Interrupted"]

CHUNK = 1 << 20
_HOLE = -3          # virStreamRecvFlags: the stream is at a hole


class Interrupted(RequestError):
    """The copy was asked to stop (an abort): what it wrote is removed."""


def physical_size(vol) -> int:
    """The bytes of the volume's file (for a qcow2 file, not its virtual size)."""
    # with this flag libvirt answers the file's size in the allocation field
    return vol.infoFlags(libvirt.VIR_STORAGE_VOL_GET_PHYSICAL)[2]


def _download(conn, vol):
    stream = conn.newStream(0)
    vol.download(stream, 0, 0, libvirt.VIR_STORAGE_VOL_DOWNLOAD_SPARSE_STREAM)
    return stream


def _pump(source, hasher: ContentHash, write, hole, total: int, tick, stop) -> None:
    done = 0
    while True:
        if stop():
            raise Interrupted("stopped: asked to abort")
        got = source.recvFlags(CHUNK, libvirt.VIR_STREAM_RECV_STOP_AT_HOLE)
        if isinstance(got, int):
            if got != _HOLE:
                raise RequestError(f"volume stream: unexpected answer {got}")
            length = source.recvHole(0)
            hasher.hole(length)
            hole(length)
            done += length
        elif not got:
            return
        else:
            hasher.data(got)
            write(got)
            done += len(got)
        tick(done, total)


def _send_all(stream, data: bytes) -> None:
    view = memoryview(data)
    while view:
        sent = stream.send(bytes(view))
        if sent < 0:
            raise RequestError("volume stream: the destination stopped taking data")
        view = view[sent:]


def _abort(*streams) -> None:
    for stream in streams:
        if stream is None:
            continue
        try:
            stream.abort()
        except libvirt.libvirtError:
            pass


def copy_volume(src_conn, src_vol, dst_conn, dst_pool, name: str,
                tick=lambda done, total: None, stop=lambda: False) -> tuple[int, str]:
    """Volume ``name`` in ``dst_pool``: the source volume's file, copied.
    ``(bytes of data sent, checksum)``.  An existing volume of that name is
    replaced; a copy that fails leaves no volume of that name."""
    total = physical_size(src_vol)
    old = lookup(dst_pool, name)
    if old is not None:
        old.delete(0)
    dst_vol = dst_pool.createXML(volume_xml(name, total, "raw"), 0)
    hasher, down, up = ContentHash(), None, None
    try:
        down = _download(src_conn, src_vol)
        up = dst_conn.newStream(0)
        dst_vol.upload(up, 0, 0, libvirt.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM)
        _pump(down, hasher, lambda data: _send_all(up, data),
              lambda length: up.sendHole(length, 0), total, tick, stop)
        down.finish()
        down = None
        up.finish()
        up = None
    except BaseException as exc:
        _abort(down, up)
        try:
            dst_vol.delete(0)
        except libvirt.libvirtError:
            pass
        if isinstance(exc, libvirt.libvirtError):
            raise RequestError(f"copying volume {src_vol.name()}: "
                               f"{exc.get_error_message()}") from None
        raise
    dst_pool.refresh(0)         # libvirt reads the new file's header again
    return hasher.data_bytes, hasher.hexdigest()


def checksum_volume(conn, vol, tick=lambda done, total: None,
                    stop=lambda: False) -> tuple[str, int]:
    """The checksum of this host's volume ``vol``, read back through
    libvirt, and the bytes of content read (holes included)."""
    hasher, down = ContentHash(), None
    try:
        down = _download(conn, vol)
        _pump(down, hasher, lambda data: None, lambda length: None, physical_size(vol),
              tick, stop)
        down.finish()
    except libvirt.libvirtError as exc:
        _abort(down)
        raise RequestError(f"reading volume {vol.name()}: {exc.get_error_message()}") \
            from None
    except BaseException:
        _abort(down)
        raise
    return hasher.hexdigest(), hasher.length

