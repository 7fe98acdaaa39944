"""A private libvirtd: one more KVM host on this machine.

libvirt refuses to migrate between two daemons that share a host UUID, and a
root libvirtd keeps its state in places compiled into it (``/etc/libvirt``,
``/run/libvirt``, ``/var/lib/libvirt``, ``/var/log/libvirt``,
``/var/cache/libvirt``; no setting moves them).  So a private daemon runs as
root, "system" like any other, in a mount namespace of its own where those
five directories are bind mounts of ``etc/``, ``run/``, ``lib/``, ``log/``
and ``cache/`` under its directory, with a ``host_uuid`` of its own in its
``libvirtd.conf`` and a virtlogd of its own beside it (same mounts), which
writes its guests' serial console logs.  Outside, a client reaches it at
:attr:`PrivateLibvirtd.uri`, ``qemu+unix:///system?socket=DIR/run/libvirt-sock``.
Optionally both run inside a network namespace (``ip netns exec``): the
daemon's network driver and its migration ports then see the namespace's
interfaces, never the machine's.

Promises:
- :meth:`PrivateLibvirtd.start` returns once ``libvirt.open(uri)`` works and
  the daemon reports its own host UUID, or raises
  :class:`~engine.errors.Failed` with the end of the daemon's log (and
  stops the virtlogd it started for it, which no guest uses); it starts
  only what is not running, and reuses a daemon or virtlogd only when the
  PID (from the record or the PID file) still runs the very command line
  this directory gives it, never a stranger that reused the PID;
- :meth:`PrivateLibvirtd.stop` signals recorded PIDs only, after the same
  check; it leaves guests running, as any libvirtd restart does (QEMU is
  daemonised, not libvirtd's child), and leaves virtlogd running while they
  do, since their consoles go through it; the next ``start`` reattaches;
- :meth:`PrivateLibvirtd.guest_pids` and :meth:`PrivateLibvirtd.dnsmasq_pid`
  read libvirt's own status and PID files and check the command line, so a
  guest's QEMU or the guest network's DHCP server is found (and ``down``
  stops it by PID) even with libvirtd stopped;
- the host UUID is a function of the directory: the same daemon keeps it
  across restarts, two directories never share one;
- guests of a private daemon run outside cgroups: libvirt names a guest's
  cgroup after its domain id and name, which two daemons numbering their
  domains from 1 would share (inside a network namespace ``ip netns exec``
  mounts a fresh /sys without them; outside, the daemon's mount namespace
  drops them);
- cheap to import: libvirt is loaded only to wait for the daemon.  No virsh:
  the binaries run are libvirtd, virtlogd, ip, unshare, mount and sh.
"""
from __future__ import annotations

import glob
import ipaddress
import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET
from urllib.parse import quote

from engine.errors import Failed

__all__ = ["PrivateLibvirtd", "ensure_netns", "delete_netns", "netns_exists", "netns_pids", "ip",
           "cmdline", "terminate"]

# The directories a root libvirtd and virtlogd use, and what each is bound to.
MOUNTS = (("etc", "/etc/libvirt"), ("run", "/run/libvirt"), ("lib", "/var/lib/libvirt"),
          ("log", "/var/log/libvirt"), ("cache", "/var/cache/libvirt"))
# The host UUID namespace: uuid5 of the daemon's directory in it.
_UUID_NAMESPACE = uuidlib.UUID("7e1b5f0c-64a4-4f39-9a2e-2f4d1e0c9b51")
# A UNIX socket path holds at most 107 bytes (sun_path is 108 with its NUL).
_SUN_PATH_MAX = 107
# The system daemon's cache of QEMU's capabilities: a copy saves the ~8 s a
# daemon spends probing QEMU on its first connection; libvirt checks every
# entry (QEMU's and libvirtd's ctime, kernel, microcode) and re-probes a stale one.
_SYSTEM_CAPS_CACHE = "/var/cache/libvirt/qemu/capabilities"
# The user Debian's libvirt runs QEMU as (qemu.conf's ``user`` default).
QEMU_USER = "libvirt-qemu"

# Run in the new mount namespace, then exec the daemon (same PID throughout:
# unshare and ip netns exec exec too, so the PID recorded is the daemon's).
_ENTER = """set -e
dir=$1; shift
for pair in {pairs}; do
    mkdir -p "${{pair#*:}}"
    mount --bind "$dir/${{pair%%:*}}" "${{pair#*:}}"
done
if mountpoint -q /sys/fs/cgroup; then umount -R -l /sys/fs/cgroup; fi
exec "$@"
""".format(pairs=" ".join(f"{sub}:{target}" for sub, target in MOUNTS))


