"""Fencing: the guard stops a host's HA VMs before its peer's lease can
expire, whatever happened to the peer, and a host that comes back keeps
what is still its own and sets aside what was restarted elsewhere.

Each host is a private libvirtd serving libvirt's test driver
(tests/support/daemon_hosts.py): its VMs outlive the peer's process, as
QEMU's do, so a fence is needed and can be watched from here."""
import signal
import time

import libvirt
import pytest

from engine.core import api, failpoints, keys
from engine.hypervisor.domain.domain_xml import read_metadata
from engine.placement import open_placement
from tests.support import TEST_AUTOMATIONS, wait_for, wait_until
from tests.support.cluster import finished
from tests.support.tcp_proxy import TcpProxy
from tests.support.daemon_hosts import daemon_hosts  # noqa: F401  (a fixture)

TTL = 2
MARGIN = 1.0
SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"


class Hosts:
    """Peers g1, g2 and g3, each on a daemon of its own."""

    def __init__(self, cluster, store, uris, tmp_path, tag):
        self.cluster, self.store, self.tmp_path, self.tag = cluster, store, tmp_path, tag
        self.uris = dict(zip(("g1", "g2", "g3"), uris))
        self.armed = tmp_path / "failpoints"
        self.armed.write_text("")

    def start(self, name, etcd=None):
        """``etcd``: the URL this peer reaches etcd by (a proxy), if not the
        cluster's."""
        self.cluster.start_peer(name, libvirt=self.uris[name], ttl=TTL,
                                extra_args=["--ha-margin", str(MARGIN)],
                                env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS,
                                     failpoints.ENV: str(self.armed),
                                     **({"PEERCTL_ETCD": etcd} if etcd else {})})
        wait_for(lambda: name in api.live_hosts(self.store), what=f"{name} alive")
        placement = open_placement("etcd", self.store)
        wait_for(lambda: name in {p["name"] for p in placement.providers()},
                 what=f"{name} registered")

    def boot(self, names, *flags):
        doc = self.cluster.cli_json("boot", *[f"{self.tag}{n}" for n in names], "--resources",
                                    SMALL, "--network", "none", "--on", "g1", *flags)
        assert doc["state"] == "done", doc
        return {vm["name"]: vm["uuid"] for vm in doc["vms"]}

    def domains(self, name) -> dict:
        """uuid -> (state, owner) of the peerctl domains on ``name``'s daemon."""
        conn = libvirt.open(self.uris[name])
        try:
            found = {}
            for d in conn.listAllDomains(0):
                try:        # one undefined since the list (a guard's fence, a move) is gone
                    owner = read_metadata(d).get("host")
                    state = {1: "running", 3: "paused"}.get(d.state()[0], "shutoff")
                except libvirt.libvirtError as exc:
                    if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                        raise
                    continue
                if owner:
                    found[d.UUIDString()] = (state, owner)
            return found
        finally:
            conn.close()

    def vmlist(self):
        return {vm["name"]: vm for vm in self.cluster.cli_json("vmlist")
                if vm["name"].startswith(self.tag)}

    def guard_pid(self, name):
        return int((self.tmp_path / f"state-{name}" / "guard" / "pid").read_text())


def fence_then_expiry(hosts, store, uuids):
    """Watch g1's HA domains and its host record together; the moments at
    which every HA domain was off and at which the lease had expired."""
    fenced = expired = None
    deadline = time.monotonic() + 30
    while (fenced is None or expired is None) and time.monotonic() < deadline:
        # The lease first: VMs seen stopped in the same look count as late.
        if expired is None and "g1" not in api.live_hosts(store):
            expired = time.monotonic()
        if fenced is None and all(hosts.domains("g1").get(u, ("gone",))[0] != "running"
                                  for u in uuids):
            fenced = time.monotonic()
        time.sleep(0.02)
    assert fenced is not None, "the guard never fenced g1's HA VMs"
    assert expired is not None, "g1's lease never expired"
    return fenced, expired


