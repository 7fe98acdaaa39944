"""The guard: a small process per host that stops the host's HA VMs before
its peer's lease can expire.

The cluster restarts a dead host's HA VMs elsewhere once the peer's lease
has expired plus a margin (:mod:`engine.hypervisor.ha.recoverer`).  That is safe only
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
  has none and checks it every few seconds;
- a guard whose peer is gone for good (its pid no longer runs the process
  that wrote the heartbeat: exited, a zombie, or the pid reused) and which
  has nothing left to fence exits; SIGTERM (what ``down`` sends, once
  nothing can restart a VM elsewhere) makes it exit at once;
- a libvirt that does not answer is retried with a growing delay (from
  :data:`POLL` to :data:`BACKOFF_CAP`), never past the moment a fence is
  due; each change (``libvirt_unreachable``, ``libvirt_reachable``,
  ``peer_gone``) is logged once, not at every poll.

Why a process and not libvirt's AUTODESTROY (a domain destroyed when the
connection that started it closes): AUTODESTROY covers the peer's death but
not a hang or a partition, a peer restart (an upgrade) would kill every HA
VM, and libvirt refuses to migrate such domains.  The guard survives a peer
restart: a new peer that renews its lease before ``until - lead`` keeps its
HA VMs running.  What it costs: a peer stopped for longer than its TTL
minus ``lead`` (an upgrade too slow, etcd unreachable for that long) has its
HA VMs powered off, and restarted (here, if still its own, or elsewhere).
A planned stop (SIGTERM) of a peer running HA VMs renews the lease one
last time and marks the heartbeat ``stopping``: the guard says so once
(``peer_stopping``) and fences only if no peer renews before ``until -
lead``.

Under systemd the guard stays in the peer unit's control group, and the
unit's ``KillMode=process`` (packaging/systemd/peerctl.service) keeps it
through ``systemctl stop``, ``restart`` and a crash of the peer.  Its lines
then go to the peer's stderr, so to the journal (when ``$JOURNAL_STREAM``
names that stderr), instead of ``guard/guard.log``.  A guard killed on
purpose together with its peer (``systemctl kill``, SIGKILL to both) while
QEMU lives on is not covered; a hardware watchdog (Proxmox's answer) would
be.

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
import threading
import time

__all__ = ["needs_guard", "Heartbeat", "ensure_guard", "stop_guard", "fenced",
           "forget_fenced", "ha_domains", "run_guard", "LEAD", "POLL", "BACKOFF_CAP"]

LEAD = 1.0          # seconds before the lease's earliest expiry that the guard fences
POLL = 0.2          # how often the guard reads the heartbeat
BACKOFF_CAP = 2.0   # the longest wait between two attempts to reach libvirt
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


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (the
    process state first), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def _start_time(pid: int):
    """When process ``pid`` started (clock ticks since boot), or None when
    it is gone; with the pid, it names one process for good."""
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


class Heartbeat:
    """The peer's side: ``beat(until)`` after every lease renewal.  Beats
    from several threads (the lease's keep-alive, a stop's or a hand-over's
    last renewal) are written one at a time, and one whose ``until`` is
    older than the last written is dropped: the file never goes back."""

    def __init__(self, state_dir: str):
        self.path = os.path.join(_dir(state_dir), "heartbeat")
        self.started = _start_time(os.getpid())
        self.until: float | None = None
        self._lock = threading.Lock()

    def beat(self, until: float, stopping: bool = False) -> None:
        with self._lock:
            if self.until is not None and until < self.until:
                return
            self._write(until, stopping)

    def stopping(self) -> None:
        """The peer stops on purpose, leaving its lease to run out: the last
        beat again, marked so (the guard still fences at ``until - lead``
        unless a new peer beats first)."""
        with self._lock:
            if self.until is not None:
                self._write(self.until, True)

    def _write(self, until: float, stopping: bool) -> None:
        self.until = until
        _write_json(self.path, {"pid": os.getpid(), "started": self.started, "until": until,
                                "written": time.monotonic(),
                                **({"stopping": True} if stopping else {})})


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

    from engine.hypervisor.domain.domain_xml import read_metadata
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
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))   # the tree's top
    from engine.core.service_notify import child_environ
    # Under systemd (the journal holds the peer's stderr) the guard writes
    # there too; otherwise to a file of its own.
    journal = _stderr_is_journal()
    log = None if journal else open(os.path.join(_dir(state_dir), "guard.log"), "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.hypervisor.ha.guard", "--state-dir", state_dir,
         "--host", host, "--libvirt", libvirt_uri, "--lead", str(lead)],
        cwd=root, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        env=child_environ(),            # it never speaks for the peer's unit
        start_new_session=True)        # its own session: a signal to the peer's group spares it
    if log is not None:
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


def _stderr_is_journal() -> bool:
    """This process's stderr is systemd's journal: ``$JOURNAL_STREAM``
    (``DEVICE:INODE``) names it (systemd.exec(5): a variable inherited by
    a process whose stderr went elsewhere names another)."""
    try:
        device, inode = (int(n) for n in os.environ.get("JOURNAL_STREAM", "").split(":"))
        stat = os.fstat(2)
    except (ValueError, OSError):
        return False
    return (stat.st_dev, stat.st_ino) == (device, inode)


def _is_guard_of(pid, state_dir: str) -> bool:
    """Process ``pid`` is the guard of ``state_dir`` (its command line says
    so; a zombie's is empty)."""
    from engine.hypervisor.local.daemons import cmdline
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    command = cmdline(pid)
    if "engine.hypervisor.ha.guard" not in command or "--state-dir" not in command:
        return False
    given = command[command.index("--state-dir") + 1:][:1]
    return bool(given) and os.path.realpath(given[0]) == os.path.realpath(state_dir)


def stop_guard(state_dir: str, grace: float = 5.0) -> tuple[int | None, str]:
    """Stop the guard of ``state_dir`` by the pid it recorded, if that
    process is still this directory's guard: SIGTERM, SIGKILL after
    ``grace`` s.  ``(pid, what)``, what = stopped, killed or not running.
    Only once nothing can restart this host's HA VMs elsewhere (``down``
    stops etcd first): a guard stopped earlier could not fence them."""
    pid = _read_json(os.path.join(state_dir, "guard", "pid"), None)
    if not _is_guard_of(pid, state_dir):
        return (pid if isinstance(pid, int) else None), "not running"
    from engine.hypervisor.local.daemons import terminate
    return pid, terminate(pid, lambda: _is_guard_of(pid, state_dir), grace)


def _peer_alive(beat) -> bool:
    """The process that wrote the heartbeat ``beat`` still runs: its pid
    is there, is not a zombie (a parent that never reaps keeps one, and
    ``kill(pid, 0)`` succeeds on it) and, when the heartbeat says when it
    started, started then (not a stranger that reused the pid)."""
    pid = beat.get("pid") if isinstance(beat, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    fields = _stat(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    started = beat.get("started")
    return not isinstance(started, int) or (len(fields) > 19 and int(fields[19]) == started)


def _say(event: str, **fields) -> None:
    """One log line: ``time guard event k=v``, or with $PEERCTL_LOG_FORMAT
    json (the peer's ``log_format``), one object as the peer's lines are."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    if os.environ.get("PEERCTL_LOG_FORMAT") == "json":
        import json
        print(json.dumps({"timestamp": stamp + "Z", "level": "info", "logger": "guard",
                          "event": event, **fields}, default=repr), flush=True)
        return
    print(f"{stamp} guard {event} " + " ".join(f"{k}={v}" for k, v in fields.items()),
          flush=True)


class _Link:
    """The guard's connection to libvirt: opened when needed; while the
    daemon does not answer, tried again after a delay that doubles from
    :data:`POLL` up to :data:`BACKOFF_CAP`; each change of state logged
    once."""

    def __init__(self, uri: str, cap: float = BACKOFF_CAP):
        self.uri, self.cap = uri, cap
        self.conn = None
        self.down_since = None      # monotonic time of the first failure, while unreachable
        self.attempts = 0           # failed attempts since then
        self.delay = POLL
        self.retry_at = 0.0

    def get(self):
        """An open connection, or None while libvirt does not answer (and
        before the back-off allows the next attempt)."""
        import libvirt
        if self.conn is not None:
            return self.conn
        now = time.monotonic()
        if now < self.retry_at:
            return None
        try:
            self.conn = libvirt.open(self.uri)
        except libvirt.libvirtError as exc:
            self.lost(exc)
            return None
        if self.down_since is not None:
            _say("libvirt_reachable", after=round(now - self.down_since, 1),
                 attempts=self.attempts + 1)
        self.down_since, self.attempts, self.delay = None, 0, POLL
        return self.conn

    def lost(self, exc) -> None:
        """The connection failed (``exc``, a libvirtError): drop it, try
        again later."""
        now = time.monotonic()
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None
        self.attempts += 1
        if self.down_since is None:
            self.down_since = now
            _say("libvirt_unreachable", error=repr(exc.get_error_message()),
                 retry=f"every {POLL}s doubling up to {self.cap}s")
        self.retry_at = now + self.delay
        self.delay = min(self.delay * 2, self.cap)


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
    link = _Link(libvirt_uri)
    idle_since = None           # since when the peer is gone
    told_stopping = None        # the stopping heartbeat already said
    failures = set()            # fence failures already said
    _say("started", host=host, libvirt=libvirt_uri, lead=lead, pid=os.getpid())
    while not stopping:
        beat = _read_json(heartbeat_path, None)
        until = beat.get("until") if isinstance(beat, dict) else None
        now = time.monotonic()
        if isinstance(until, (int, float)) and beat.get("stopping") \
                and beat.get("written") != told_stopping:
            told_stopping = beat.get("written")
            _say("peer_stopping", pid=beat.get("pid"),
                 fence_in=f"{max(until - lead - now, 0):.1f}s unless a peer renews first")
        if isinstance(until, (int, float)) and now < until - lead:
            idle_since = None
            link.get()          # connected before it is needed, not when it is
            time.sleep(min(poll, max(0.01, until - lead - now)))
            continue
        # The peer's lease may lapse within ``lead``: no HA VM may run here.
        running = None          # unknown: libvirt does not answer
        conn = link.get()
        if conn is not None:
            try:
                running = ha_domains(conn, host)
                for dom in running:
                    if _fence(state_dir, dom, failures):
                        _say("fenced", vm=dom.name(), uuid=dom.UUIDString(),
                             took=round(time.monotonic() - now, 3),
                             late_by=round(now - (until - lead), 3) if until
                             else "no heartbeat")
            except libvirt.libvirtError as exc:
                link.lost(exc)
                running = None
        if not _peer_alive(beat):
            if idle_since is None:
                idle_since = now
                _say("peer_gone", pid=beat.get("pid") if isinstance(beat, dict) else None)
            if running == [] and now - idle_since >= _IDLE_EXIT:
                _say("exiting", why="no peer and nothing to fence")
                return 0
            if running is None and now - idle_since >= _BLIND_EXIT:
                _say("exiting", why="no peer, and libvirt unreachable: nothing to fence with")
                return 0
        else:
            idle_since = None
        time.sleep(poll)
    _say("stopped", why="SIGTERM")
    return 0


def _fence(state_dir: str, dom, failures: set) -> bool:
    """Note ``dom`` as fenced, then pause it (its vCPUs stop at once) and
    power it off (QEMU may take a moment to exit); whether it is off.  A
    step that fails is said once per VM, step and error; a lost connection
    is raised."""
    import libvirt
    _note_fenced(state_dir, dom.UUIDString())
    off = True
    for step in (dom.suspend, dom.destroy):
        try:
            step()
        except libvirt.libvirtError as exc:
            code = exc.get_error_code()
            if code in (libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_ERR_NO_DOMAIN):
                continue
            if code in (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_RPC,
                        libvirt.VIR_ERR_NO_CONNECT, libvirt.VIR_ERR_INVALID_CONN):
                raise
            off = False
            said = (dom.UUIDString(), step.__name__, exc.get_error_message())
            if said not in failures:
                failures.add(said)
                _say("fence_failed", vm=dom.name(), step=step.__name__,
                     error=repr(exc.get_error_message()))
    return off


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.hypervisor.ha.guard",
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