class PrivateLibvirtd:
    """A root libvirtd and its virtlogd living in ``base_dir/name``.

    ``netns`` names a network namespace (``ensure_netns``) to run both in.
    Attributes: ``dir``, ``name``, ``netns``, ``tls``, ``host_uuid``,
    ``socket``, ``uri`` and ``log`` (libvirtd's)."""

    def __init__(self, base_dir: str, name: str, netns: str | None = None,
                 tls: tuple[str, str, int] | None = None):
        """``tls``: ``(pki, address, port)``, to listen for libvirt's remote
        protocol over TLS on ``address:port`` too, with the certificate, key
        and authority in ``pki`` under libvirt's names (``servercert.pem``,
        ``serverkey.pem``, ``cacert.pem``: ``tls certs --libvirt``); clients
        must show a certificate of that authority."""
        self.name = name
        self.tls = tls
        self.dir = os.path.abspath(os.path.join(base_dir, name))
        self.netns = netns
        self.host_uuid = str(uuidlib.uuid5(_UUID_NAMESPACE, self.dir))
        self.socket = os.path.join(self.dir, "run", "libvirt-sock")
        self.uri = f"qemu+unix:///system?socket={quote(self.socket, safe='/')}"
        self.log = os.path.join(self.dir, "libvirtd.log")
        self._virtlogd_log = os.path.join(self.dir, "virtlogd.log")
        self._pids = {"libvirtd": None, "virtlogd": None}     # from a record
        self._commands = {}         # as recorded, when restored from a record
        self._children = []         # Popen objects, reaped once stopped

    def __repr__(self):
        return f"PrivateLibvirtd({self.dir!r}, netns={self.netns!r})"

    def tls_uri(self, pkipath: str) -> str:
        """The daemon over TLS (``tls`` given), as a client whose
        certificate, key and authority are in ``pkipath`` reaches it."""
        _pki, address, port = self.tls
        return f"qemu+tls://{address}:{port}/system?pkipath={quote(pkipath, safe='/')}"

    # -- the command lines, which identify the processes in /proc ----------------

    def _command(self, what: str) -> list[str]:
        if what in self._commands:
            return self._commands[what]
        return [_binary(what), "--config", os.path.join(self.dir, "etc", f"{what}.conf"),
                "--pid-file", os.path.join(self.dir, f"{what}.pid"),
                *(["--listen"] if what == "libvirtd" and self.tls else [])]

    def _launcher(self, what: str) -> list[str]:
        enter = [_binary("unshare"), "--mount", "--propagation", "private",
                 "/bin/sh", "-c", _ENTER, "sh", self.dir]
        netns = [_binary("ip"), "netns", "exec", self.netns] if self.netns else []
        return netns + enter + self._command(what)

    def _pid(self, what: str) -> int | None:
        """The PID running this directory's ``what``, or None."""
        candidates = [self._pids[what]]
        try:
            with open(os.path.join(self.dir, f"{what}.pid")) as f:
                candidates.append(int(f.read().strip() or 0))
        except (OSError, ValueError):
            pass
        for pid in candidates:
            if pid and cmdline(pid) == self._command(what):
                return pid
        return None

    def clear_guests(self) -> None:
        """Destroy and undefine every domain of this daemon (what a failed
        test or benchmark left); nothing when it does not answer."""
        import libvirt
        if not self.running():
            return
        try:
            conn = libvirt.open(self.uri)
        except libvirt.libvirtError:
            return
        try:
            for dom in conn.listAllDomains(0):
                try:
                    if dom.isActive():
                        dom.destroy()
                    if dom.isPersistent():
                        dom.undefineFlags(
                            libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA
                            | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)
                except libvirt.libvirtError:
                    pass
        finally:
            conn.close()

    def running(self) -> bool:
        """libvirtd of this directory runs (virtlogd alone does not count)."""
        return self._pid("libvirtd") is not None

    # -- start --------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> "PrivateLibvirtd":
        """Start what is not running; return once the daemon answers at
        :attr:`uri` with its own host UUID (``Failed`` past ``timeout``)."""
        if len(self.socket) > _SUN_PATH_MAX:
            raise Failed(f"the socket of the private libvirtd in {self.dir} would be "
                         f"{len(self.socket)} bytes long, over the {_SUN_PATH_MAX} a UNIX "
                         "socket path may have: use a shorter state directory")
        if os.geteuid() != 0:
            raise Failed("a private libvirtd runs as root (it bind-mounts libvirt's "
                         "directories in a mount namespace of its own)")
        for tool in ("libvirtd", "virtlogd", "unshare") + (("ip",) if self.netns else ()):
            if not os.path.exists(_binary(tool)):
                raise Failed(f"no {tool}: a private libvirtd needs it "
                             "(bash .ci/libvirtd.sh installs libvirt)")
        self._prepare()
        deadline = time.monotonic() + timeout
        launched = self._pid("virtlogd") is None
        if launched:
            self._launch("virtlogd", self._virtlogd_log)
        try:
            self._wait(deadline, "virtlogd", self._virtlogd_log,
                       lambda: _accepts(os.path.join(self.dir, "run", "virtlogd-sock")))
            if self._pid("libvirtd") is None:
                self._launch("libvirtd", self.log)
            self._wait(deadline, "libvirtd", self.log, self._answers)
        except Failed:
            if launched and not self.guest_pids():
                self._stop("virtlogd", 5.0)     # started for a daemon that never came
            raise
        return self

    def _prepare(self) -> None:
        for sub, _target in MOUNTS:
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        # The QEMU of a guest (not root) reaches its files under it.
        os.chmod(self.dir, 0o755)
        # Root only: no one else may drive (or read) a private daemon.
        settings = {"libvirtd": {"host_uuid": self.host_uuid, "unix_sock_rw_perms": "0700",
                                 "unix_sock_ro_perms": "0700", "log_outputs": "3:stderr"},
                    "virtlogd": {"log_outputs": "3:stderr"}}
        if self.tls:
            pki, address, port = self.tls
            settings["libvirtd"].update({
                "listen_tls": 1, "listen_tcp": 0, "listen_addr": address, "tls_port": str(port),
                "cert_file": os.path.join(pki, "servercert.pem"),
                "key_file": os.path.join(pki, "serverkey.pem"),
                "ca_file": os.path.join(pki, "cacert.pem")})
            # QEMU's migration and disk streams: to and from this address,
            # over TLS with the same certificate when ``pki/qemu`` has it
            # (libvirt refuses a loopback migration_host: a daemon on
            # 127.0.0.1 keeps the defaults)
            if not ipaddress.ip_address(address).is_loopback:
                settings["qemu"] = {"migration_host": address, "migration_address": address}
            else:
                settings["qemu"] = {}
            if os.path.isdir(os.path.join(pki, "qemu")):
                settings["qemu"]["migrate_tls_x509_cert_dir"] = self._qemu_pki(pki)
        qemu_conf = os.path.join(self.dir, "etc", "qemu.conf")
        if "qemu" not in settings and os.path.exists(qemu_conf):
            os.unlink(qemu_conf)        # written for TLS by an earlier start
        for what, values in settings.items():
            _write(os.path.join(self.dir, "etc", f"{what}.conf"),
                   "# Written by peerctl (engine/hypervisor/local/daemons.py) at every start.\n"
                   + "".join(f'{key} = "{value}"\n' if isinstance(value, str)
                             else f"{key} = {value}\n" for key, value in values.items()))
        cache = os.path.join(self.dir, "cache", "qemu", "capabilities")
        if not glob.glob(os.path.join(cache, "*.xml")):
            os.makedirs(cache, exist_ok=True)
            for entry in glob.glob(os.path.join(_SYSTEM_CAPS_CACHE, "*.xml")):
                try:
                    shutil.copy2(entry, cache)
                except OSError:
                    pass            # only a head start: the daemon probes instead

    def _qemu_pki(self, pki: str) -> str:
        """A copy of ``pki/qemu`` QEMU's user can read (QEMU, not libvirtd,
        opens the key), in this daemon's directory."""
        copy = os.path.join(self.dir, "qemu-tls")
        os.makedirs(copy, exist_ok=True)
        try:
            owner = pwd.getpwnam(QEMU_USER)
            ids = (owner.pw_uid, owner.pw_gid)
        except KeyError:
            ids = None          # QEMU runs as root
        for name in os.listdir(os.path.join(pki, "qemu")):
            shutil.copyfile(os.path.join(pki, "qemu", name), os.path.join(copy, name))
            os.chmod(os.path.join(copy, name), 0o600 if name.endswith("key.pem") else 0o644)
            if ids:
                os.chown(os.path.join(copy, name), *ids)
        if ids:
            os.chown(copy, *ids)
        os.chmod(copy, 0o700)
        return copy

    def _launch(self, what: str, log_path: str) -> None:
        with open(log_path, "ab") as log:
            self._children.append(subprocess.Popen(
                self._launcher(what), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True))
        self._pids[what] = self._children[-1].pid

    def _wait(self, deadline: float, what: str, log_path: str, ready) -> None:
        while True:
            if self._pid(what) is None and not self._starting(what):
                raise Failed(f"{what} of the private libvirtd in {self.dir} exited; "
                             f"see {log_path}:\n{_tail(log_path)}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise Failed(f"{what} of the private libvirtd in {self.dir} not ready in "
                             f"time; see {log_path}:\n{_tail(log_path)}")
            time.sleep(0.05)

    def _starting(self, what: str) -> bool:
        """The launcher of ``what`` still runs (its shell, before the exec)."""
        pid = self._pids[what]
        return bool(pid) and any(c.pid == pid and c.poll() is None for c in self._children)

    def _answers(self) -> bool:
        """The daemon answers at :attr:`uri` and is this one (its host UUID);
        the migration directory then belongs to its QEMU's user."""
        if not os.path.exists(self.socket):
            return False
        import libvirt
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)   # no stray stderr
        try:
            conn = libvirt.open(self.uri)
        except libvirt.libvirtError:
            return False
        try:
            capabilities = ET.fromstring(conn.getCapabilities())
        except libvirt.libvirtError:
            return False
        finally:
            conn.close()
        if capabilities.findtext("host/uuid") != self.host_uuid:
            raise Failed(f"the daemon at {self.socket} reports host UUID "
                         f"{capabilities.findtext('host/uuid')}, not {self.host_uuid}: "
                         "another libvirtd owns that socket")
        return True

    # -- stop ---------------------------------------------------------------------

    def guests(self) -> list[str]:
        """Names of this daemon's guests whose QEMU still runs, read from
        libvirt's status files (so it works with libvirtd stopped)."""
        return sorted(self.guest_pids())

    def guest_pids(self) -> dict[str, int]:
        """``{name: pid}`` of this daemon's guests whose QEMU still runs:
        the PID in libvirt's status file, running a QEMU."""
        found = {}
        for status in glob.glob(os.path.join(self.dir, "run", "qemu", "*.xml")):
            try:
                pid = int(ET.parse(status).getroot().get("pid") or 0)
            except (OSError, ET.ParseError, ValueError):
                continue
            if pid and "qemu" in os.path.basename((cmdline(pid) or [""])[0]):
                found[os.path.basename(status)[:-len(".xml")]] = pid
        return found

    def dnsmasq_pid(self, network: str = "default") -> int | None:
        """The PID of the dnsmasq libvirt runs for ``network`` (from the
        network driver's PID file here), when it still runs one, inside
        this daemon's network namespace."""
        try:
            with open(os.path.join(self.dir, "run", "network", f"{network}.pid")) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            return None
        if not pid or os.path.basename((cmdline(pid) or [""])[0]) != "dnsmasq":
            return None
        if self.netns and pid not in netns_pids(self.netns):
            return None
        return pid

    def stop_dnsmasq(self, network: str = "default", grace: float = 5.0) -> tuple[int | None, str]:
        """Stop the dnsmasq of ``network`` left by a daemon that no longer
        runs (a running daemon stops it with the network): ``(pid, what)``."""
        pid = self.dnsmasq_pid(network)
        if pid is None:
            return None, "not running"
        return pid, terminate(pid, lambda: self.dnsmasq_pid(network) == pid, grace)

    def stop(self, grace: float = 15.0) -> dict:
        """Stop libvirtd (SIGTERM, SIGKILL after ``grace`` s), then virtlogd
        unless guests still run.  ``{"libvirtd": what, "virtlogd": what,
        "guests": [names]}``, what = stopped, killed, not running or (virtlogd)
        kept."""
        outcome = {"libvirtd": self._stop("libvirtd", grace)}
        guests = self.guests()
        outcome["virtlogd"] = "kept" if guests else self._stop("virtlogd", grace)
        outcome["guests"] = guests
        return outcome

    def _stop(self, what: str, grace: float) -> str:
        pid = self._pid(what)
        if pid is None:
            return "not running"
        command = self._command(what)

        def still_ours() -> bool:
            self._reap(pid)
            return cmdline(pid) == command
        outcome = terminate(pid, still_ours, grace)
        if outcome == "killed":
            self._reap(pid, 5.0)
        return outcome

    def _reap(self, pid: int, timeout: float = 0.0) -> None:
        """Collect our own child once it exits (else a zombie holds its PID)."""
        for child in self._children:
            if child.pid == pid:
                try:
                    child.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass

    # -- records ------------------------------------------------------------------

    def record(self) -> dict:
        """What to persist (JSON): the PIDs and command lines, as for every
        process ``peerctl up`` records, with the URI and directories."""
        return {"name": self.name, "base_dir": os.path.dirname(self.dir), "dir": self.dir,
                "netns": self.netns, "uri": self.uri, "host_uuid": self.host_uuid,
                "pid": self._pid("libvirtd"), "cmd": self._command("libvirtd"),
                "log": self.log, "tls": list(self.tls) if self.tls else None,
                "virtlogd": {"pid": self._pid("virtlogd"), "cmd": self._command("virtlogd"),
                             "log": self._virtlogd_log}}

    @classmethod
    def from_record(cls, record: dict) -> "PrivateLibvirtd":
        daemon = cls(record["base_dir"], record["name"], record.get("netns"),
                     tuple(record["tls"]) if record.get("tls") else None)
        for what, recorded in (("libvirtd", record), ("virtlogd", record.get("virtlogd") or {})):
            daemon._pids[what] = recorded.get("pid")
            if recorded.get("cmd"):
                daemon._commands[what] = list(recorded["cmd"])
        return daemon


