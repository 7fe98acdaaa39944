"""A Debian bookworm machine booted under a real systemd, for the package's
tests: what a fresh hypervisor would be, on this one.

Promises:

- :func:`cached_tree` is a ``debootstrap``-ed bookworm tree with systemd,
  apt, ``python3`` and ``python3-libvirt`` (so libvirt's test driver), built
  once into ``/var/cache/peerctl/nspawn/bookworm-<hash>`` (the hash is of
  what goes into it: a new package list builds a new tree) and never
  modified afterwards.  ``python -m tests.support.nspawn build`` builds it
  (``.ci/setup.sh`` does, before the tiers); :func:`why_not` says, in one
  line, why a machine cannot be booted here (no tree, no systemd-nspawn, not
  root), and the tests skip with that line.
- :class:`Machine` boots a throw-away copy of that tree with
  ``systemd-nspawn -b`` (systemd as the container's PID 1) in the host's
  network namespace, so the container reaches the suite's etcd on loopback.
  ``run`` executes a command inside, through ``nsenter`` into the
  container's PID 1's namespaces.  ``stop`` powers it off (SIGKILL to the
  nspawn process, by PID, if it will not) and removes the copy: nothing is
  left running or on disk.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
CACHE = "/var/cache/peerctl/nspawn"
# What a fresh host has before the package: systemd as init, apt to install
# the .deb, and the Debian packages the .deb depends on (already there, so
# `apt install ./peerctl_*.deb` needs no network).
PACKAGES = ("systemd", "systemd-sysv", "dbus", "apt", "ca-certificates",
            "python3", "python3-libvirt", "libvirt0", "procps", "iproute2")


def tree_path() -> str:
    """Where the cached tree for this package list lives."""
    digest = hashlib.sha256(" ".join((SUITE, MIRROR) + PACKAGES).encode()).hexdigest()[:12]
    return os.path.join(CACHE, f"{SUITE}-{digest}")


def cached_tree() -> str | None:
    """The cached tree, or None when it has not been built (completely)."""
    path = tree_path()
    return path if os.path.exists(os.path.join(path, ".peerctl-complete")) else None


def why_not() -> str | None:
    """Why no machine can be booted here, in one line; None when one can."""
    if os.geteuid() != 0:
        return "booting a systemd container needs root"
    if not shutil.which("systemd-nspawn"):
        return "systemd-nspawn is not installed (apt-get install systemd-container)"
    if not cached_tree():
        return (f"no cached {SUITE} tree at {tree_path()}: "
                "run `python -m tests.support.nspawn build` (.ci/setup.sh does)")
    return None


def build_tree() -> str:
    """Build the cached tree (debootstrap, then a few settings a booted
    container needs); a no-op when it exists.  Built beside its final path
    and renamed into place, so a half-built tree is never used."""
    path = tree_path()
    if cached_tree():
        return path
    if not shutil.which("debootstrap"):
        raise SystemExit("nspawn: debootstrap is missing (apt-get install debootstrap)")
    os.makedirs(CACHE, exist_ok=True)
    partial = path + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
                    SUITE, partial, MIRROR], check=True)
    # A container in the host's network namespace must not reconfigure it,
    # and needs no login prompt on its console.
    for unit in ("systemd-networkd.service", "systemd-resolved.service",
                 "systemd-timesyncd.service", "console-getty.service",
                 "getty@.service", "apt-daily.timer", "apt-daily-upgrade.timer",
                 "e2scrub_all.timer", "fstrim.timer"):
        link = os.path.join(partial, "etc/systemd/system", unit)
        if not os.path.lexists(link):
            os.symlink("/dev/null", link)
    with open(os.path.join(partial, "etc/hostname"), "w") as f:
        f.write("peerctl-deb-test\n")
    subprocess.run(["chroot", partial, "apt-get", "clean"], check=True)
    open(os.path.join(partial, ".peerctl-complete"), "w").close()
    os.rename(partial, path)
    return path


class Machine:
    """A booted copy of the cached tree.  ``with Machine() as m: m.run(...)``."""

    def __init__(self, name: str = "peerctl-deb", boot_timeout: float = 60.0,
                 binds: tuple[str, ...] = ()):
        """``binds``: the machine's directories the container sees at the
        same paths (a private libvirtd's socket, say)."""
        tree = cached_tree()
        if not tree:
            raise RuntimeError(why_not() or "no cached tree")
        self.name = name
        self.boot_timeout = boot_timeout
        self.workdir = tempfile.mkdtemp(prefix="peerctl-nspawn-")
        self.root = os.path.join(self.workdir, "root")
        self.console = os.path.join(self.workdir, "console.log")
        self.process: subprocess.Popen | None = None
        self.leader: int | None = None
        self.source = tree
        self.binds = tuple(binds)

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> "Machine":
        subprocess.run(["cp", "-a", "--reflink=auto", self.source, self.root], check=True)
        with open(self.console, "wb") as log:
            self.process = subprocess.Popen(
                ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit",
                 "--machine", self.name, "-D", self.root, "--boot",
                 "--console=passive", "--capability=all",
                 *[f"--bind={path}" for path in self.binds]],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            self.leader = self._wait_leader()
            self._wait_booted()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_leader(self) -> int:
        """The container's PID 1 as the host sees it: nspawn's child."""
        deadline = time.monotonic() + self.boot_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.process.returncode}: "
                                   + self.console_text()[-2000:])
            try:
                with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children") as f:
                    children = f.read().split()
            except FileNotFoundError:
                children = []
            if children:
                return int(children[0])
            time.sleep(0.1)
        raise RuntimeError("systemd-nspawn started no container")

    def _wait_booted(self) -> None:
        """Until systemd says the boot is over (running or degraded)."""
        deadline = time.monotonic() + self.boot_timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run("systemctl is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        failed = self.run("systemctl --failed --no-legend", check=False).stdout
        raise RuntimeError(f"container did not finish booting ({state!r}); failed units:\n"
                           f"{failed}\nconsole:\n{self.console_text()[-2000:]}")

    def stop(self) -> None:
        """Power off, then remove the copy; by PID, nothing left running."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            if self.leader:
                try:
                    os.kill(self.leader, signal.SIGRTMIN + 4)   # systemd: poweroff
                except ProcessLookupError:
                    pass
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "Machine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- inside ------------------------------------------------------------
    def run(self, command: str, check: bool = True, timeout: float = 120.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        """``command`` (a shell line) in the container, as its root, with its
        PATH and a clean environment; raises on a non-zero exit if ``check``."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"}
        done = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-p", "-C", "-r", "-w",
             "/bin/sh", "-c", command],
            env=env, capture_output=True, text=True, timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"in the container, `{command}` exited {done.returncode}:\n"
                                 f"{done.stdout}{done.stderr}")
        return done

    def host_pid(self, pid_inside: int) -> int | None:
        """The host's PID of the container's process ``pid_inside``."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:"):
                            pids = line.split()[1:]
                            break
                    else:
                        continue
            except OSError:
                continue
            if len(pids) > 1 and int(pids[-1]) == pid_inside and self._inside(int(entry)):
                return int(entry)
        return None

    def _inside(self, pid: int) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{self.leader}/ns/pid")
        except OSError:
            return False

    def copy_in(self, path: str, inside: str) -> None:
        """Put the host's file ``path`` at ``inside`` in the container."""
        target = os.path.join(self.root, inside.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)

    def console_text(self) -> str:
        try:
            with open(self.console, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def main(argv: list[str]) -> int:
    if argv[1:] == ["build"]:
        print(build_tree())
        return 0
    if argv[1:] == ["path"]:
        print(tree_path())
        return 0
    print("usage: python -m tests.support.nspawn build|path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
