"""A cloud-init NoCloud seed: the ``cidata`` ISO a guest reads its hostname,
SSH keys and user-data from on first boot, built in memory with pycdlib.

Promises:
- every input is checked before anything is built, and a bad one is refused
  in one line naming it: :class:`~engine.errors.UsageError` for what the
  command line reads (``--user-data``, ``--ssh-key``, a hostname),
  :class:`~engine.errors.RequestError` for what a request handler gets from
  etcd (:func:`check_seed_args`);
- a file is never read past its cap (``MAX_USER_DATA`` + 1 bytes), and only
  a regular file is read at all: a FIFO or a device is refused, never
  waited on;
- an SSH key is kept only if ``cryptography`` loads it as an OpenSSH public
  key; it is kept as ``type base64 [comment]``, its options refused;
- the ISO holds exactly the files given, under their real names in Rock
  Ridge and Joliet (``meta-data``, ``user-data``, ``network-config``) and
  valid level-1 names beside them (``/METADATA.;1``), and from inputs within
  the caps it is never larger than :data:`MAX_SEED_BYTES`;
- nothing here runs a subprocess or writes a file.

The ISO's timestamps are the build time (pycdlib takes them from the clock),
so two builds of the same files differ in those bytes only.
"""
from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import io
import json
import os
import re
import stat

from engine.errors import RequestError, UsageError

__all__ = ["MAX_USER_DATA", "MAX_SSH_KEYS", "MAX_SSH_KEY_FILE", "MAX_MACS", "MAX_SEED_BYTES",
           "DEFAULT_USER_DATA", "read_user_data", "read_ssh_keys", "fingerprint",
           "fingerprint_hex", "check_hostname", "seed_files", "build_iso", "check_seed_args",
           "given_user_data", "given_ssh_keys"]

MAX_USER_DATA = 64 * 1024
MAX_SSH_KEYS = 32
MAX_SSH_KEY_FILE = 64 * 1024     # the file, and the normalised key lines together
MAX_MACS = 32
# Measured from maximal inputs (tests/test_seed.py builds them), with room:
# user-data 64 KiB, meta-data at most 2 x 64 KiB (JSON doubles '"' and '\'),
# network-config a few KiB, and pycdlib's system area, descriptors, path
# tables and directories (well under 64 KiB).
MAX_SEED_BYTES = 320 * 1024

# Valid cloud-config that asks for nothing: an empty mapping.
DEFAULT_USER_DATA = b"#cloud-config\n{}\n"

_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_FILE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


# -- reading what the command line names ---------------------------------------

def _read_capped(flag: str, path: str, cap: int) -> bytes:
    """At most ``cap`` + 1 bytes of the regular file at ``path``; UsageError
    naming ``flag`` for anything else."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer must not hang; a
        # regular file ignores the flag.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise UsageError(f"{flag} {path}: is a directory, not a file") from None
        raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{flag} {path}: is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{flag} {path}: not a regular file")
        if info.st_size > cap:
            raise UsageError(f"{flag} {path} is {info.st_size} bytes; at most {cap}")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb", buffering=0) as source:
        chunks, size = [], 0
        try:
            while size <= cap:
                chunk = source.read(cap + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    if size > cap:      # grew since fstat
        raise UsageError(f"{flag} {path} is more than {cap} bytes; at most {cap}")
    return b"".join(chunks)


def read_user_data(path: str) -> bytes:
    """The content of ``--user-data``: a regular file of at most
    :data:`MAX_USER_DATA` bytes, passed to the guest as it is."""
    return _read_capped("--user-data", path, MAX_USER_DATA)


def read_ssh_keys(path: str) -> list[str]:
    """The keys of ``--ssh-key``: an OpenSSH public key file, one key a line
    (``type base64 [comment]``, no options), blank lines and ``#`` comments
    skipped; returned as normalised lines."""
    flag = "--ssh-key"
    data = _read_capped(flag, path, MAX_SSH_KEY_FILE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag} {path}: not UTF-8 text (byte {exc.start})") from None
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            keys.append(_key_line(line))
        except ValueError as exc:
            raise UsageError(f"{flag} {path} line {number}: not an OpenSSH public key ({exc})"
                             ) from None
        if len(keys) > MAX_SSH_KEYS:
            raise UsageError(f"{flag} {path}: more than {MAX_SSH_KEYS} keys; at most "
                             f"{MAX_SSH_KEYS}")
    if not keys:
        raise UsageError(f"{flag} {path}: no public key in it")
    return keys


# -- what the HTTP API is given -------------------------------------------------

def given_user_data(text: str, field: str) -> bytes:
    """User-data given as text (the API's ``user_data``: the file's text),
    as UTF-8, within :data:`MAX_USER_DATA` as ``--user-data``'s file is."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{field}: not valid Unicode") from None
    if len(data) > MAX_USER_DATA:
        raise UsageError(f"{field} is {len(data)} bytes; at most {MAX_USER_DATA}")
    return data


