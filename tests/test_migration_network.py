"""A host's migration network: the peer finds its own address inside the
``migration_network`` CIDR and publishes it as ``migration_address``
(engine/commandline/peer_host.py, reachability.address_in); a live move
sends QEMU's streams to the address its destination publishes
(engine/hypervisor/moves/migration.py, ``planned``).  Real peers on the
test driver and a real etcd; the move's libvirt parameters are read, not
run (the QEMU tier runs them)."""
import ipaddress
import os
import socket
import subprocess
import sys

import libvirt
import psutil
import pytest

from engine.core import keys
from engine.errors import RequestError
from engine.hypervisor.host.hostctx import HostContext
from engine.hypervisor.moves import migration
from tests.support import PEERCTL, ROOT, wait_for
from tests.support.cluster import start_peers

UUID = "6f0c8a52-3d4e-4b7a-9c1e-2a5b7d9e0f13"


def published(store, host: str):
    kv = store.get(keys.host(host))
    return kv.value.get("migration_address") if kv is not None else None


def test_a_peer_publishes_its_address_inside_the_migration_network(cluster, store):
    start_peers(cluster, store, ["h1"], env={"PEERCTL_MIGRATION_NETWORK": "127.0.0.0/8"})
    assert published(store, "h1") == "127.0.0.1"   # the test driver's URI names no address


def test_an_explicit_migration_address_wins_over_the_network(cluster, store):
    cluster.start_peer("h1", extra_args=["--migration-network", "127.0.0.0/8"],
                       env={"PEERCTL_MIGRATION_ADDRESS": "10.0.1.12"})
    wait_for(lambda: published(store, "h1") == "10.0.1.12", what="h1's migration address")


def a_network_nobody_here_is_in() -> str:
    here = [ipaddress.ip_address(a.address.partition("%")[0])
            for addresses in psutil.net_if_addrs().values() for a in addresses
            if a.family in (socket.AF_INET, socket.AF_INET6)]
    for candidate in ("198.51.100.0/24", "203.0.113.0/24", "192.0.2.0/24", "100.64.0.0/10"):
        if not any(address in ipaddress.ip_network(candidate) for address in here):
            return candidate
    pytest.skip("every test network has an address on this machine")


def peer(tmp_path, *flags, env=None):
    return subprocess.run([sys.executable, PEERCTL, "--etcd", "http://127.0.0.1:1", "peer",
                           "--host", "h1", "--state-dir", str(tmp_path / "s"), *flags],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, **(env or {})})


def test_a_migration_network_this_machine_has_no_address_in_is_one_line(tmp_path):
    network = a_network_nobody_here_is_in()
    done = peer(tmp_path, "--migration-network", network)
    assert done.returncode == 2
    assert done.stderr == (f"peerctl: no address of this machine is in migration_network "
                           f"{network} (from --migration-network): name a network one of "
                           "its interfaces has an address in, or set migration_address\n")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value", ["10.0.0.0/33", "nonsense", "10.0.0.300/24"])
def test_a_bad_migration_network_is_one_line_and_starts_nothing(tmp_path, value):
    done = peer(tmp_path, env={"PEERCTL_MIGRATION_NETWORK": value})
    assert done.returncode == 2
    assert done.stderr == (f"peerctl: bad migration_network {value!r}: a network such as "
                           "10.0.1.0/24 or fd00:1::/64 (from $PEERCTL_MIGRATION_NETWORK)\n")
    assert not (tmp_path / "s").exists()


# -- the move: where QEMU's streams go --------------------------------------

def move_args(**extra) -> dict:
    return {"uuid": UUID, "name": "vm1", "destination": "h2",
            "destination_uri": "qemu+tls://10.0.0.12/system", "xml": "<domain/>",
            "disks": ["vda"], "live": True, **extra}


def source(store, tmp_path) -> HostContext:
    return HostContext("h1", "qemu+tls://10.0.0.11/system", store, str(tmp_path))