def scenario(cluster, store, daemon_hosts, tmp_path, tag, stop_peer, resume_peer,  # noqa: F811
             etcd_of_g1=None):
    """g1 runs two HA VMs and one without HA; ``stop_peer`` takes its peer
    away.  The guard fences the HA VMs before the lease expires; they run
    on g2 or g3 afterwards (the recovery's initiator, one of those, is
    SIGKILLed once on the way and comes back); ``resume_peer`` brings g1's
    peer back, which sets its stale copies aside and keeps its other VM.
    Each VM runs exactly once."""
    hosts = Hosts(cluster, store, daemon_hosts, tmp_path, tag)
    for name in ("g1", "g2", "g3"):
        hosts.start(name, etcd_of_g1 if name == "g1" else None)
    ha = hosts.boot(["a", "b"], "--ha", "restart")
    plain = hosts.boot(["c"])
    assert {u: hosts.domains("g1")[u] for u in ha.values()} == \
        {u: ("running", "g1") for u in ha.values()}
    failpoints.arm(str(hosts.armed), ["append claim_move"])

    stop_peer(hosts)
    fenced, expired = fence_then_expiry(hosts, store, list(ha.values()))
    assert fenced < expired, f"fenced {fenced - expired:.2f} s after the lease expired"
    assert hosts.domains("g1")[plain[f"{tag}c"]][0] == "running"      # no HA: not fenced

    def restarted():
        vms = hosts.vmlist()
        return vms if all(vms[n]["host"] in ("g2", "g3") and vms[n]["state"] == "running"
                          for n in ha) else None
    vms = wait_for(restarted, timeout=60, what="the HA VMs running on g2 or g3")
    assert vms[f"{tag}c"]["state"] == "unknown"
    assert "append claim_move" in (tmp_path / "failpoints.fired").read_text()
    task = finished(store, store.get(keys.recovery("g1")).value["automation"])
    assert task["state"] == "done", task["error"]
    for name in ("g2", "g3"):       # the initiator's host, killed at its failpoint
        if name not in api.live_hosts(store):
            hosts.start(name)

    resume_peer(hosts)
    wait_for(lambda: "g1" in api.live_hosts(store), what="g1 back")
    wait_for(lambda: not set(ha.values()) & set(hosts.domains("g1")), timeout=30,
             what="g1's stale copies undefined")
    asides = {vm["name"]: vm for vm in cluster.cli_json("aside", "list", "g1")}
    assert set(asides) == set(ha), asides
    assert all(vm["volumes"] for vm in asides.values())
    vms = wait_until(hosts.vmlist, lambda v: v[f"{tag}c"]["state"] == "running",
                     what="g1's own VM listed running again")
    assert vms[f"{tag}c"]["host"] == "g1"
    copies = {name: hosts.domains(name) for name in ("g1", "g2", "g3")}
    for name, uuid in ha.items():        # exactly one copy, running where it is listed
        where = [(h, copies[h][uuid]) for h in copies if uuid in copies[h]]
        assert where == [(vms[name]["host"], ("running", vms[name]["host"]))], where

    deleted = cluster.cli_json("aside", "delete", f"g1/{tag}*", "--yes")
    assert deleted["state"] == "done"
    assert cluster.cli_json("aside", "list") == []


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_sigkill_of_the_peer_the_guard_fences_and_the_vms_run_elsewhere(
        cluster, store, daemon_hosts, tmp_path):  # noqa: F811
    def kill(hosts):
        cluster.kill("g1")

    def restart(hosts):
        hosts.start("g1")
    scenario(cluster, store, daemon_hosts, tmp_path, "k", kill, restart)


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_hung_peer_is_fenced_by_its_guard(cluster, store, daemon_hosts, tmp_path):  # noqa: F811
    def freeze(hosts):
        cluster.kill("g1", signal.SIGSTOP)

    def thaw(hosts):
        cluster.kill("g1", signal.SIGCONT)
    scenario(cluster, store, daemon_hosts, tmp_path, "h", freeze, thaw)


