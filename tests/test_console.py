"""`console NAME` on the test driver, through the real command line: every
way it cannot attach is one line on stderr, a non-zero exit and no
traceback.  (The test driver offers no console at all; attaching for real
is tests/test_console_qemu.py.)"""
from __future__ import annotations

import uuid

import pytest

from engine.core import keys
from tests.support import only_line, vms


RUNNING = "11111111-2222-3333-4444-000000000001"
SHUTOFF = "11111111-2222-3333-4444-000000000002"


@pytest.fixture
def test_driver_host(tmp_path, store):
    """Host ``hfile`` in etcd (``hosts/``), its libvirt a test-driver file
    that this process and the command line both read: VM ``run1`` running,
    ``off1`` shut off, each with its ``vms/`` record."""
    path = tmp_path / "host.xml"
    domain = ("<domain type='test'><name>{}</name><uuid>{}</uuid><memory>65536</memory>"
              "<vcpu>1</vcpu><os><type>hvm</type></os>{}</domain>")
    path.write_text("<node xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>"
                    + domain.format("run1", RUNNING, "")
                    + domain.format("off1", SHUTOFF, "<test:runstate>5</test:runstate>")
                    + "</node>")
    uri = f"test://{path}"
    store.put(keys.host("hfile"), {"host": "hfile", "libvirt_uri": uri},
              store.grant(600))      # a live host's record, held by a lease
    for name, uid, state in (("run1", RUNNING, "running"), ("off1", SHUTOFF, "shutoff")):
        store.put(keys.vm("hfile", uid), {"host": "hfile", "name": name, "uuid": uid,
                                          "state": state})
    return uri


def test_a_hypervisor_without_consoles_is_one_line_saying_so(cluster, test_driver_host):
    done = cluster.cli("console", "run1", input="")
    assert done.returncode == 1
    assert only_line(done) == (f"peerctl: the hypervisor of hfile ({test_driver_host}) does "
                               "not offer a console")


def test_a_vm_that_is_not_running_is_one_line_saying_start_it(cluster, test_driver_host):
    done = cluster.cli("console", "hfile/off1", "--no-tty", input="")
    assert done.returncode == 1
    assert only_line(done) == "peerctl: VM off1 is shutoff on hfile: start it first"


def test_a_vm_booted_by_a_test_driver_peer_says_the_hypervisor_has_no_console(
        cluster, store):
    """test:///default lives in the peer's process: another process's
    test:///default does not hold the VM, and no test domain has a console
    anyway: it says the one thing that holds, as the page does."""
    vms.start(cluster, store, ["t1"])
    booted = cluster.cli_json("boot", "web1", "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done", booted
    done = cluster.cli("console", "web1", input="")
    assert done.returncode == 1
    assert only_line(done) == ("peerctl: the hypervisor of t1 (test:///default) does not "
                               "offer a console")


def test_an_unreachable_host_is_exit_3_naming_its_uri(cluster, store):
    uri = "qemu+unix:///system?socket=/nonexistent"
    uid = str(uuid.uuid4())
    store.put(keys.host("far"), {"host": "far", "libvirt_uri": uri}, store.grant(600))
    store.put(keys.vm("far", uid), {"host": "far", "name": "web9", "uuid": uid,
                                    "state": "running"})
    done = cluster.cli("console", "web9", input="")
    assert done.returncode == 3
    line = only_line(done)
    assert line.startswith(f"peerctl: cannot reach far's libvirt at {uri}: "), line


def test_a_vm_whose_host_has_no_record_is_one_line(cluster, store):
    uid = str(uuid.uuid4())
    store.put(keys.vm("ghost", uid), {"host": "ghost", "name": "web8", "uuid": uid,
                                      "state": "running"})
    done = cluster.cli("console", "web8", input="")
    assert done.returncode == 1
    assert only_line(done) == ("peerctl: no host record for ghost, the host of VM web8: "
                               "its libvirt URI is unknown")


def test_an_unknown_name_exits_1_as_other_vm_commands_do(cluster, test_driver_host):
    done = cluster.cli("console", "nope", input="")
    assert done.returncode == 1
    assert only_line(done) == "peerctl: no VM matches 'nope'"
    stop = cluster.cli("stop", "nope", input="")
    assert stop.returncode == done.returncode


def test_a_name_matching_several_vms_is_a_usage_error_listing_them(cluster, test_driver_host):
    done = cluster.cli("console", "hfile/*1", input="")
    assert done.returncode == 2
    assert only_line(done) == ("peerctl: 'hfile/*1' matches 2 VMs (hfile/off1, hfile/run1): "
                               "console needs one")


@pytest.mark.parametrize("argv, named", [
    (["console", "a/b/c"], "'a/b/c'"),
    (["console", "web1", "--timeout", "soon"], "'soon'"),
])
def test_bad_input_is_a_usage_error_before_anything_is_opened(cluster, argv, named):
    done = cluster.cli(*argv, input="")
    assert done.returncode == 2
    assert named in only_line(done)
