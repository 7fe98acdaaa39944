"""Start, kill and restart a local etcd (Debian's ``etcd`` binary): one
server, or a cluster of members on loopback.

Used by the test suite, the benchmarks and ``peerctl.py up``.  Ports are
picked free on loopback; the election timings are shortened so that a
restart on an existing data directory is healthy in a fraction of a second.
With ``tls`` (an :class:`~engine.core.certs.Issued` for etcd) both ports
speak TLS and want a client certificate signed by the same authority.
``compaction`` is etcd's own periodic auto-compaction (``"5m"``: keep five
minutes of history).
"""
from __future__ import annotations

import os
import shutil
import ssl
import signal
import socket
import subprocess
import time
import urllib.request

__all__ = ["EtcdServer", "EtcdCluster", "initial_cluster", "free_port", "etcd_binary"]


# "LOW-HIGH": free_port hands out the ports of that range in turn (the test
# suite gives each of its parallel workers a range of its own, below the
# kernel's ephemeral ports): a port a test frees and binds again is not
# taken meanwhile by another worker or by an outgoing connection.
PORTS_ENV = "PEERCTL_PORTS"


def free_port() -> int:
    ports = os.environ.get(PORTS_ENV)
    if ports:
        return _next_free_port(*(int(p) for p in ports.split("-")))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _next_free_port(low: int, high: int) -> int:
    """The next port of ``low``-``high`` that binds, in turn over every
    process given that range (a counter file under an exclusive lock)."""
    import fcntl
    import tempfile
    path = os.path.join(tempfile.gettempdir(), f"peerctl-ports-{low}-{high}")
    with open(path, "a+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        text = counter.read().strip()
        port = int(text) if text.isdigit() and low <= int(text) <= high else low
        for _ in range(high - low + 1):
            chosen, port = port, (low if port >= high else port + 1)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", chosen))
                except OSError:
                    continue
            break
        else:
            raise OSError(f"no free port in {low}-{high}")
        counter.seek(0)
        counter.truncate()
        counter.write(str(port))
    return chosen


def initial_cluster(peer_ports: dict[str, int], tls=None) -> str:
    """etcd's ``--initial-cluster``: ``name=URL`` of each member's peer port."""
    scheme = "https" if tls else "http"
    return ",".join(f"{name}={scheme}://127.0.0.1:{port}" for name, port in peer_ports.items())


def etcd_binary() -> str | None:
    return shutil.which("etcd") or (os.path.exists("/usr/bin/etcd") and "/usr/bin/etcd") or None


class EtcdServer:
    def __init__(self, data_dir: str, client_port: int | None = None,
                 peer_port: int | None = None, log_path: str | None = None, *,
                 name: str = "peerctl", tls=None, initial_cluster: str | None = None,
                 compaction: str | None = None, quota_bytes: int | None = None,
                 also_on: str | None = None):
        """``also_on``: one more address clients reach it at (beside
        loopback), on the same port."""
        self.data_dir = data_dir
        self.also_on = also_on
        self.quota_bytes = quota_bytes
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.log_path = log_path or os.path.join(data_dir + ".log")
        self.name = name
        self.tls = tls
        self.initial_cluster = initial_cluster
        self.compaction = compaction
        self.process: subprocess.Popen | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def client_urls(self) -> str:
        also = f",{self.scheme}://{self.also_on}:{self.client_port}" if self.also_on else ""
        return self.url + also

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"

    def command(self) -> list[str]:
        binary = etcd_binary()
        if not binary:
            raise FileNotFoundError("etcd not found: apt-get install etcd-server")
        command = [binary, "--name", self.name, "--data-dir", self.data_dir,
                   "--listen-client-urls", self.client_urls,
                   "--advertise-client-urls", self.client_urls,
                   "--listen-peer-urls", self.peer_url,
                   "--initial-advertise-peer-urls", self.peer_url,
                   "--initial-cluster", self.initial_cluster or f"{self.name}={self.peer_url}",
                   "--heartbeat-interval", "10", "--election-timeout", "100",
                   "--log-level", "warn"]
        if self.compaction:
            command += ["--auto-compaction-mode", "periodic",
                        "--auto-compaction-retention", self.compaction]
        if self.quota_bytes:
            command += ["--quota-backend-bytes", str(self.quota_bytes)]
        if self.tls:
            command += ["--client-cert-auth", "--trusted-ca-file", self.tls.cacert,
                        "--cert-file", self.tls.cert, "--key-file", self.tls.key,
                        "--peer-client-cert-auth", "--peer-trusted-ca-file", self.tls.cacert,
                        "--peer-cert-file", self.tls.cert, "--peer-key-file", self.tls.key]
        return command

    def start(self, timeout: float = 15.0) -> "EtcdServer":
        self.launch()
        self.wait_healthy(timeout)
        return self

    def launch(self) -> None:
        """Start the process without waiting for it to be healthy."""
        os.makedirs(os.path.dirname(os.path.abspath(self.data_dir)), exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_healthy(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1,
                                            context=self._ssl()) as reply:
                    if b'"true"' in reply.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"etcd at {self.url} not healthy after {timeout}s")

    def _ssl(self):
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.tls.cacert)
        context.load_cert_chain(self.tls.cert, self.tls.key)
        return context

    def running(self) -> bool:
        return bool(self.process) and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the data directory stays, as after a crash."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()


class EtcdCluster:
    """``size`` members ``m1``.. on loopback, each with its data directory
    ``<base>/m<i>``; ``urls`` is every client URL, comma-separated, the way
    clients are given them.  Members start together (a new cluster needs a
    quorum before any is healthy)."""

    def __init__(self, base_dir: str, size: int = 3, tls=None, compaction: str | None = None):
        self.base_dir = base_dir
        names = [f"m{i}" for i in range(1, size + 1)]
        ports = {name: (free_port(), free_port()) for name in names}
        initial = initial_cluster({name: ports[name][1] for name in names}, tls)
        self.members = [EtcdServer(os.path.join(base_dir, name), *ports[name],
                                   log_path=os.path.join(base_dir, f"{name}.log"),
                                   name=name, tls=tls, initial_cluster=initial,
                                   compaction=compaction)
                        for name in names]

    @property
    def urls(self) -> str:
        return ",".join(member.url for member in self.members)

    url = urls      # what a single EtcdServer's users read

    def start(self, timeout: float = 20.0) -> "EtcdCluster":
        os.makedirs(self.base_dir, exist_ok=True)
        for member in self.members:
            if not member.running():
                member.launch()
        for member in self.members:
            member.wait_healthy(timeout)
        return self

    def stop(self) -> None:
        for member in self.members:
            member.stop()
