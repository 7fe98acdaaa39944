"""``cluster verify`` against real etcd members and real peers: clean on a
sound cluster, and one line per problem, exit 1, on a broken one.  Hosts on
other machines are stood in for by host records under a lease."""
from __future__ import annotations

import datetime
import json
import os

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from engine.cluster import read_hosts
from engine.core import keys
from engine.core.etcd_server import EtcdCluster
from engine.hypervisor.host.reachability import machine_id
from tests.support import wait_for
from tests.support.cluster import Cluster, start_peers
from tests.support.secured_etcd import SecuredEtcd

OTHER = "0" * 32 if machine_id() != "0" * 32 else "1" * 32


@pytest.fixture
def three(tmp_path, cluster_name):
    members = EtcdCluster(str(tmp_path / "etcd"), 3).start()
    cluster = Cluster(members.urls, cluster_name, tmp_path)
    yield members, cluster
    cluster.close()
    members.stop()


def verified(cluster, expect_rc):
    done = cluster.cli("cluster", "verify")
    assert done.returncode == expect_rc, (done.stdout, done.stderr)
    assert done.stderr == ""
    return done.stdout.strip().splitlines()


def test_a_sound_cluster_verifies_clean_and_a_stopped_member_is_named(three):
    members, cluster = three
    start_peers(cluster, cluster.store, ["h1", "h2"])
    assert verified(cluster, 0) == [
        "skipped (no TCP endpoint to probe): libvirt of h1, h2; migration port of h1, h2",
        "no problem found: 2 hosts; checked etcd, hosts, versions, libvirt, networks, disk, "
        "certificates, reach, clock, pools"]

    members.members[2].kill()
    lines = verified(cluster, 1)
    assert [line for line in lines if line.startswith("etcd: ")] == [
        f"etcd: etcd member m3 ({members.members[2].url}) does not answer "
        f"(etcd at {members.members[2].url} unreachable (_InactiveRpcError))"], lines
    assert lines[-1] == "1 problem (2 hosts)"


def far_host(store, name, **record):
    """A live host record as a peer on another machine would hold it."""
    lease = store.grant(60)
    store.put(keys.host_config(name), {"host": name})
    store.put(keys.host(name), {"host": name, "machine": OTHER, "version": "0.1.0",
                                "feature_level": 1, "networks": ["default"],
                                "libvirt_uri": "qemu:///system", **record}, lease)


@pytest.mark.slow      # a scenario of several seconds: the third tier
def test_each_problem_is_one_line_and_the_exit_is_1(cluster, store):
    start_peers(cluster, store, ["h1", "h2"])
    start_peers(cluster, store, ["h3"], env=None)
    cluster.kill("h3")
    wait_for(lambda: not {h["host"]: h["alive"] for h in cluster.cli_json("hostlist")}["h3"],
             what="h3 down")
    version = store.get(keys.host("h1")).value["version"]
    level = store.get(keys.host("h1")).value["feature_level"]
    far_host(store, "far1", version="9.9.9", feature_level=level, libvirt_remote="qemu:///system",
             disk_gb=100.0, free_disk_gb=4.0, networks=["default", "lan"],
             pool_free_gb=4.0, vm_disk_growth_gb=30.5)
    far_host(store, "far2", version=version, feature_level=level, machine=machine_id(),
             libvirt_remote="qemu:///system", networks=["default", "lan"],
             networks_missing=["storage"])
    lines = verified(cluster, 1)
    by_check = {}
    for line in lines[:-2]:
        check, _, problem = line.partition(": ")
        by_check.setdefault(check, []).append(problem)
    assert by_check["etcd"] == ["etcd has 1 member: losing one stops the cluster (3 or 5 "
                                "for a rack: docs/deploy.md)"]
    assert by_check["hosts"] == ["host h3 is down (its peer holds no lease): its VMs are "
                                 "not served"]
    assert by_check["versions"] == [
        "live hosts run different versions: far1 9.9.9, far2 " + version + ", h1 " + version
        + ", h2 " + version]
    assert any(p.startswith("host far1: host far2 runs on another machine and could not "
                            "reach this host's libvirt at qemu:///system") for p in
               by_check["libvirt"]), by_check["libvirt"]
    assert "host h1 does not offer network lan that far1, far2 offer: VMs using it cannot " \
           "move there" in by_check["networks"]
    assert "host far2's configuration names network storage, which its libvirt does not " \
           "have" in by_check["networks"]
    assert by_check["disk"] == ["host far1: 4 GiB free of 100 GiB where its VMs' disks grow "
                                "(under 10%)"]
    assert by_check["pools"] == ["host far1: its VMs' thin disks may still grow by 30.5 GiB "
                                 "and its storage pool has 4 GiB free"]
    # records with no peer behind them: their requests time out
    assert by_check["reach"] == [f"host {far} did not answer the reachability check: no "
                                 f"answer from {far} within 5.0s" for far in ("far1", "far2")]
    assert lines[-2] == ("skipped (no TCP endpoint to probe): libvirt of far1, far2, h1, h2; "
                         "migration port of far1, far2, h1, h2")
    assert lines[-1] == f"{len(lines) - 2} problems (5 hosts)"


