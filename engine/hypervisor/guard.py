"""The guard: a small process per host that stops the host's HA VMs before
its peer's lease can expire.

The cluster restarts a dead host's HA VMs elsewhere once the peer's lease
has expired plus a margin (:mod:`engine.hypervisor.ha`).  That is safe only
if the old copies cannot be running by then, whatever happened to the
peer: cut off from etcd (a partition), frozen (SIGSTOP, a hung kernel
call), or killed while libvirtd and QEMU live on.  The peer's main loop
cannot promise that for itself, so a second process does.

How it works:
- the peer writes ``<state_dir>/guard/heartbeat`` each time etcd renews its
  lease: ``until``, the moment (CLOCK_MONOTONIC, shared by every process of
  the host) before which the lease cannot have expired on the server (it
  was renewed for TTL seconds no earlier than the request was sent);
- the guard reads it every :data:`POLL` seconds.  From ``until - lead`` on,
  it pauses, then destroys (powers off, keeps defined, disks untouched)
  every running domain of the host whose peerctl metadata says ``ha: restart``, and goes
  on doing so while no newer heartbeat comes.  It notes each fenced uuid in
  ``<state_dir>/guard/fenced`` *before* destroying it;
- a peer that holds a lease again restarts a fenced VM only if the cluster
  says it is still its own (:func:`engine.peer.Peer._unfence`);
- it needs no etcd and no credentials: libvirt and the heartbeat file only.
  One guard per state directory (an ``flock``); the peer starts it when it
  has none and checks it every few seconds.  A guard whose peer is gone and
  which has nothing left to fence exits.

Why a process and not libvirt's AUTODESTROY (a domain destroyed when the
connection that started it closes): AUTODESTROY covers the peer's death but
not a hang or a partition, a peer restart (an upgrade) would kill every HA
VM, and libvirt refuses to migrate such domains.  The guard survives a peer
restart: a new peer that renews its lease before ``until - lead`` keeps its
HA VMs running.  What it costs: a peer stopped for longer than its TTL
minus ``lead`` (an upgrade too slow, etcd unreachable for that long) has its
HA VMs powered off, and restarted (here, if still its own, or elsewhere).
It does not cover a guard killed together with its peer; a hardware
watchdog (Proxmox's answer) would.

Test-driver hosts (``test:///``) need no guard: their domains live inside
the peer's process and die with it.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

__all__ = ["needs_guard", "Heartbeat", "ensure_guard", "fenced", "forget_fenced",
           "ha_domains", "run_guard", "LEAD", "POLL"]

LEAD = 1.0          # seconds before the lease's earliest expiry that the guard fences
POLL = 0.2          # how often the guard reads the heartbeat
_IDLE_EXIT = 5.0    # a guard without peer and without HA VM to fence exits after this
_BLIND_EXIT = 60.0  # ... or without peer and without libvirt (it can fence nothing)


def needs_guard(libvirt_uri: str) -> bool:
    """Whether VMs on this hypervisor outlive the peer's process."""
    return not libvirt_uri.startswith("test:")


def lead_for(ttl: float) -> float:
    """How long before the lease's earliest expiry the guard fences: one
    second, at most a quarter of the TTL (a refresh every TTL/3 may be late
    once without a fence)."""
    return min(LEAD, ttl / 4)


def _dir(state_dir: str) -> str:
    path = os.path.join(os.path.abspath(state_dir), "guard")
    os.makedirs(path, exist_ok=True)
    return path


def _write_json(path: str, value) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: str, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


class Heartbeat:
    """The peer's side: ``beat(until)`` after every lease renewal."""

    def __init__(self, state_dir: str):
        self.path = os.path.join(_dir(state_dir), "heartbeat")

    def beat(self, until: float) -> None:
        _write_json(self.path, {"pid": os.getpid(), "until": until, "written": time.monotonic()})


def fenced(state_dir: str) -> list[str]:
    """The uuids the guard powered off and no peer has dealt with yet."""
    value = _read_json(os.path.join(_dir(state_dir), "fenced"), [])
    return [u for u in value if isinstance(u, str)] if isinstance(value, list) else []


def _note_fenced(state_dir: str, uuid: str) -> None:
    path = os.path.join(_dir(state_dir), "fenced")
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = fenced(state_dir)
        if uuid not in known:
            _write_json(path, known + [uuid])


def forget_fenced(state_dir: str, uuids) -> None:
    """The peer has restarted (or given up) these fenced VMs."""
    path = os.path.join(_dir(state_dir), "fenced")
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_json(path, [u for u in fenced(state_dir) if u not in set(uuids)])


def ha_domains(conn, host: str) -> list:
    """``host``'s running peerctl domains whose policy is ``restart``."""
    import libvirt

    from engine.hypervisor.domain_xml import read_metadata
    found = []
    for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
        meta = read_metadata(dom)
        if meta.get("host") == host and meta.get("ha") == "restart":
            found.append(dom)
    return found


