"""The host's storage: one libvirt dir pool, a cache of base images, and the
VMs' disks as qcow2 overlays on them.

Promises:
- everything goes through libvirt's storage API (pool define/build/start,
  volume create, upload, resize, delete); the only files this module writes
  itself are a download in progress and the cache index, both under the
  peer's state directory;
- an image is read or fetched only from the cluster's image sources, read
  from etcd for each build (:mod:`engine.hypervisor.storage.image_sources`): a file by its real
  path (symlinks resolved), each redirect checked before it is followed;
- a base image is stored once per host, as volume ``image-<sha256>`` of its
  content, however many URLs or VMs use it;
- a base volume counts only once its upload finished (the index says so),
  so a peer killed mid-upload re-uploads instead of booting a torn image;
- every ``ensure_*`` finds what an earlier call made and returns it.

On ``test:///default`` volumes have no content and cannot be resized; the
same calls run and the missing operations are worked around at the one
place each can fail (see :func:`_upload` and :func:`ensure_capacity`).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tempfile
import threading
import urllib.parse
import xml.etree.ElementTree as ET
from collections import defaultdict

import libvirt
import structlog

from engine.hypervisor.storage import image_sources
from engine.errors import RequestError
from engine.hypervisor.domain.domain_xml import pool_xml, volume_xml

__all__ = ["POOL_NAME", "pool_name", "GiB", "ensure_pool", "ensure_dir_pool", "lookup", "ensure_base", "ensure_overlay",
           "ensure_blank", "ensure_capacity", "delete_volumes", "volumes_of",
           "image_volume_name", "cached_base", "ensure_seed"]

log = structlog.get_logger("peerctl.images")

POOL_NAME = "peerctl"
GiB = 1 << 30
_CHUNK = 1 << 20
_QCOW2_MAGIC = b"QFI\xfb"

# libvirt prints every error on stderr by default; ours become exceptions.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

_locks_guard = threading.Lock()
_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks[key]


def _code(exc: libvirt.libvirtError) -> int:
    return exc.get_error_code()


# -- the pool ----------------------------------------------------------------

def pool_name(host) -> str:
    """One pool per peer, so that several peers sharing one libvirtd (a test
    cluster on qemu:///system) keep their disks apart."""
    return f"{POOL_NAME}-{host.host}"


def _pool_path(pool) -> str | None:
    target = ET.fromstring(pool.XMLDesc(0)).find("./target/path")
    return target.text if target is not None else None


def ensure_pool(host) -> libvirt.virStoragePool:
    """The peer's dir pool under ``state_dir/pool``, defined, built and
    started if need be (see :func:`ensure_dir_pool`)."""
    return ensure_dir_pool(host, pool_name(host),
                           os.path.join(os.path.abspath(host.state_dir), "pool"))


def ensure_dir_pool(host, name: str, path: str) -> libvirt.virStoragePool:
    """Dir pool ``name`` at ``path``, defined, built and started if need be.
    A pool left over from an earlier state directory is kept while its
    directory exists (its volumes may back live VMs), and replaced once that
    directory is gone."""
    conn = host.conn
    with _lock("pool:" + host.libvirt_uri + name):
        try:
            pool = conn.storagePoolLookupByName(name)
        except libvirt.libvirtError as exc:
            if _code(exc) != libvirt.VIR_ERR_NO_STORAGE_POOL:
                raise
            pool = None
        if pool is not None and _pool_path(pool) != path \
                and not os.path.isdir(_pool_path(pool) or ""):
            log.info("pool_replaced", pool=name, old=_pool_path(pool), new=path)
            if pool.isActive():
                pool.destroy()
            pool.undefine()
            pool = None
        if pool is None:
            os.makedirs(path, mode=0o755, exist_ok=True)
            pool = conn.storagePoolDefineXML(pool_xml(name, path), 0)
            pool.build(0)
            log.info("pool_defined", pool=name, path=path)
        if not pool.isActive():
            pool.create(0)
        try:
            pool.setAutostart(1)
        except libvirt.libvirtError:
            pass        # a transient pool, or a driver without autostart
        return pool


def lookup(pool, name: str):
    """Volume ``name`` of ``pool``, or None."""
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as exc:
        if _code(exc) == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def volumes_of(pool, uuid: str) -> list:
    """The pool's volumes that belong to VM ``uuid`` (named ``<uuid>...``)."""
    return [vol for vol in pool.listAllVolumes(0) if vol.name().startswith(uuid)]


def delete_volumes(pool, uuid: str) -> list[str]:
    deleted = []
    for vol in volumes_of(pool, uuid):
        name = vol.name()
        try:
            vol.delete(0)
        except libvirt.libvirtError as exc:
            if _code(exc) != libvirt.VIR_ERR_NO_STORAGE_VOL:
                raise
        deleted.append(name)
    return deleted


# -- the image cache ---------------------------------------------------------

def image_volume_name(sha256: str) -> str:
    return f"image-{sha256}"


class _Index:
    """``state_dir/images.json``: which URL had which content, and which
    base volumes finished uploading.  Rewritten whole, atomically."""

    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "images.json")

    def load(self) -> dict:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (FileNotFoundError, ValueError):
            data = {}
        data.setdefault("urls", {})
        data.setdefault("complete", {})
        return data

    def update(self, fn) -> None:
        with _lock("index:" + self.path):
            data = self.load()
            fn(data)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".images.")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