def short_lived(tls_dir: str, user: str, days: int) -> tuple[str, str]:
    """A client certificate of ``user`` from the cluster's authority that
    expires in ``days`` days."""
    with open(os.path.join(tls_dir, "ca.pem"), "rb") as f:
        ca = x509.load_pem_x509_certificate(f.read())
    with open(os.path.join(tls_dir, "ca-key.pem"), "rb") as f:
        ca_key = serialization.load_pem_private_key(f.read(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME,
                                                        "operator"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, user)]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(ca_key, hashes.SHA256()))
    paths = (os.path.join(tls_dir, "soon.pem"), os.path.join(tls_dir, "soon-key.pem"))
    with open(paths[0], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths[1], "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return paths


def test_a_certificate_expiring_within_30_days_is_a_problem(tmp_path):
    secured = SecuredEtcd(tmp_path)
    try:
        cert, key = short_lived(secured.tls, "operator", 10)
        done = secured.cluster.cli("cluster", "verify", env={
            **secured.env("operator"), "PEERCTL_CERT": cert, "PEERCTL_KEY": key})
        assert done.returncode == 1 and done.stderr == "", done.stderr
        day = (datetime.datetime.now(datetime.timezone.utc)
               + datetime.timedelta(days=10)).strftime("%Y-%m-%d")
        assert f"certificates: this command's etcd certificate {cert} expires on {day}" in \
            done.stdout.splitlines()
        fine = secured.cli("operator", "cluster", "verify")
        assert not [line for line in fine.stdout.splitlines()
                    if line.startswith("certificates:")], fine.stdout
    finally:
        secured.close()


def test_a_viewer_s_verify_still_answers_and_writes_nothing(tmp_path):
    secured = SecuredEtcd(tmp_path, peers=["h1", "h2"])
    try:
        for host in ("h1", "h2"):
            secured.cluster.start_peer(host, env=secured.env(f"peer-{host}"))
        viewer = secured.store("viewer")
        wait_for(lambda: len([h for h in read_hosts(viewer) if h["alive"]]) == 2,
                 what="two peers alive")
        done = secured.cli("viewer", "--format", "json", "cluster", "verify")
        assert done.returncode == 1 and done.stderr == "", done.stderr
        found = json.loads(done.stdout)
        (line,) = [p["problem"] for p in found["problems"] if p["check"] == "reach"]
        assert line.startswith("the hosts' reachability and clocks were not checked: "), line
        assert found["recorded"] is False and found["automation"] is None
        assert viewer.range(keys.verified())[0] == [] and viewer.range(keys.auto())[0] == []
        assert secured.cli("operator", "cluster", "verify").returncode == 1   # 1 etcd member
        assert {h["host"]: h["verify"] for h in read_hosts(viewer)} == {"h1": "ok", "h2": "ok"}
        viewer.close()
    finally:
        secured.close()
