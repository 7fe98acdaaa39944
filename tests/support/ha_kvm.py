"""The QEMU tier's HA cluster: host1 (reaching etcd through a proxy a
test can cut) and host2 on the two private libvirtd of ``libvirtd_pair``,
and the drained test-driver members m1 and m2, which lead automations but
keep no VM; failpoints armed in every peer (``kvm.armed``)."""
from __future__ import annotations

import pytest

from engine.core import api, failpoints
from tests.support import TEST_AUTOMATIONS, wait_for
from tests.support.kvm import Kvm
from tests.support.tcp_proxy import TcpProxy

__all__ = ["MARGIN", "ha_kvm", "start_member"]

MARGIN = "2"


@pytest.fixture
def ha_kvm(cluster, store, libvirtd_pair, guest_dir, tmp_path):  # noqa: F811
    """host1 (reaching etcd through a proxy the test can cut), host2, and
    the drained members m1, m2; failpoints armed in every peer."""
    armed = tmp_path / "failpoints"
    armed.write_text("")
    host, port = cluster.etcd_url.rsplit("//", 1)[1].split(":")
    proxy = TcpProxy(host, int(port)).start()
    common = {failpoints.ENV: str(armed), "PEERCTL_HA_RETRY": "2"}
    kvm = Kvm(cluster, store, libvirtd_pair, guest_dir,
              peer_env={"*": common, "host1": {"PEERCTL_ETCD": proxy.url}},
              peer_args=["--ha-margin", MARGIN])
    kvm.armed, kvm.proxy = armed, proxy
    for member in ("m1", "m2"):
        start_member(kvm, member)
    wait_for(lambda: {"m1", "m2"} <= set(api.live_hosts(store)), what="members alive")
    drained = cluster.cli_json("drain", "m*", "--yes")
    assert sorted(h["host"] for h in drained["hosts"]) == ["m1", "m2"], drained
    yield kvm
    proxy.cut()
    kvm.close()


def start_member(kvm, name):
    """Start the test-driver member ``name`` (m1, m2) as every peer here
    runs: the short margin, the quick HA retry, the armed failpoints."""
    kvm.cluster.start_peer(name, extra_args=["--ha-margin", MARGIN],
                           env={**kvm.peer_env["*"],
                                "PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS})
