"""A real OpenStack Placement on loopback, for the contract tests and the bench.

Expects ``openstack-placement`` to be installed (requirements-placement.txt);
installs nothing.  Writes ``placement.conf`` (``auth_strategy = noauth2``,
old policy defaults), runs ``placement-manage db sync`` and serves
``placement.wsgi.init_application()`` with wsgiref in a subprocess:

- by default on sqlite, single-threaded (sqlite answers "database is locked"
  to a threaded one);
- ``PlacementServer(dir, database=URL, threaded=True)``: on another
  database (PostgreSQL, see tests/support/postgres_server.py) with a thread
  per request, Placement's production setting.

Requests carry ``X-Auth-Token: admin``.

    python tests/support/placement_server.py DIR     # serve until interrupted
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from engine.core.etcd_server import free_port  # noqa: E402

__all__ = ["PlacementServer", "placement_installed"]

HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39",
           "Accept": "application/json"}

_CONF = """[DEFAULT]
debug = False
[api]
auth_strategy = noauth2
[placement_database]
connection = {db}
[oslo_policy]
enforce_scope = False
enforce_new_defaults = False
"""

_SERVE = """
import logging, os, sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass
class Backlog(WSGIServer):
    # wsgiref listens with a backlog of 5: eight racing clients overflow it and
    # a dropped SYN waits out TCP's retransmission (1 s, 3 s, ... ConnectTimeout)
    request_queue_size = 128
if sys.argv[2] == "threaded":
    class Backlog(ThreadingMixIn, Backlog):
        daemon_threads = True
from placement import wsgi
app = wsgi.init_application()
logging.getLogger().setLevel(logging.WARNING)
server = make_server("127.0.0.1", int(sys.argv[1]), app, server_class=Backlog,
                     handler_class=Quiet)
server.serve_forever()
"""


def placement_installed() -> bool:
    return importlib.util.find_spec("placement") is not None


class PlacementServer:
    def __init__(self, directory: str, port: int | None = None, *,
                 database: str | None = None, threaded: bool = False):
        self.directory = os.path.abspath(directory)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.database = database or "sqlite:///" + os.path.join(self.directory,
                                                                "placement.sqlite")
        self.threaded = threaded

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "PlacementServer":
        os.makedirs(self.directory, exist_ok=True)
        conf = os.path.join(self.directory, "placement.conf")
        with open(conf, "w") as f:
            f.write(_CONF.format(db=self.database))
        manage = shutil.which("placement-manage") or os.path.join(
            os.path.dirname(sys.executable), "placement-manage")
        subprocess.run([manage, "--config-file", conf, "db", "sync"], check=True,
                       capture_output=True, timeout=120)
        env = dict(os.environ, OS_PLACEMENT_CONFIG_DIR=self.directory)
        log = open(os.path.join(self.directory, "placement.log"), "ab")
        self.process = subprocess.Popen([sys.executable, "-c", _SERVE, str(self.port),
                                         "threaded" if self.threaded else "single"],
                                        env=env, stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"placement exited with {self.process.returncode}; "
                                   f"see {self.directory}/placement.log")
            try:
                if requests.get(self.url + "/", headers=HEADERS, timeout=1).ok:
                    return self
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"placement at {self.url} not up after {timeout}s")
            time.sleep(0.1)

    def wipe(self) -> None:
        """Delete every allocation and provider (children first)."""
        s = requests.Session()
        s.headers.update(HEADERS)
        rps = s.get(self.url + "/resource_providers").json()["resource_providers"]
        consumers = set()
        for rp in rps:
            got = s.get(f"{self.url}/resource_providers/{rp['uuid']}/allocations").json()
            consumers |= set(got["allocations"])
        for consumer in consumers:
            s.delete(f"{self.url}/allocations/{consumer}")
        depth = {}
        by_uuid = {rp["uuid"]: rp for rp in rps}
        for rp in rps:
            d, p = 0, rp
            while p.get("parent_provider_uuid"):
                d, p = d + 1, by_uuid[p["parent_provider_uuid"]]
            depth[rp["uuid"]] = d
        for uuid in sorted(depth, key=lambda u: -depth[u]):
            s.delete(f"{self.url}/resource_providers/{uuid}")
        s.close()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


if __name__ == "__main__":
    server = PlacementServer(sys.argv[1] if len(sys.argv) > 1 else "/tmp/placement").start()
    print(server.url, flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        server.stop()