# -- network namespaces -------------------------------------------------------------

def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join("/run/netns", name))


def ensure_netns(name: str) -> bool:
    """The network namespace ``name`` exists, its loopback up; True when this
    call created it."""
    created = False
    if not netns_exists(name):
        ip("netns", "add", name)
        created = True
    ip("-n", name, "link", "set", "lo", "up")
    return created


def netns_pids(name: str) -> list[int]:
    """The processes inside the network namespace ``name``."""
    if not netns_exists(name):
        return []
    return [int(p) for p in ip("netns", "pids", name).split()]


def delete_netns(name: str, settle: float = 0.0) -> bool:
    """Delete the namespace ``name`` when nothing runs in it any more; True
    when it is gone.  One with processes left (guests) is kept: deleting it
    would only drop its name, and the next ``ensure_netns`` would make a
    second namespace beside the one they live in.  ``settle``: seconds to
    wait for processes still leaving it (stopped, not yet gone)."""
    if not netns_exists(name):
        return True
    deadline = time.monotonic() + settle
    while netns_pids(name):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    ip("netns", "delete", name)
    return True


def ip(*args: str) -> str:
    """``ip ARGS``'s output; :class:`~engine.errors.Failed` with its error."""
    done = subprocess.run([_binary("ip"), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise Failed(f"ip {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout


# -- helpers ------------------------------------------------------------------------

def _binary(name: str) -> str:
    """``name`` on PATH, else where Debian puts it (PATH may lack sbin)."""
    found = shutil.which(name)
    if found:
        return found
    for directory in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        if os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    return os.path.join("/usr/sbin", name)


def terminate(pid: int, still_ours, grace: float) -> str:
    """SIGTERM ``pid``, SIGKILL after ``grace`` s while ``still_ours()``
    (the caller's check that the PID still runs what it signalled): stopped
    or killed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "stopped"
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not still_ours():
            return "stopped"
        time.sleep(0.05)
    if not still_ours():
        return "stopped"
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "stopped"
    return "killed"


def cmdline(pid: int) -> list[str]:
    """The command line process ``pid`` runs ([] when it is gone).

    A process in the middle of exec() shows an empty command line for an
    instant (the kernel sets the new one last): such a live process is read
    again until its new command line shows, for at most a second."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = [p.decode(errors="replace") for p in f.read().split(b"\0") if p]
        except OSError:
            return []       # gone
        if args or not _user_process(pid) or time.monotonic() > deadline:
            return args     # a zombie or a kernel thread has none either
        time.sleep(0.002)


_PF_KTHREAD = 0x00200000


def _user_process(pid: int) -> bool:
    """``pid`` is alive, not a zombie and not a kernel thread."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        state, flags = fields[0], int(fields[6])
    except (OSError, IndexError, ValueError):
        return False
    return state not in (b"Z", b"X") and not flags & _PF_KTHREAD


def _accepts(path: str) -> bool:
    """Something listens on the UNIX socket ``path`` (a file left by a killed
    daemon refuses)."""
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return ""