def _local_path(url: str, real: str) -> str:
    """``real`` (file URL ``url``'s real path, inside an image source), if
    it is a file."""
    if not os.path.isfile(real):
        raise RequestError(f"image {url!r}: no such file on this host")
    return real


def _hash_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _expected_sha256(url: str) -> tuple[str, str | None]:
    """(the URL without its fragment, the sha256 its ``#sha256=HEX``
    fragment names, or None)."""
    bare, fragment = urllib.parse.urldefrag(url)
    if not fragment:
        return bare, None
    key, _, value = fragment.partition("=")
    value = value.strip().lower()
    if key.strip().lower() != "sha256" or len(value) != 64 \
            or any(c not in "0123456789abcdef" for c in value):
        raise RequestError(f"image {url!r}: the URL fragment must be #sha256=<64 hex "
                           f"digits>, got #{fragment}")
    return bare, value


def _content_length(response) -> int | None:
    value = response.headers.get("Content-Length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


_MAX_REDIRECTS = 5


def _get(url: str, allowed):
    """The response to GET ``url``, redirects followed by hand so that
    ``allowed`` (raising ``ValueError``) checks each URL before it is asked."""
    import requests as http     # here, not at the top: every peer imports this module
    for _hop in range(_MAX_REDIRECTS + 1):
        try:
            allowed(url)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        response = http.get(url, stream=True, timeout=(10, 60), allow_redirects=False)
        if not response.is_redirect:
            return response
        url = urllib.parse.urljoin(url, response.headers["Location"])
        response.close()
    raise RequestError(f"image {url!r}: more than {_MAX_REDIRECTS} redirects")


def _download(url: str, directory: str, allowed=lambda url: None) -> tuple[str, str]:
    """Stream ``url`` into a temporary file; returns (path, sha256).  A body
    shorter or longer than the response's Content-Length is refused (a
    server that closed early must not leave a torn image behind); a
    redirect is followed only where ``allowed`` lets it."""
    import requests as http     # here, not at the top: every peer imports this module
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".download.")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, _get(url, allowed) as response:
            if response.status_code != 200:
                raise RequestError(f"image {url!r}: HTTP {response.status_code} "
                                   f"{response.reason}")
            received = 0
            for chunk in response.iter_content(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                received += len(chunk)
            expected = _content_length(response)
            if response.headers.get("Content-Encoding", "identity") != "identity":
                received = response.raw.tell()      # bytes on the wire, before decoding
            if expected is not None and received != expected:
                raise RequestError(f"image {url!r}: truncated download, {received} bytes "
                                   f"received of Content-Length {expected}")
    except http.RequestException as exc:
        os.unlink(tmp)
        raise RequestError(f"image {url!r}: download failed: {exc}") from None
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp, digest.hexdigest()


def _probe(path: str) -> tuple[str, int]:
    """(format, virtual size in bytes) of an image file."""
    with open(path, "rb") as f:
        header = f.read(32)
    if header[:4] == _QCOW2_MAGIC and len(header) >= 32:
        return "qcow2", struct.unpack(">Q", header[24:32])[0]
    return "raw", os.path.getsize(path)


def _upload(conn, vol, path: str) -> bool:
    """Copy ``path`` into ``vol`` through a libvirt stream.  False when the
    driver keeps no volume content (test:///default)."""
    with open(path, "rb") as f:
        return _upload_from(conn, vol, f, os.path.getsize(path))


def _upload_from(conn, vol, f, size: int) -> bool:
    stream = conn.newStream(0)
    try:
        vol.upload(stream, 0, size, 0)
    except libvirt.libvirtError as exc:
        if _code(exc) == libvirt.VIR_ERR_NO_SUPPORT:
            return False
        raise
    try:
        stream.sendAll(lambda _stream, nbytes, src: src.read(min(nbytes, _CHUNK)), f)
        stream.finish()
    except BaseException:
        try:
            stream.abort()
        except libvirt.libvirtError:
            pass
        raise
    return True


def ensure_base(host, pool, url: str) -> tuple[libvirt.virStorageVol, str]:
    """The cached base volume holding ``url``'s content, and its format.

    ``url`` may end in ``#sha256=HEX``: the content must hash to HEX or the
    image is refused and nothing is cached; an image of that hash already
    in the cache is used without fetching anything."""
    sources = image_sources.read_sources(host.store)
    guarded = image_sources.addresses_of_urls(getattr(host.store, "endpoints", ""))

    def allowed(target: str) -> None:       # each URL asked, redirects too
        image_sources.check_fetch(target, sources, guarded)
    scheme = urllib.parse.urlparse(url).scheme.lower()
    try:
        if scheme == "file":        # symlinks and '..' resolved, then checked
            local = _local_path(url, image_sources.local_file(url, sources, host.state_dir))
        else:
            local = None
            allowed(url)
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    bare, wanted = _expected_sha256(url)
    index = _Index(host.state_dir)
    with _lock("url:" + url):
        if wanted is not None:
            found = _cached(pool, index, wanted)
            if found:
                return found
        known = index.load()["urls"].get(url)
        if local is not None:
            stat = os.stat(local)
            if known and (known.get("size"), known.get("mtime")) != (stat.st_size, stat.st_mtime):
                known = None        # the file changed since we hashed it
        if known and wanted is None:
            found = _cached(pool, index, known["sha256"])
            if found:
                return found
        # Not known, or its volume vanished: get the content and its hash.
        if local is not None:
            source, sha, temporary = local, _hash_file(local), False
        else:
            source, sha = _download(bare, os.path.join(host.state_dir, "downloads"), allowed)
            temporary = True
        try:
            if wanted is not None and sha != wanted:
                raise RequestError(f"image {bare!r}: sha256 {sha} does not match the "
                                   f"expected {wanted}; nothing cached")
            result = _store(host, pool, index, source, sha)
        finally:
            if temporary:
                os.unlink(source)
        entry = {"sha256": sha}
        if local is not None:
            entry.update(size=stat.st_size, mtime=stat.st_mtime)
        index.update(lambda data: data["urls"].__setitem__(url, entry))
        return result


def cached_base(host, pool, sha: str):
    """``(volume, format)`` of this host's complete copy of base image
    ``sha``, or None: never fetches anything."""
    return _cached(pool, _Index(host.state_dir), sha)


def _cached(pool, index: _Index, sha: str):
    complete = index.load()["complete"].get(sha)
    vol = lookup(pool, image_volume_name(sha))
    if complete and vol is not None:
        return vol, complete["format"]
    return None


def _store(host, pool, index: _Index, source: str, sha: str):
    with _lock("sha:" + sha):
        found = _cached(pool, index, sha)
        if found:
            log.info("image_cache_hit", sha256=sha)
            return found
        name = image_volume_name(sha)
        torn = lookup(pool, name)
        if torn is not None:            # an upload that never finished
            torn.delete(0)
        fmt, virtual_size = _probe(source)
        # Created raw at the file's exact size, then overwritten byte for
        # byte: what lands on disk is the image file itself, whatever format.
        vol = pool.createXML(volume_xml(name, os.path.getsize(source), "raw"), 0)
        stored = _upload(host.conn, vol, source)
        if stored:
            pool.refresh(0)             # let libvirt re-read the image header
            vol = pool.storageVolLookupByName(name)
        index.update(lambda data: data["complete"].__setitem__(
            sha, {"format": fmt, "virtual_size": virtual_size}))
        log.info("image_cached", sha256=sha, format=fmt, bytes=os.path.getsize(source),
                 content_stored=stored)
        return vol, fmt


# -- the VMs' disks ----------------------------------------------------------

def image_size(host, base_vol) -> int:
    """The virtual size in bytes of a cached base image: what its header
    says (recorded when it was stored), or what libvirt reports if larger."""
    sha = base_vol.name()[len(image_volume_name("")):]
    recorded = _Index(host.state_dir).load()["complete"].get(sha) or {}
    return max(int(recorded.get("virtual_size") or 0), base_vol.info()[1])


def ensure_overlay(host, pool, name: str, base_vol, base_format: str,
                   disk_gb: int) -> libvirt.virStorageVol:
    """Volume ``name``: a qcow2 overlay on ``base_vol`` of exactly ``disk_gb``.
    An image whose virtual size exceeds ``disk_gb`` is refused (a disk is
    never shrunk, and keeping the image's size would use more disk than the
    VM was allocated); ``disk_gb`` 0 takes the image's size."""
    if disk_gb:
        size = image_size(host, base_vol)
        if size > disk_gb * GiB:
            raise RequestError(
                f"image is {size / GiB:.2f} GiB (virtual size), larger than the VM's "
                f"disk of {disk_gb} GiB (DISK_GB); ask for DISK_GB >= {-(-size // GiB)}")
    vol = lookup(pool, name)
    if vol is None:
        vol = pool.createXML(volume_xml(name, base_vol.info()[1], "qcow2",
                                        backing_path=base_vol.path(),
                                        backing_format=base_format), 0)
    return ensure_capacity(pool, vol, disk_gb * GiB)


def ensure_seed(host, pool, name: str, data: bytes) -> libvirt.virStorageVol:
    """Volume ``name``: a raw file holding exactly ``data`` (a NoCloud seed
    ISO), written again on every call (the same inputs make the same seed)."""
    vol = lookup(pool, name)
    if vol is not None and vol.info()[1] != len(data):
        vol.delete(0)
        vol = None
    if vol is None:
        vol = pool.createXML(volume_xml(name, len(data), "raw"), 0)
    _upload_from(host.conn, vol, io.BytesIO(data), len(data))
    return vol


def ensure_blank(pool, name: str, disk_gb: int) -> libvirt.virStorageVol:
    """Volume ``name``: an empty qcow2 disk of ``disk_gb``."""
    vol = lookup(pool, name)
    if vol is None:
        vol = pool.createXML(volume_xml(name, disk_gb * GiB, "qcow2"), 0)
    return ensure_capacity(pool, vol, disk_gb * GiB)


def ensure_capacity(pool, vol, capacity: int) -> libvirt.virStorageVol:
    """Grow ``vol`` to ``capacity`` bytes (never shrinks: callers refuse an
    image larger than the requested disk, see :func:`ensure_overlay`)."""
    if vol.info()[1] >= capacity:
        return vol
    try:
        vol.resize(capacity, 0)
        return vol
    except libvirt.libvirtError as exc:
        if _code(exc) != libvirt.VIR_ERR_NO_SUPPORT:
            raise RequestError(f"cannot resize disk {vol.name()}: {exc}") from None
    # The driver cannot resize (test:///default): the volume is new and
    # unused, so make it again at the right size from its own description.
    root = ET.fromstring(vol.XMLDesc(0))
    vol.delete(0)
    root.find("capacity").text = str(capacity)
    root.find("capacity").set("unit", "bytes")
    return pool.createXML(ET.tostring(root, encoding="unicode"), 0)