def given_ssh_keys(lines: list[str], field: str) -> list[str]:
    """Public keys given one a line (the API's ``ssh_keys``), checked as
    ``--ssh-key``'s lines are, within the same caps (:data:`MAX_SSH_KEYS`
    keys, :data:`MAX_SSH_KEY_FILE` bytes together); normalised lines."""
    if len(lines) > MAX_SSH_KEYS:
        raise UsageError(f"{len(lines)} SSH keys; at most {MAX_SSH_KEYS}")
    keys, total = [], 0
    for index, line in enumerate(lines):
        try:
            key = _key_line(line.strip())
        except ValueError as exc:
            raise UsageError(f"{field}[{index}]: not an OpenSSH public key ({exc})") from None
        total += len(key.encode("utf-8")) + 1
        if total > MAX_SSH_KEY_FILE:
            raise UsageError(f"{field} are more than {MAX_SSH_KEY_FILE} bytes together; at "
                             f"most {MAX_SSH_KEY_FILE}")
        keys.append(key)
    return keys


# -- keys ----------------------------------------------------------------------

def _key_line(line: str) -> str:
    """``line`` as ``type base64 [comment]`` once cryptography loads it;
    ValueError saying why not."""
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in line if c != "\t"):
        raise ValueError("control character in it")
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode") from None
    fields = line.split(None, 2)
    if len(fields) < 2:
        raise ValueError("expected 'type base64 [comment]'")
    kind, blob = fields[0], fields[1]
    try:
        base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        # Also what an authorized_keys line with options gets: its second
        # field is the key type.
        raise ValueError("second field is not base64") from None
    # Imported here: only code that reads keys pays for cryptography.
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key
    try:
        load_ssh_public_key(f"{kind} {blob}".encode("ascii"))
    except Exception as exc:   # ValueError, UnsupportedAlgorithm, ...
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) \
            from None
    comment = fields[2].strip() if len(fields) > 2 else ""
    return f"{kind} {blob} {comment}" if comment else f"{kind} {blob}"


def _blob(key_line: str) -> bytes:
    fields = key_line.split()
    if len(fields) < 2:
        raise ValueError("expected 'type base64 [comment]'")
    return base64.b64decode(fields[1], validate=True)


def fingerprint(key_line: str) -> str:
    """OpenSSH's fingerprint of a key line, as ``ssh-keygen -lf`` prints it:
    ``SHA256:`` and the unpadded base64 of the SHA-256 of the key blob."""
    digest = hashlib.sha256(_blob(key_line)).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def fingerprint_hex(key_line: str) -> str:
    """The SHA-256 of the key blob in hex (what ``sha256sum`` of the decoded
    blob prints, for guests without ssh-keygen)."""
    return hashlib.sha256(_blob(key_line)).hexdigest()


# -- hostname ------------------------------------------------------------------

def _hostname_problem(name) -> str | None:
    if not isinstance(name, str):
        return f"expected a string, not {type(name).__name__}"
    if not name:
        return "empty"
    if len(name) > 253:
        return f"{len(name)} characters; at most 253"
    for label in name.split("."):
        if not label:
            return "empty label"
        if len(label) > 63:
            return f"label {label[:20]!r}... is {len(label)} characters; at most 63"
        if not _LABEL.fullmatch(label):
            return (f"label {label!r}: letters, digits and '-' only, "
                    "not starting or ending with '-'")
    return None


def check_hostname(name: str) -> str:
    """``name`` if it is an RFC 1123 hostname, else UsageError saying why."""
    problem = _hostname_problem(name)
    if problem:
        raise UsageError(f"hostname {name!r}: not a valid hostname ({problem})")
    return name


# -- the seed ------------------------------------------------------------------

def seed_files(uuid: str, hostname: str, user_data: bytes | None, ssh_keys: list[str],
               macs: list[str] | None = None) -> dict[str, bytes]:
    """The NoCloud files for one VM: ``meta-data`` (JSON, which is YAML),
    ``user-data``, and ``network-config`` (DHCP on each NIC, matched by MAC)
    only when the VM has more than one NIC; with one, cloud-init's fallback
    already does DHCP on it.

    Inputs are expected checked already (:func:`check_seed_args`); a bad
    hostname or MAC here is a caller's bug and raises ValueError."""
    problem = _hostname_problem(hostname)
    if problem:
        raise ValueError(f"hostname {hostname!r}: {problem}")
    meta: dict = {"instance-id": uuid, "local-hostname": hostname}
    if ssh_keys:
        meta["public-keys"] = list(ssh_keys)
    files = {
        "meta-data": (json.dumps(meta, indent=1, ensure_ascii=False) + "\n").encode("utf-8"),
        "user-data": DEFAULT_USER_DATA if user_data is None else bytes(user_data),
    }
    macs = [mac.lower() for mac in macs or ()]
    if len(macs) > MAX_MACS:
        raise ValueError(f"{len(macs)} MACs; at most {MAX_MACS}")
    for mac in macs:
        if not _MAC.fullmatch(mac):
            raise ValueError(f"MAC {mac!r}: expected six hex pairs joined by ':'")
    if len(macs) > 1:
        ethernets = {f"nic{index}": {"match": {"macaddress": mac}, "set-name": f"nic{index}",
                                     "dhcp4": True}
                     for index, mac in enumerate(macs)}
        network = {"version": 2, "ethernets": ethernets}
        files["network-config"] = (json.dumps(network, indent=1) + "\n").encode("ascii")
    return files