@pytest.mark.slow       # a long scenario: a partition held past the lease
def test_a_peer_cut_off_from_etcd_fences_itself_before_its_lease_expires(
        cluster, store, daemon_hosts, tmp_path):  # noqa: F811
    """A partition: g1's peer reaches etcd through a proxy the test cuts.
    The peer and its hypervisor live on; its guard powers the HA VMs off
    before the lease can expire, they run elsewhere, and once the proxy
    heals the peer sets its stale copies aside instead of starting them."""
    host, port = cluster.etcd_url.rsplit("//", 1)[1].split(":")
    proxy = TcpProxy(host, int(port)).start()
    try:
        scenario(cluster, store, daemon_hosts, tmp_path, "p",
                 lambda hosts: proxy.cut(), lambda hosts: proxy.heal(), etcd_of_g1=proxy.url)
    finally:
        proxy.cut()


def test_a_peer_fenced_but_back_within_the_margin_restarts_its_own_vms(
        cluster, store, daemon_hosts, tmp_path):  # noqa: F811
    """Frozen just long enough for its guard to fence (the lease may lapse)
    and thawed before anyone recovered them: the VMs are still the host's,
    so its peer starts them again there, once."""
    hosts = Hosts(cluster, store, daemon_hosts, tmp_path, "f")
    cluster.start_peer("g1", libvirt=hosts.uris["g1"], ttl=TTL,
                       extra_args=["--ha-margin", "30"],
                       env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS})
    wait_for(lambda: "g1" in api.live_hosts(store), what="g1 alive")
    wait_for(lambda: "g1" in {p["name"] for p in open_placement("etcd", store).providers()},
             what="g1 registered")
    ha = hosts.boot(["a"], "--ha", "restart")
    uuid = ha["fa"]
    cluster.kill("g1", signal.SIGSTOP)
    wait_for(lambda: hosts.domains("g1")[uuid][0] == "shutoff", timeout=20,
             what="the guard to fence the frozen peer's HA VM")
    cluster.kill("g1", signal.SIGCONT)
    wait_for(lambda: hosts.domains("g1")[uuid][0] == "running", timeout=30,
             what="the peer to start its fenced VM again")
    assert store.get(keys.recovery("g1")) is None
    assert hosts.vmlist()["fa"]["host"] == "g1"
    assert cluster.cli_json("aside", "list") == []


def test_a_peer_restarted_within_its_lease_keeps_its_ha_vms_running(
        cluster, store, daemon_hosts, tmp_path):  # noqa: F811
    """An upgrade: SIGTERM, then a new peer at once.  The old one leaves its
    lease to run out instead of revoking it (it runs HA VMs), the new one
    renews its own in time: the guard never fences, nothing is recovered."""
    hosts = Hosts(cluster, store, daemon_hosts, tmp_path, "u")
    ttl = 5

    def start(name):
        cluster.start_peer(name, libvirt=hosts.uris[name], ttl=ttl,
                           extra_args=["--ha-margin", str(MARGIN)],
                           env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS})
        wait_for(lambda: name in api.live_hosts(store), what=f"{name} alive")
    start("g1")
    start("g2")
    wait_for(lambda: {"g1", "g2"} <= {p["name"] for p in open_placement("etcd", store)
                                       .providers()}, what="registered")
    uuid = hosts.boot(["a"], "--ha", "restart")["ua"]
    before = store.get(keys.host("g1"))
    stopped = time.monotonic()
    cluster.kill("g1", signal.SIGTERM)
    assert store.get(keys.host("g1")) is not None, "the lease was revoked"
    start("g1")
    took = time.monotonic() - stopped
    wait_for(lambda: store.get(keys.host("g1")).lease != before.lease, what="a new lease")
    guard_log = (tmp_path / "state-g1" / "guard" / "guard.log").read_text()
    assert "fenced" not in guard_log, f"fenced during a {took:.1f} s restart: {guard_log}"
    assert hosts.domains("g1")[uuid] == ("running", "g1")
    assert store.get(keys.recovery("g1")) is None
    assert guard_log.count("guard started") == 1        # the same guard all along
