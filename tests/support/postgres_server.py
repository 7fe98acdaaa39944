"""A throwaway PostgreSQL on loopback, for the Placement reference of the bench.

Uses Debian's server binaries (``apt-get install -y postgresql``); installs
nothing.  ``initdb`` a fresh cluster in a directory (trust authentication,
loopback only, fsync left on: the production setting), start ``postgres``
on a free port, create a database.  PostgreSQL refuses to run as root: as
root the server runs as the ``postgres`` user the package creates.  Stopped
by the PID it was started with.

    server = PostgresServer(directory).start()
    server.url("placement")     # postgresql+psycopg2://postgres@127.0.0.1:PORT/placement
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import time

from engine.core.etcd_server import free_port

__all__ = ["PostgresServer", "postgres_bin"]


def postgres_bin() -> str | None:
    """The directory of Debian's newest PostgreSQL server binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda path: int(path.split("/")[4]) if path.split("/")[4].isdigit() else 0)
    return os.path.dirname(found[-1]) if found else None


class PostgresServer:
    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.bin = postgres_bin()
        if self.bin is None:
            raise FileNotFoundError("PostgreSQL is not installed (apt-get install -y postgresql)")
        self._user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://{self._user}@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, argv: list) -> list:
        if os.geteuid() != 0:
            return argv
        return [shutil.which("runuser") or "/sbin/runuser", "-u", self._user, "--", *argv]

    def start(self, timeout: float = 60.0) -> "PostgresServer":
        data = os.path.join(self.directory, "data")
        os.makedirs(self.directory, exist_ok=True)
        if os.geteuid() == 0:       # the directory must be reachable by that user
            pw = pwd.getpwnam(self._user)
            os.chown(self.directory, pw.pw_uid, pw.pw_gid)
            os.chmod(self.directory, 0o700)
            _searchable_above(self.directory)
        subprocess.run(self._as_owner([os.path.join(self.bin, "initdb"), "-D", data,
                                       "--auth=trust", "-U", self._user, "-E", "UTF8"]),
                       check=True, capture_output=True, timeout=120)
        log = open(os.path.join(self.directory, "postgres.log"), "ab")
        self.process = subprocess.Popen(
            self._as_owner([os.path.join(self.bin, "postgres"), "-D", data,
                            "-p", str(self.port), "-k", self.directory,
                            "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"]),
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while subprocess.run([os.path.join(self.bin, "pg_isready"), "-h", "127.0.0.1",
                              "-p", str(self.port)], capture_output=True).returncode != 0:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}; "
                                   f"see {self.directory}/postgres.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"postgres on port {self.port} not ready after {timeout}s")
            time.sleep(0.1)
        return self

    def create_database(self, name: str) -> str:
        subprocess.run(self._as_owner([os.path.join(self.bin, "createdb"), "-h", "127.0.0.1",
                                       "-p", str(self.port), "-U", self._user, name]),
                       check=True, capture_output=True, timeout=60)
        return self.url(name)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)     # fast shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def _searchable_above(directory: str) -> None:
    """Let every user pass through (search, not list) each directory above
    ``directory`` that root alone may enter, as a temporary directory made
    by root is (``tempfile.mkdtemp``, pytest's ``tmp_path``): else initdb,
    run as ``postgres``, cannot reach its data directory."""
    import stat
    parent = os.path.dirname(directory)
    while parent and parent != os.path.dirname(parent):
        mode = os.stat(parent).st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(parent, stat.S_IMODE(mode) | stat.S_IXOTH)
        parent = os.path.dirname(parent)
