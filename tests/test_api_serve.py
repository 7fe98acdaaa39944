"""``serve --api``: the API of a cluster from a machine that is not a host,
stopped by SIGTERM; addresses it must not or cannot listen on are refused in
one line."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys

import requests

from tests.support import PEERCTL, ROOT, wait_for
from tests.support.api_client import free_port
from tests.support.cluster import refused


def test_serve_answers_and_stops_on_sigterm(cluster, tmp_path):
    secret = cluster.cli_json("token", "create", "--role", "viewer")["secret"]
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    process = subprocess.Popen([sys.executable, PEERCTL, "serve", "--api", f"127.0.0.1:{port}"],
                               env=cluster.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def answering():
            try:
                return requests.get(url + "/v1/hosts", timeout=5).status_code == 401
            except OSError:
                return False
        wait_for(answering, what="serve listening")
        hosts = requests.get(url + "/v1/hosts", headers={"Authorization": f"Bearer {secret}"},
                             timeout=5)
        assert hosts.status_code == 200 and hosts.json() == []
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        with socket.socket() as sock:    # nobody listens there any more
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def test_addresses_that_cannot_be_served_are_refused(cluster):
    refused(cluster, ["serve", "--api", "192.0.2.1:8080"], 2, "only on loopback")
    refused(cluster, ["serve"], 2, "serve needs --api")
    refused(cluster, ["serve", "--api", "localhost"], 2, "want ADDR:PORT")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        refused(cluster, ["serve", "--api", f"127.0.0.1:{port}"], 2, "cannot listen")
    refused(cluster, ["peer", "--host", "h1", "--libvirt", "test:///default", "--api", "x:y"],
            2, "want ADDR:PORT")


def test_the_printed_url_is_a_base_to_append_paths_to(cluster, tmp_path):
    """``${api}/v1/hosts`` with the URL ``serve`` prints (as ``up`` prints
    its peers'): no trailing slash to make ``//v1/hosts``."""
    import re
    secret = cluster.cli_json("token", "create", "--role", "viewer")["secret"]
    port = free_port()
    log_path = tmp_path / "serve.log"
    process = subprocess.Popen([sys.executable, PEERCTL, "serve", "--api", f"127.0.0.1:{port}"],
                               env=cluster.env, cwd=ROOT, stdout=open(log_path, "wb"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        printed = wait_for(lambda: re.search(r" at (\S+?),", log_path.read_text()),
                           what="serve's URL")
        api = printed.group(1)
        assert api == f"http://127.0.0.1:{port}"
        hosts = requests.get(f"{api}/v1/hosts", headers={"Authorization": f"Bearer {secret}"},
                             timeout=5)
        assert hosts.status_code == 200 and hosts.json() == []
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