def test_a_move_sends_its_streams_to_the_address_the_destination_publishes(store, tmp_path):
    lease = store.grant(30)
    store.put(keys.host("h2"), {"host": "h2", "migration_address": "10.0.1.12",
                                "migration_ports": [49152, 49215]}, lease)
    params = migration.planned(source(store, tmp_path), move_args()).params()
    assert params[libvirt.VIR_MIGRATE_PARAM_URI] == "tcp://10.0.1.12"
    # the disks' NBD stream follows the migration URI's host: libvirt's default
    assert libvirt.VIR_MIGRATE_PARAM_DISKS_URI not in params
    assert params[libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS] == ["vda"]


def test_an_ipv6_address_is_bracketed(store, tmp_path):
    store.put(keys.host("h2"), {"host": "h2", "migration_address": "fd00:1::12"})
    params = migration.planned(source(store, tmp_path), move_args()).params()
    assert params[libvirt.VIR_MIGRATE_PARAM_URI] == "tcp://[fd00:1::12]"


def test_the_requests_own_migration_uri_wins(store, tmp_path):
    store.put(keys.host("h2"), {"host": "h2", "migration_address": "10.0.1.12"})
    move = migration.planned(source(store, tmp_path),
                             move_args(migration_uri="tcp://10.0.2.12:49200"))
    assert move.params()[libvirt.VIR_MIGRATE_PARAM_URI] == "tcp://10.0.2.12:49200"


def test_a_destination_that_publishes_no_address_leaves_libvirt_its_default(store, tmp_path):
    """As before this existed: a request logged without migration_uri, to a
    host of an older release (no migration_address), or with no record."""
    assert libvirt.VIR_MIGRATE_PARAM_URI not in migration.planned(
        source(store, tmp_path), move_args()).params()
    store.put(keys.host("h2"), {"host": "h2", "migration_address": None})
    assert libvirt.VIR_MIGRATE_PARAM_URI not in migration.planned(
        source(store, tmp_path), move_args()).params()
    assert libvirt.VIR_MIGRATE_PARAM_URI not in migration.planned(
        HostContext("h1", "qemu:///system", None, str(tmp_path)), move_args()).params()


@pytest.mark.parametrize("bad", ["10.0.1.12", "qemu+tls://10.0.1.12/system", "tcp://",
                                 "tcp://10.0.1.12:x", 12, ""])
def test_a_migration_uri_that_is_none_is_refused_in_one_line(bad, tmp_path):
    with pytest.raises(RequestError, match=r"^migration_uri must be tcp://ADDRESS\[:PORT\]"):
        migration.planned(HostContext("h1", "qemu:///system", None, str(tmp_path)),
                          move_args(migration_uri=bad))


# -- the certificate QEMU's TLS checks the migration address against --------

def test_a_libvirt_certificate_also_names_the_migration_address(tmp_path):
    done = subprocess.run([sys.executable, PEERCTL, "--format", "json", "tls", "certs",
                           str(tmp_path / "tls"), "--libvirt", "h1=10.0.0.11,10.0.1.11"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    from engine.core import certs
    found = {c["file"]: c for c in certs.certificates(str(tmp_path / "tls"))}
    assert found[str(tmp_path / "tls" / "libvirt-h1.pem")]["names"] == [
        "10.0.0.11", "10.0.1.11", "h1"]


def test_an_empty_extra_address_is_one_line_and_writes_nothing(tmp_path):
    done = subprocess.run([sys.executable, PEERCTL, "tls", "certs", str(tmp_path / "tls"),
                           "--libvirt", "h1=10.0.0.11,"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("peerctl: bad --libvirt 'h1=10.0.0.11,' (want NAME=ADDR[,ADDR2]: "
                           "the host's name and the address or DNS name it is reached at)\n")
    assert not (tmp_path / "tls").exists()
