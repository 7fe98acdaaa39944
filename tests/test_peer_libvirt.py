"""A peer's libvirt URI, through the real command line: one libvirt rejects
outright is a usage error (one line, exit 2, no lease ever granted); one
whose hypervisor is merely unreachable still makes a live peer."""
import signal
import socket

from engine.core import api, keys
from tests.support import wait_for, wait_until


def test_a_uri_libvirt_rejects_exits_2_with_one_line_and_no_lease(cluster, store):
    """A test-driver file that is no host description: libvirt refuses it in
    this process, whether or not a libvirtd runs (a scheme libvirt has no
    driver for, such as bogus:///, is only refused by a running daemon;
    without one it is merely unreachable)."""
    garbage = cluster.tmp_path / "garbage.xml"
    garbage.write_text("not a libvirt host description\n")
    uri = f"test://{garbage}"
    done = cluster.cli("peer", "--host", "h1", "--libvirt", uri, "--ttl", "2",
                       "--state-dir", str(cluster.tmp_path / "state-h1"), timeout=60)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"peerctl: libvirt rejects --libvirt {uri!r}: "
        f"{garbage}:1: Start tag expected, '<' not found"], done.stderr
    assert store.get(keys.host("h1")) is None and store.get("hostcfg/h1") is None
    assert store.range("")[0] == [], "the refused peer wrote to etcd"


def test_a_test_driver_file_that_is_missing_is_one_line_too(cluster, store):
    """Not a second line from libxml2 before libvirt's refusal: one line, exit 2."""
    uri = f"test://{cluster.tmp_path / 'missing.xml'}"
    done = cluster.cli("peer", "--host", "h1", "--libvirt", uri, "--ttl", "2",
                       "--state-dir", str(cluster.tmp_path / "state-h1"), timeout=60)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"peerctl: libvirt rejects --libvirt {uri!r}: test driver file "
        f"{cluster.tmp_path / 'missing.xml'} cannot be read"], done.stderr
    assert store.range("")[0] == [], "the refused peer wrote to etcd"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_hypervisor_still_makes_a_live_peer_that_stops_cleanly(cluster, store):
    uri = f"qemu+tcp://127.0.0.1:{closed_port()}/system"
    process = cluster.start_peer("h1", libvirt=uri)
    record = wait_for(lambda: process.poll() is not None or api.live_hosts(store).get("h1"),
                      what="h1 alive (or dead)")
    assert process.poll() is None, cluster.log("h1")
    assert "Connection refused" in record["error"], record
    assert "libvirt_unreachable" in cluster.log("h1")
    # It does its work (a ping needs no hypervisor), past its start-up.
    automation_id = api.start_automation(store, "ping", {"hosts": ["h1"], "rounds": 2})
    task = wait_until(lambda: api.get_task(store, automation_id),
                      lambda t: t["state"] in keys.TERMINAL_STATES, what="the ping to finish")
    assert task["state"] == "done", task["error"]
    assert process.poll() is None, cluster.log("h1")
    cluster.kill("h1", signal.SIGTERM)
    assert process.returncode == 0, cluster.log("h1")
    assert store.get(keys.host("h1")) is None, "the lease was not revoked on the way out"