def _level1_name(name: str) -> str:
    """An ISO 9660 level-1 name for ``name``: 8 upper-case characters, no
    extension (``meta-data`` -> ``METADATA.;1``)."""
    stem = re.sub(r"[^A-Z0-9_]", "", name.upper())[:8] or "FILE"
    return f"/{stem}.;1"


def build_iso(files: dict[str, bytes]) -> bytes:
    """The ``cidata`` ISO 9660 image holding ``files`` in its root, with
    Joliet and Rock Ridge carrying the real names.  Names are lower-case
    (``[a-z0-9._-]``, at most 64 characters); a bad one, or two that share
    a level-1 name, is a caller's bug and raises ValueError."""
    import pycdlib     # here: validating a request never needs it

    level1 = {}
    for name in files:
        if not _FILE_NAME.fullmatch(name):
            raise ValueError(f"seed file name {name!r}: expected [a-z0-9._-], at most 64")
        short = _level1_name(name)
        if short in level1:
            raise ValueError(f"seed files {level1[short]!r} and {name!r} share {short}")
        level1[short] = name
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, vol_ident="cidata", joliet=3, rock_ridge="1.09")
    try:
        for short, name in sorted(level1.items(), key=lambda item: item[1]):
            content = bytes(files[name])
            iso.add_fp(io.BytesIO(content), len(content), short, rr_name=name,
                       joliet_path=f"/{name}")
        out = io.BytesIO()
        iso.write_fp(out)
    finally:
        iso.close()
    return out.getvalue()


# -- what a request handler receives -------------------------------------------

_SEED_KEYS = {"hostname", "user_data", "ssh_keys"}


def check_seed_args(value) -> dict | None:
    """The seed part of a build request, from etcd, checked: None, or
    ``{"hostname": str, "user_data": bytes | str | None, "ssh_keys": [str]}``.
    Returns it normalised (user_data bytes or None, ssh_keys normalised
    lines); RequestError in one line on anything else."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestError(f"seed: expected a mapping or null, not {type(value).__name__}")
    unknown = sorted(str(key) for key in value if key not in _SEED_KEYS)
    if unknown:
        raise RequestError(f"seed: unknown field(s) {', '.join(unknown)}")
    if "hostname" not in value:
        raise RequestError("seed: no hostname")
    problem = _hostname_problem(value["hostname"])
    if problem:
        raise RequestError(f"seed: hostname {value['hostname']!r}: {problem}")

    user_data = value.get("user_data")
    if isinstance(user_data, str):
        try:
            user_data = user_data.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError("seed: user_data: not valid Unicode") from None
    elif isinstance(user_data, (bytes, bytearray, memoryview)):
        user_data = bytes(user_data)
    elif user_data is not None:
        raise RequestError(f"seed: user_data: expected bytes, a string or null, "
                           f"not {type(user_data).__name__}")
    if user_data is not None and len(user_data) > MAX_USER_DATA:
        raise RequestError(f"seed: user_data is {len(user_data)} bytes; at most {MAX_USER_DATA}")

    raw_keys = value.get("ssh_keys") or []
    if not isinstance(raw_keys, (list, tuple)):
        raise RequestError(f"seed: ssh_keys: expected a list, not {type(raw_keys).__name__}")
    if len(raw_keys) > MAX_SSH_KEYS:
        raise RequestError(f"seed: {len(raw_keys)} ssh_keys; at most {MAX_SSH_KEYS}")
    keys, total = [], 0
    for index, line in enumerate(raw_keys):
        if not isinstance(line, str):
            raise RequestError(f"seed: ssh_keys[{index}]: expected a string, "
                               f"not {type(line).__name__}")
        try:
            key = _key_line(line.strip())
        except ValueError as exc:
            raise RequestError(f"seed: ssh_keys[{index}]: not an OpenSSH public key ({exc})"
                               ) from None
        total += len(key.encode("utf-8")) + 1
        if total > MAX_SSH_KEY_FILE:
            raise RequestError(f"seed: ssh_keys are more than {MAX_SSH_KEY_FILE} bytes "
                               "together")
        keys.append(key)
    return {"hostname": value["hostname"], "user_data": user_data, "ssh_keys": keys}
