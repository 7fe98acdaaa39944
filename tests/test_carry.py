"""The test driver's domains carried from one process to the next
(engine/hypervisor/host/carry.py): what a peer replaced by a new release
finds, where a real hypervisor's libvirtd would have kept it.  Two real
processes share one carry file: tests/support/carry_worker.py builds VMs
as a peer does and saves, another restores and shows what it has."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import libvirt
import pytest

from engine.errors import Failed
from engine.hypervisor.host import carry
from tests.support import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "carry_worker.py")


def worker(*args) -> dict:
    done = subprocess.run([sys.executable, WORKER, *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def built(tmp_path):
    """``(state_dir, carry file, what the first process built and saved)``."""
    state_dir, path = tmp_path / "state", tmp_path / "releases" / "carry.json"
    state_dir.mkdir()
    return state_dir, path, worker("build", state_dir, path)


def by_name(has: dict) -> dict:
    return {d["name"]: d for d in has["domains"].values()}


def test_a_new_process_has_every_domain_the_old_one_saved(built):
    state_dir, path, old = built
    new = worker("restore", state_dir, path)
    assert new["error"] is None
    assert new["restored"] == [old["saved"]] == [5]
    assert new["has"] == old["has"]         # definitions, live XML, pools, networks
    vms = by_name(new["has"])
    assert {name: vms[name]["state"] for name in ("web", "db", "old", "passing", "test")} == \
        {"web": "running", "db": "paused", "old": "shutoff", "passing": "running",
         "test": "running"}
    assert vms["web"]["reboot_token"] == "t1"          # live metadata, not the definition's
    assert vms["web"]["metadata"]["ha"] == "restart"
    assert all(vms[n]["metadata"]["host"] == "h1" for n in ("web", "db", "old", "passing", "test"))
    assert vms["passing"]["persistent"] is False
    assert vms["old"]["autostart"] is True
    assert vms["old"]["snapshots"] == ["first", "second*"]
    assert vms["db"]["snapshots"] == ["before-upgrade*"]
    volumes = new["has"]["pools"]["peerctl-h1"]["volumes"]
    for name in ("web", "db", "old"):
        for disk in vms[name]["disks"]:
            assert os.path.basename(disk) in volumes


def test_restoring_twice_changes_nothing(built):
    state_dir, path, old = built
    new = worker("restore", state_dir, path, 2)
    assert new["error"] is None
    assert new["restored"] == [5, 5]
    assert new["has"] == old["has"]
    assert os.path.exists(path)            # the caller removes it, not restore


def test_the_handlers_find_what_they_need_in_a_restored_process(built):
    state_dir, path, old = built
    after = worker("use", state_dir, path)
    assert after["reboot"]["rebooted"] is False         # its token came along
    assert (after["resume"]["state"], after["start"]["state"]) == ("running", "running")
    assert sorted(after["destroy"]["volumes_deleted"]) == sorted(
        os.path.basename(d) for d in by_name(old["has"])["web"]["disks"])
    assert "web" not in by_name(after["has"])


def test_a_domain_that_cannot_be_restored_is_named_and_the_others_are_restored(built):
    state_dir, path, old = built
    state = json.loads(path.read_text())
    web = next(d for d in state["domains"] if d["name"] == "web")
    clash = {**web, "uuid": "00000000-0000-4000-8000-000000000bad", "name": "test",
             "config": web["config"].replace(web["uuid"], "00000000-0000-4000-8000-000000000bad")
             .replace("<name>web</name>", "<name>test</name>")}
    state["domains"].append(clash)
    path.write_text(json.dumps(state))
    new = worker("restore", state_dir, path)
    assert "carried 5 of 6 domains" in new["error"]
    assert "domain test (00000000-0000-4000-8000-000000000bad)" in new["error"]
    assert "\n" not in new["error"]
    assert new["has"] == old["has"]


def test_save_replaces_the_file_whole_and_leaves_nothing_beside_it(built):
    _state_dir, path, _old = built
    assert os.listdir(path.parent) == ["carry.json"]
    assert os.stat(path).st_mode & 0o077 == 0          # secure XML: the owner's only
    assert json.loads(path.read_text())["format"] == carry.FORMAT


@pytest.fixture
def conn():
    conn = libvirt.open("test:///default")
    yield conn
    conn.close()


@pytest.mark.parametrize("content, why", [
    (None, "is missing"),
    ("{not json", "is unreadable"),
    ('{"format": 99, "pools": [], "networks": [], "domains": []}', "is not a carry file"),
    ('["a list"]', "is not a carry file"),
])
def test_a_missing_or_unreadable_file_is_one_failure_naming_it(tmp_path, conn, content, why):
    path = tmp_path / "carry.json"
    if content is not None:
        path.write_text(content)
    before = sorted(d.UUIDString() for d in conn.listAllDomains(0))
    with pytest.raises(Failed) as raised:
        carry.restore(conn, str(path))
    assert str(path) in str(raised.value) and why in str(raised.value)
    assert "\n" not in str(raised.value)
    assert sorted(d.UUIDString() for d in conn.listAllDomains(0)) == before


def test_a_file_that_cannot_be_written_is_one_failure(tmp_path, conn):
    (tmp_path / "plain").write_text("")
    with pytest.raises(Failed, match="cannot write"):
        carry.save(conn, str(tmp_path / "plain" / "carry.json"))


def test_only_the_default_test_driver_is_carried():
    assert carry.carries("test:///default")
    assert not carry.carries("qemu:///system")
    assert not carry.carries("qemu+ssh://kvm1/system")
    assert not carry.carries("test:///tmp/host.xml")     # read afresh by every open
