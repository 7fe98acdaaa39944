"""Each host publishes how other hosts reach its libvirt; a host that
another machine's peer could not tell from its own, or not reach at all,
is refused at start in one line (engine/hypervisor/host/reachability.py).
Other machines are stood in for by host records in a real etcd."""
import os
import subprocess
import sys

import pytest

from engine.core import keys
from engine.hypervisor.host.reachability import (libvirt_endpoint, machine_id, migration_endpoint,
                                                 migration_of, remote_conflict)
from tests.support import PEERCTL, ROOT, wait_for
from tests.support.cluster import start_peers

THIS = machine_id()
OTHER = "0" * 32 if THIS != "0" * 32 else "1" * 32


def record(host, machine, remote):
    return {"host": host, "machine": machine, "libvirt_remote": remote,
            "libvirt_uri": "qemu:///system"}


@pytest.mark.parametrize("mine, theirs, refused", [
    ("qemu:///system", record("h6", OTHER, "qemu+tls://10.0.0.6/system"), "could not reach"),
    ("test:///default", record("h6", OTHER, "test:///default"), None),     # never through libvirt
    ("qemu:///system", record("h6", OTHER, "test:///default"), None),      # no move between them
    ("qemu+tls://10.0.0.5/system", record("h6", OTHER, "qemu+tls://10.0.0.5/system"),
     "already publishes"),
    ("qemu+tls://10.0.0.5/system", record("h6", OTHER, "qemu+tls://10.0.0.6/system"), None),
    ("qemu:///system", record("h6", THIS, "qemu:///system"), None),     # one libvirtd, shared
    ("qemu+unix:///system?socket=/a/run/libvirt-sock",
     record("h6", THIS, "qemu+unix:///system?socket=/b/run/libvirt-sock"), None),
    ("qemu:///system", record("h5", OTHER, "qemu:///system"), None),    # its own old record
    ("qemu:///system", record("h6", OTHER, "qemu:///system"), "could not reach"),
])
def test_which_hosts_can_tell_and_reach_each_others_libvirt(mine, theirs, refused):
    why = remote_conflict("h5", mine, THIS, [theirs])
    assert (why is None) if refused is None else (refused in why), why


def test_a_peer_on_a_local_uri_beside_another_machines_host_is_refused_in_one_line(
        cluster, store):
    lease = store.grant(30)
    store.put(keys.host("far"), record("far", OTHER, "qemu+tls://10.0.0.9/system"), lease)
    local = f"qemu+unix:///system?socket={cluster.tmp_path}/no-libvirtd-here"
    peer = cluster.start_peer("near", libvirt=local)
    assert peer.wait(60) == 2
    lines = cluster.log("near").strip().splitlines()
    assert lines[-1] == (f"peerctl: host far runs on another machine and could not reach this "
                         f"host's libvirt at {local}: set libvirt_remote to a URI it "
                         f"can reach, such as qemu+tls://ADDRESS/system (docs/deploy.md)")
    assert store.get(keys.host("near")) is None, "it registered before refusing"


def test_a_host_publishes_how_it_is_reached_and_from_which_machine(cluster, store):
    start_peers(cluster, store, ["h1"])
    cluster.kill("h1")
    cluster.start_peer("h1", extra_args=["--libvirt-remote", "qemu+tls://10.0.0.1/system"])
    wait_for(lambda: (store.get(keys.host("h1")) or None) and
             store.get(keys.host("h1")).value.get("libvirt_remote")
             == "qemu+tls://10.0.0.1/system", what="h1's record with its remote URI")
    assert store.get(keys.host("h1")).value["machine"] == THIS


def test_a_bad_remote_uri_is_one_line_and_starts_nothing(tmp_path):
    done = subprocess.run([sys.executable, PEERCTL, "--etcd", "http://127.0.0.1:1", "peer",
                           "--host", "h1", "--state-dir", str(tmp_path / "s"),
                           "--libvirt-remote", "10.0.0.1"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("peerctl: bad libvirt_remote '10.0.0.1' from --libvirt-remote: a "
                           "libvirt URI such as qemu+tls://10.0.0.12/system or "
                           "qemu+ssh://root@kvm2/system\n")
    assert not (tmp_path / "s").exists()


def test_bad_migration_ports_are_one_line_and_start_nothing(tmp_path):
    done = subprocess.run([sys.executable, PEERCTL, "--etcd", "http://127.0.0.1:1", "peer",
                           "--host", "h1", "--state-dir", str(tmp_path / "s")],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PEERCTL_MIGRATION_PORTS": "49215-49152"})
    assert done.returncode == 2
    assert done.stderr == ("peerctl: bad migration_ports '49215-49152': ports from 1 to 65535, "
                           "the first one not above the last from $PEERCTL_MIGRATION_PORTS\n")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("record, libvirt, migration", [
    ({"libvirt_remote": "qemu+tls://10.0.0.12/system"}, ("10.0.0.12", 16514), None),
    ({"libvirt_remote": "qemu+tcp://10.0.0.12:1234/system", "migration_address": "10.0.1.12",
      "migration_ports": [49200, 49215]}, ("10.0.0.12", 1234), ("10.0.1.12", 49200)),
    ({"libvirt_remote": "qemu+ssh://root@kvm2/system"}, ("kvm2", 22), None),
    ({"libvirt_uri": "qemu:///system"}, None, None),
    ({"libvirt_remote": "qemu+unix:///system"}, None, None),
    ({"libvirt_uri": "test:///default", "migration_address": "10.0.1.12"}, None,
     ("10.0.1.12", 49152))])
def test_where_a_host_is_probed(record, libvirt, migration):
    assert libvirt_endpoint(record) == libvirt
    assert migration_endpoint(record) == migration


def test_what_a_peer_publishes_about_its_migration_streams():
    assert migration_of("qemu+tls://10.0.0.12/system") == {
        "migration_address": "10.0.0.12", "migration_ports": [49152, 49215]}
    assert migration_of("qemu:///system", "", "49160") == {
        "migration_address": None, "migration_ports": [49160, 49160]}
    with pytest.raises(ValueError, match="bad migration_ports 'x'"):
        migration_of("qemu:///system", "", "x")
