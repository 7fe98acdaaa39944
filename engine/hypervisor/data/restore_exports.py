"""A backup chain served read-only as one disk image over NBD, on the host
that keeps it, for the length of a restore (``restore_export`` and
``restore_unexport``; :mod:`engine.hypervisor.data.restores` reads it).

:func:`serve` first checks every link of the chain: its volume is in its
pool, and the file's checksum is the one its record holds (read on this
host, :mod:`~engine.hypervisor.storage.file_checksum`); a damaged or
missing link serves nothing and names its backup.  Then, per disk, a
``qemu-nbd`` opens the newest link with the older ones as its backing
chain, given at open time (a ``json:`` image with an explicit ``backing``
node per link, the oldest with none), read-only: the stored volumes are
never modified, not even their headers.  A reader of the export meets each
block once, in the newest link that holds it.

The export listens on the host's ``migration_address`` (where QEMU's disk
streams already arrive) when this machine has that address, over TLS with
QEMU's certificates when the host is reached over TLS (its certificate
names that address, as migrations need); else on loopback, in clear.  Its
name is a random token, it is read-only, and it lives from :func:`serve`
to :func:`unserve`.  Each export is recorded in the state
directory (``restore-exports/<owner>-<dev>.json``) *before* its process
starts, so that :func:`sweep` (run by the backup sweep) ends the exports of
restores that are no longer running: a restore whose peers died leaves no
export behind.  ``qemu-nbd`` runs in a session of its own, so that a peer
killed mid-restore does not cut a copy that is under way.

Both requests are idempotent by the restore's automation id (``owner``):
run again, :func:`serve` gives the export already running.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import time

import libvirt
import structlog

from engine.core import failpoints, steps
from engine.errors import RequestError
from engine.backups.records import still_running
from engine.hypervisor.data.backups import Ticker, is_test
from engine.hypervisor.storage import images
from engine.hypervisor.storage.file_checksum import file_checksum
from engine.hypervisor.storage.nbdpull import content_checksum
from engine.hypervisor.data.backup_pull import CONTENT
from engine.hypervisor.storage.nbd_copy import qemu_tls_dir, tls_object
from engine.hypervisor.storage.volcopy import physical_size

__all__ = ["serve", "unserve", "sweep", "chain_image", "export_chain"]

log = structlog.get_logger("peerctl.restores")

DIRECTORY = "restore-exports"
LOOPBACK = "127.0.0.1"
START_TIMEOUT = 30.0


def _owner(args: dict) -> str:
    owner = args.get("owner")
    if not isinstance(owner, str) or not owner.replace("-", "").isalnum() or len(owner) > 64:
        raise RequestError(f"bad restore id {owner!r}")
    return owner


def _directory(host) -> str:
    path = os.path.join(os.path.abspath(host.state_dir), DIRECTORY)
    os.makedirs(path, exist_ok=True)
    return path


def _records(host) -> list[tuple[str, dict]]:
    found = []
    directory = _directory(host)
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                found.append((path, json.load(f)))
        except (OSError, ValueError):
            found.append((path, {}))        # half-written: its process never started
    return found


def _write(path: str, value: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


def chain_image(paths: list[str]) -> str:
    """The ``json:`` image of the chain ``paths`` (full backup first),
    read-only, each link's backing given explicitly."""
    node = None
    for path in paths:
        protocol = "host_device" if stat.S_ISBLK(os.stat(path).st_mode) else "file"
        node = {"driver": "qcow2", "read-only": True,
                "file": {"driver": protocol, "filename": path}, "backing": node}
    return "json:" + json.dumps(node, separators=(",", ":"))


def _address(host) -> tuple[str, str | None]:
    """Where to listen, and QEMU's certificates to serve with: the host's
    migration address when this machine has it (with TLS when the host is
    reached over TLS, as its migration streams are), else loopback, in clear."""
    wanted = (host.migration or {}).get("migration_address")
    if wanted:
        probe = socket.socket(socket.AF_INET6 if ":" in wanted else socket.AF_INET)
        try:
            probe.bind((wanted, 0))
            return wanted, qemu_tls_dir(host.remote_uri)
        except OSError:
            pass
        finally:
            probe.close()
    return LOOPBACK, None


def _free_port(address: str) -> int:
    probe = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    try:
        probe.bind((address, 0))
        return probe.getsockname()[1]
    finally:
        probe.close()


def _pid(record: dict) -> int | None:
    """The record's qemu-nbd, when it is still that process."""
    try:
        with open(record["pidfile"]) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, ValueError, KeyError):
        return None
    return pid if record.get("export", "\0").encode() in cmdline else None


def _verified_paths(host, chain: list[dict], dev: str, ticker: Ticker) -> list[str]:
    """The links' volume files for ``dev``, each checked against its record."""
    pools, paths = {}, []
    for link in chain:
        disk = next((d for d in link["disks"] if d.get("dev") == dev), None)
        if disk is None:
            raise RequestError(f"backup {link['id']} has no disk {dev}")
        if link["pool"] not in pools:
            try:
                pools[link["pool"]] = host.conn.storagePoolLookupByName(link["pool"])
                pools[link["pool"]].refresh(0)
            except libvirt.libvirtError as exc:
                raise RequestError(f"backup {link['id']}: pool {link['pool']} on "
                                   f"{host.host}: {exc.get_error_message()}") from None
        vol = images.lookup(pools[link["pool"]], disk["volume"])
        if vol is None:
            raise RequestError(f"backup {link['id']}: volume {disk['volume']} is missing "
                               f"from pool {link['pool']} on {host.host}")
        if disk.get("checksum_of") == CONTENT:      # a pulled backup: its content's
            found = content_checksum(vol.path(), stop=steps.abort_requested)[0]
        else:
            found, _read = file_checksum(vol.path(), ticker, steps.abort_requested)
        ticker.next(physical_size(vol))
        if found != disk["checksum"]:
            raise RequestError(f"backup {link['id']}: disk {dev} on {host.host} does not "
                               "match its checksum: it is damaged; nothing restored")
        paths.append(vol.path())
    return paths


