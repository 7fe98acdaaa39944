"""A host's half of the pair checks, on loopback: probes say in words why a
port does not answer, and a migration port opened for probes accepts them
for as long as asked, then closes by itself."""
from __future__ import annotations

import socket

from engine.hypervisor.host import probes
from tests.support import wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_closed_port_is_refused_and_an_open_one_answers_and_the_target_is_kept():
    closed = free_port()
    with socket.socket() as open_one:
        open_one.bind(("127.0.0.1", 0))
        open_one.listen(4)
        port = open_one.getsockname()[1]
        assert probes.probe([{"address": "127.0.0.1", "port": closed, "host": "h3"},
                             {"address": "127.0.0.1", "port": port, "what": "libvirt"}]) == [
            {"address": "127.0.0.1", "port": closed, "host": "h3", "ok": False,
             "error": "connection refused"},
            {"address": "127.0.0.1", "port": port, "what": "libvirt", "ok": True,
             "error": None}]
    assert probes.probe([]) == []


def test_a_migration_port_opened_to_probes_answers_until_its_time_is_up():
    port = free_port()
    target = [{"address": "127.0.0.1", "port": port}]
    assert probes.listen("127.0.0.1", port, 0.5) is None
    assert probes.listen("127.0.0.1", port, 0.5) is None        # asked again: still open
    assert probes.probe(target)[0]["ok"]
    wait_for(lambda: not probes.probe(target)[0]["ok"], timeout=10,
             what="the listener closed by itself")


def test_a_port_something_else_listens_on_counts_as_open():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(4)
        assert probes.listen("127.0.0.1", taken.getsockname()[1], 5) is None


def test_an_address_that_is_not_this_host_s_is_one_line():
    why = probes.listen("192.0.2.1", free_port(), 5)      # TEST-NET: bound, never dialled
    assert why is not None and why.startswith("cannot listen on 192.0.2.1:")
    assert why.endswith(": cannot assign requested address")