def _holder_pid(state_dir: str) -> int | None:
    """The pid of the guard holding this directory's lock, or None."""
    path = os.path.join(_dir(state_dir), "lock")
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_json(os.path.join(_dir(state_dir), "pid"), None)
            return pid if isinstance(pid, int) else -1
        fcntl.flock(lock, fcntl.LOCK_UN)
        return None


def ensure_guard(state_dir: str, host: str, libvirt_uri: str, lead: float,
                 timeout: float = 15.0) -> int:
    """The pid of this host's guard, started if none runs."""
    pid = _holder_pid(state_dir)
    if pid is not None:
        return pid
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    log = open(os.path.join(_dir(state_dir), "guard.log"), "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.hypervisor.guard", "--state-dir", state_dir,
         "--host", host, "--libvirt", libvirt_uri, "--lead", str(lead)],
        cwd=root, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)        # its own session: a signal to the peer's group spares it
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pid = _holder_pid(state_dir)        # lost a race to another guard: fine
            if pid is not None:
                return pid
            raise RuntimeError(f"the guard exited at once ({process.returncode}): see "
                               f"{os.path.join(_dir(state_dir), 'guard.log')}")
        if _holder_pid(state_dir) == process.pid:
            return process.pid
        time.sleep(0.05)
    raise RuntimeError("the guard did not start in time")


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _say(event: str, **fields) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp} guard {event} " + " ".join(f"{k}={v}" for k, v in fields.items()),
          flush=True)


def run_guard(state_dir: str, host: str, libvirt_uri: str, lead: float = LEAD,
              poll: float = POLL) -> int:
    import libvirt
    lock = open(os.path.join(_dir(state_dir), "lock"), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _say("already_running", host=host)
        return 0
    _write_json(os.path.join(_dir(state_dir), "pid"), os.getpid())
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    heartbeat_path = os.path.join(_dir(state_dir), "heartbeat")
    libvirt.registerErrorHandler(lambda *_: None, None)     # errors are raised, not printed
    conn = None
    idle_since = None
    _say("started", host=host, libvirt=libvirt_uri, lead=lead, pid=os.getpid())
    while not stopping:
        beat = _read_json(heartbeat_path, None)
        until = beat.get("until") if isinstance(beat, dict) else None
        now = time.monotonic()
        if isinstance(until, (int, float)) and now < until - lead:
            idle_since = None
            if conn is None:        # connected before it is needed, not when it is
                try:
                    conn = libvirt.open(libvirt_uri)
                except libvirt.libvirtError as exc:
                    _say("libvirt_unreachable", error=exc.get_error_message())
            time.sleep(min(poll, max(0.01, until - lead - now)))
            continue
        # The peer's lease may lapse within ``lead``: no HA VM may run here.
        try:
            if conn is None:
                conn = libvirt.open(libvirt_uri)
            running = ha_domains(conn, host)
            for dom in running:
                uuid = dom.UUIDString()
                _note_fenced(state_dir, uuid)
                # Paused first (its vCPUs stop at once), then powered off
                # (QEMU may take a moment to exit).
                for step in (dom.suspend, dom.destroy):
                    try:
                        step()
                    except libvirt.libvirtError as exc:
                        if exc.get_error_code() not in (libvirt.VIR_ERR_OPERATION_INVALID,
                                                        libvirt.VIR_ERR_NO_DOMAIN):
                            _say("fence_failed", vm=dom.name(), step=step.__name__,
                                 error=exc.get_error_message())
                _say("fenced", vm=dom.name(), uuid=uuid, took=round(time.monotonic() - now, 3),
                     late_by=round(now - (until - lead), 3) if until else "no heartbeat")
        except libvirt.libvirtError as exc:
            _say("libvirt_unreachable", error=exc.get_error_message())
            conn = None
            running = [None]
        peer_gone = not _alive(beat.get("pid") if isinstance(beat, dict) else None)
        if peer_gone:
            idle_since = idle_since or now
            if not running and now - idle_since >= _IDLE_EXIT:
                _say("exiting", why="no peer and nothing to fence")
                return 0
            if running == [None] and now - idle_since >= _BLIND_EXIT:
                _say("exiting", why="no peer, and libvirt unreachable: nothing to fence with")
                return 0
        else:
            idle_since = None
        time.sleep(poll)
    _say("stopped", why="SIGTERM")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.hypervisor.guard",
                                     description="Fence this host's HA VMs when its "
                                     "peer's lease may lapse (started by the peer).")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--libvirt", required=True)
    parser.add_argument("--lead", type=float, default=LEAD)
    args = parser.parse_args(argv)
    return run_guard(args.state_dir, args.host, args.libvirt, args.lead)


if __name__ == "__main__":
    sys.exit(main())