def serve(host, args: dict) -> dict:
    """``{owner, uuid, chain}`` -> ``{host, exports: {dev: {address,
    port, name, tls}}, backups}``: the chain checked, then each disk served."""
    owner = _owner(args)
    chain = args.get("chain")
    if not isinstance(chain, list) or not chain or any(
            not isinstance(link, dict) or link.get("host") != host.host for link in chain):
        raise RequestError("restore_export needs the backup chain, full backup first, "
                           f"every link kept on {host.host}")
    if is_test(host.conn):      # no disk content: the restoring host makes blank disks
        return {"host": host.host, "exports": {},
                "backups": [link["id"] for link in chain]}
    devs = [d["dev"] for d in chain[0]["disks"]]
    running = {record.get("dev"): record for path, record in _records(host)
               if record.get("owner") == owner and _pid(record) is not None}
    if set(running) != set(devs):
        unserve(host, {"owner": owner})         # an earlier, unfinished try
        running = {}
        ticker = Ticker("checking", sum(int(d.get("stored") or 0)
                                        for link in chain for d in link["disks"]))
        paths = {dev: _verified_paths(host, chain, dev, ticker) for dev in devs}
        failpoints.crash("restore checked")
        for dev in devs:
            running[dev] = export_chain(host, owner, args.get("uuid"), dev, paths[dev],
                                        [link["id"] for link in chain])
        failpoints.crash("restore exported")    # tests: a peer dead with its export up
    log.info("restore_exported", owner=owner, backups=[link["id"] for link in chain],
             exports={dev: f"{r['address']}:{r['port']}" for dev, r in running.items()})
    return {"host": host.host,
            "exports": {dev: {k: r.get(k) for k in ("address", "port", "name", "tls")}
                        for dev, r in running.items()},
            "backups": [link["id"] for link in chain]}


def export_chain(host, owner: str, uuid, dev: str, paths: list[str],
                 backups: list[str]) -> dict:
    """The chain ``paths`` (full backup first) served for restore ``owner``,
    without checking it (:func:`serve` checks first): its record."""
    directory = _directory(host)
    path = os.path.join(directory, f"{owner}-{dev}.json")
    address, tls_dir = _address(host)
    for _attempt in range(3):
        record = {"owner": owner, "uuid": uuid, "dev": dev, "backups": backups,
                  "address": address, "port": _free_port(address),
                  "name": "restore-" + secrets.token_hex(16), "tls": tls_dir is not None,
                  "pidfile": os.path.join(directory, f"{owner}-{dev}.pid"),
                  "started": time.time()}
        record["export"] = record["name"]
        _write(path, record)            # first: a sweep finds it whatever happens next
        tls = [*tls_object(tls_dir, "server"), "--tls-creds=tls0"] if tls_dir else []
        try:
            done = subprocess.run(
                ["qemu-nbd", "--read-only", "--persistent", "--shared=4", "--fork", *tls,
                 f"--pid-file={record['pidfile']}", f"--bind={address}",
                 f"--port={record['port']}", f"--export-name={record['name']}",
                 f"--description=peerctl restore {owner} {dev}", chain_image(paths)],
                capture_output=True, text=True, timeout=START_TIMEOUT,
                stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RequestError(f"qemu-nbd: {exc}") from None
        if done.returncode == 0 and _pid(record) is not None:
            return record
        why = (done.stderr or done.stdout).strip().splitlines()
        if not why or "in use" not in why[-1]:
            raise RequestError(f"qemu-nbd could not serve backup {backups[-1]} disk {dev}: "
                               f"{why[-1] if why else 'it exited'}")
    raise RequestError(f"qemu-nbd found no free port on {address}")


def unserve(host, args: dict) -> dict:
    """``{owner}`` -> ``{stopped}``: the restore's exports ended, their
    records removed."""
    owner = _owner(args)
    stopped = [_stop(path, record) for path, record in _records(host)
               if record.get("owner") == owner or not record
               and os.path.basename(path).startswith(owner + "-")]
    if stopped:
        log.info("restore_unexported", owner=owner, stopped=stopped)
    return {"stopped": stopped}


def _stop(path: str, record: dict) -> str:
    pid = _pid(record)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _pid(record) == pid and time.monotonic() < deadline:
            time.sleep(0.01)
        if _pid(record) == pid:
            os.kill(pid, signal.SIGKILL)
    for leftover in (path, record.get("pidfile")):
        if leftover:
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass
    return f"export {record.get('name') or os.path.basename(path)}"


def sweep(store, host) -> list[str]:
    """The exports of restores that are no longer running, ended."""
    if not os.path.isdir(os.path.join(os.path.abspath(host.state_dir), DIRECTORY)):
        return []
    return [_stop(path, record) for path, record in _records(host)
            if not record.get("owner") or not still_running(store, record["owner"])]
