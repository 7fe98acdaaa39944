"""etcd members restarting under peers that reach them over TLS: a TLS
handshake that breaks off on an etcd that has answered before is etcd
being away for a while (unreachable, retried), never a refusal of the
identity; no peer exits for it, and no HA VM moves while its host's lease
holds."""
from __future__ import annotations

import json
import socket
import threading

import grpc
import pytest

from engine.core import api, keys
from engine.core.credentials import Credentials
from engine.core.store import Store
from engine.errors import PermissionDenied, StoreUnavailable
from engine.placement import open_placement
from tests.support import wait_for
from tests.support.ha_hosts import SMALL
from tests.support.secured_etcd import SecuredEtcd
from tests.support.vms import big_test_host


def answers(store) -> bool:
    try:
        store.get("anything")
    except StoreUnavailable:
        return False
    return True


class Restarting:
    """What a client meets on the port of an etcd member that is coming
    back: the connection is taken, then reset in the middle of the TLS
    handshake."""

    def __init__(self, port: int):
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(16)
        self.resets = 0
        threading.Thread(target=self._reset, daemon=True).start()

    def _reset(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.recv(1024)             # the ClientHello
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            self.resets += 1            # counted before the client can see it
            conn.close()                # RST

    def close(self):
        # shutdown first: it wakes the accept() blocked in the thread, which
        # otherwise holds the socket listening past close() (and etcd,
        # started again on the port, would find it taken)
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


@pytest.fixture
def secured(tmp_path):
    secured = SecuredEtcd(tmp_path)
    yield secured
    secured.close()


def test_a_handshake_broken_by_an_etcd_that_answered_before_is_unreachable(secured):
    store = secured.store("operator")
    try:
        assert store.get("anything") is None            # etcd answered this identity
        port = secured.server.client_port
        secured.server.stop()
        restarting = Restarting(port)
        try:
            for _ in range(3):
                with pytest.raises(StoreUnavailable) as away:
                    store.get("anything")
                assert not isinstance(away.value, PermissionDenied)
                assert "unreachable" in str(away.value), away.value
            assert restarting.resets >= 1, "no handshake was broken off"
        finally:
            restarting.close()
        secured.server.start()
        wait_for(lambda: answers(store), timeout=10, what="etcd found again")
    finally:
        store.close()


HOSTS = ["host1", "host2", "host3"]


def quorum_lost(store) -> bool:
    """Whether a linearizable read fails now (the members left cannot elect)."""
    return not answers(store)


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_peers_outlive_etcd_members_restarting_one_and_two_at_a_time(tmp_path):
    """A three-member TLS etcd with roles on, three peers each with its own
    certificate, an HA VM on host1.  Each member is SIGKILLed and started
    again in turn, then two at a time (quorum lost, then back): every peer
    still runs, none ever took a broken handshake for a refusal, and the HA
    VM never moved: it runs on host1, the same domain, never recovered."""
    secured = SecuredEtcd(tmp_path, members=3, peers=HOSTS)
    cluster, etcd = secured.cluster, secured.server
    viewer = secured.store("viewer")
    probe = Store(etcd.urls, secured.name, timeout=1.0,
                  credentials=Credentials(**secured.files("root")))
    try:
        for host in HOSTS:
            uri = big_test_host(tmp_path / f"{host}.xml")
            cluster.start_peer(host, libvirt=uri, ttl=3, extra_args=["--ha-margin", "5"],
                               env=secured.env(f"peer-{host}"))
        wait_for(lambda: set(HOSTS) <= set(api.live_hosts(viewer)), timeout=60,
                 what="three peers alive")
        placement = open_placement("etcd", viewer)
        wait_for(lambda: set(HOSTS) <= {p["name"] for p in placement.providers()},
                 timeout=60, what="providers registered")
        booted = secured.cli("operator", "--format", "json", "boot", "web1", "--resources",
                             SMALL, "--network", "none", "--on", "host1", "--ha", "restart")
        assert booted.returncode == 0, booted.stderr
        (vm,) = json.loads(booted.stdout)["vms"]
        assert (vm["host"], vm["state"]) == ("host1", "running")

        def back_to_normal():
            etcd_members_healthy(etcd)
            wait_for(lambda: answers(probe), timeout=30, what="etcd answering")
            wait_for(lambda: set(HOSTS) <= set(api.live_hosts(viewer)), timeout=30,
                     what="every peer alive again")

        for member in etcd.members:                         # one by one
            member.kill()
            member.start(20.0)
            back_to_normal()
        for pair in ((0, 1), (1, 2), (2, 0)):               # two at a time
            for i in pair:
                etcd.members[i].kill()
            wait_for(lambda: quorum_lost(probe), timeout=30, what="quorum lost")
            for i in pair:
                etcd.members[i].launch()
            back_to_normal()

        gone = {host: cluster.peers[host].returncode for host in HOSTS
                if cluster.peers[host].poll() is not None}
        assert gone == {}, {host: cluster.log(host)[-3000:] for host in gone}
        for host in HOSTS:
            log = cluster.log(host)
            assert "permission denied" not in log and "vm_reconcile_crashed" not in log, \
                (host, log[-3000:])
        listed = {v["name"]: v for v in json.loads(secured.cli(
            "viewer", "--format", "json", "vmlist").stdout)}
        assert (listed["web1"]["host"], listed["web1"]["state"], listed["web1"]["uuid"],
                listed["web1"]["recovered"]) == ("host1", "running", vm["uuid"], None)
        assert viewer.get(keys.recovery("host1")) is None
    finally:
        probe.close()
        viewer.close()
        secured.close()


def etcd_members_healthy(etcd) -> None:
    for member in etcd.members:
        member.wait_healthy(30.0)


class BrokenHandshake(grpc.RpcError):
    """gRPC's error for a connection whose handshake broke off: on a TLS
    endpoint, maybe a refused certificate; on a plain one, only gRPC's own
    handshake, timed out on a starved machine (seen once under a saturated
    test tier as "permission denied ... without a client certificate")."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return ("failed to connect to all addresses; last error: UNAVAILABLE: "
                "ipv4:127.0.0.1:2379: Handshake failed (TSI_DATA_CORRUPTED)")


def test_a_broken_handshake_is_a_refusal_on_tls_only(etcd):
    plain = Store(etcd.url, "plain")
    secure = Store("https://127.0.0.1:1", "secure")
    try:
        assert plain._failures.refusal(BrokenHandshake()) is None
        assert plain._failures.why(BrokenHandshake()) == \
            f"etcd at {etcd.url} unreachable (BrokenHandshake)"
        refusal = secure._failures.refusal(BrokenHandshake())
        assert isinstance(refusal, PermissionDenied)
        assert "without a client certificate" in str(refusal)
    finally:
        plain.close()
        secure.close()
