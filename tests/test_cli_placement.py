"""``peerctl.py placement providers|allocations|candidates`` as subprocesses
against a real etcd: CONTRACT.md's JSON shapes, exit codes, and bad input
(exit 2, one line on stderr, nothing on stdout, nothing written)."""
from __future__ import annotations

import json

import pytest

from engine.placement import open_placement
from engine.core.store import Store
from tests.support import last_write
from tests.support.placement import make_provider, new_uuid

MAX = 2147483647


def inv(total, **fields):
    return {"total": total, "reserved": 0, "min_unit": 1, "max_unit": MAX, "step_size": 1,
            "allocation_ratio": 1.0, **fields}


@pytest.fixture
def world(etcd, cluster):
    """Two hosts (host1 with a NUMA child), a sharing nfs, one claim."""
    store = Store(etcd.url, cluster.name)
    placement = open_placement("etcd", store)
    agg = new_uuid()
    host1 = make_provider(placement, "host1", {"VCPU": {"total": 8, "allocation_ratio": 2.0},
                                               "MEMORY_MB": 8192},
                          traits=["HW_CPU_X86_AVX2"], aggregates=[agg])
    cell = make_provider(placement, "host1_numa0", {"VGPU": 2}, parent=host1["uuid"])
    host2 = make_provider(placement, "host2", {"VCPU": 4, "MEMORY_MB": 4096},
                          traits=["CUSTOM_SLOW"])
    nfs = make_provider(placement, "nfs", {"DISK_GB": 100},
                        traits=["MISC_SHARES_VIA_AGGREGATE"], aggregates=[agg])
    vm = new_uuid()
    placement.claim(vm, {host2["uuid"]: {"VCPU": 3, "MEMORY_MB": 1024}},
                    project="p", user="u")
    yield {"store": store, "agg": agg, "host1": host1["uuid"], "cell": cell["uuid"],
           "host2": host2["uuid"], "nfs": nfs["uuid"], "vm": vm}
    store.close()


def test_providers_json_shape(cluster, world):
    rows = cluster.cli_json("placement", "providers")
    assert [r["name"] for r in rows] == ["host1", "host1_numa0", "host2", "nfs"]
    by_name = {r["name"]: r for r in rows}
    assert by_name["host1"] == {
        "uuid": world["host1"], "name": "host1", "parent": None, "generation": 3,
        "inventories": {"MEMORY_MB": inv(8192), "VCPU": inv(8, allocation_ratio=2.0)},
        "usages": {"MEMORY_MB": 0, "VCPU": 0},
        "traits": ["HW_CPU_X86_AVX2"], "aggregates": [world["agg"]]}
    assert by_name["host1_numa0"]["parent"] == world["host1"]
    assert by_name["host2"]["usages"] == {"MEMORY_MB": 1024, "VCPU": 3}
    assert by_name["host2"]["generation"] == 3      # inventory, traits, one claim
    assert [r["name"] for r in cluster.cli_json("placement", "providers", "host1*")] == \
        ["host1", "host1_numa0"]
    # a glob that matches nothing: exit 1, still one JSON document
    done = cluster.cli("--format", "json", "placement", "providers", "nohost*")
    assert done.returncode == 1 and json.loads(done.stdout) == []
    assert len(done.stderr.strip().splitlines()) == 1 and "nohost*" in done.stderr


def test_allocations_json_shape(cluster, world):
    expect = [{"consumer": world["vm"],
               "allocations": {world["host2"]: {"MEMORY_MB": 1024, "VCPU": 3}}}]
    assert cluster.cli_json("placement", "allocations") == expect
    assert cluster.cli_json("placement", "allocations", world["vm"]) == expect
    assert cluster.cli_json("placement", "allocations", new_uuid()) == []


def test_candidates_short_spec(cluster, world):
    rows = cluster.cli_json("placement", "candidates", "VCPU:1,MEMORY_MB:256")
    assert [r["host"] for r in rows] == ["host1", "host2"]      # least loaded first
    assert rows[0] == {"host": "host1",
                       "allocations": {world["host1"]: {"VCPU": 1, "MEMORY_MB": 256}}}
    assert [r["host"] for r in cluster.cli_json(
        "placement", "candidates", "VCPU:1", "--required", "!CUSTOM_SLOW")] == ["host1"]
    assert len(cluster.cli_json("placement", "candidates", "VCPU:1", "--limit", "1")) == 1
    assert cluster.cli_json("placement", "candidates", "VCPU:99") == []


def test_candidates_full_query_language(cluster, world):
    h1, h2, cell, nfs = world["host1"], world["host2"], world["cell"], world["nfs"]

    def hosts(query, *extra):
        return [r["host"] for r in cluster.cli_json("placement", "candidates", query, *extra)]
    assert hosts("resources=VCPU:1&required=HW_CPU_X86_AVX2") == ["host1"]
    assert hosts("resources=VCPU:1&required=in:HW_CPU_X86_AVX2,CUSTOM_SLOW") == \
        ["host1", "host2"]
    assert hosts(f"resources=VCPU:1&member_of={world['agg']}") == ["host1"]
    assert hosts(f"resources=VCPU:1&member_of=!{world['agg']}") == ["host2"]
    assert hosts(f"resources=VCPU:1&in_tree={h2}") == ["host2"]
    assert hosts("resources=VCPU:1&limit=1") == ["host1"]
    assert len(hosts("resources=VCPU:1&limit=1", "--limit", "2")) == 2    # the flag wins
    # granular: a numbered group lands on the NUMA child, disk on the sharing nfs
    [row] = cluster.cli_json("placement", "candidates",
                             "resources=VCPU:2,DISK_GB:10&resources1=VGPU:1&group_policy=none")
    assert row == {"host": "host1", "allocations": {h1: {"VCPU": 2}, cell: {"VGPU": 1},
                                                    nfs: {"DISK_GB": 10}}}


@pytest.mark.parametrize("args, words", [
    (["VCPU:0"], "VCPU"),
    (["VCPUS:1"], "VCPUS"),
    (["CUSTOM_NOPE:1"], "CUSTOM_NOPE"),
    (["resources=VCPU:1&bogus=2"], "bogus"),
    (["resources1=VCPU:1&resources2=VCPU:1"], "group_policy"),
    (["resources=VCPU:1&member_of=not-a-uuid"], "member_of"),
    (["resources=VCPU:1&in_tree=00000000-0000-4000-8000-000000000000"], "in_tree"),
    (["resources=VCPU:1&limit=0"], "limit"),
    (["VCPU:1", "--required", "!CUSTOM_SLOW,CUSTOM_SLOW"], "CUSTOM_SLOW"),
    (["VCPU:1", "--limit", "0"], "limit"),
])
def test_candidates_bad_input(cluster, world, args, words):
    before = last_write(world["store"])
    done = cluster.cli("--format", "json", "placement", "candidates", *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert last_write(world["store"]) == before       # nothing written


def test_allocations_of_a_consumer_that_is_not_a_uuid_exits_2(cluster, world):
    before = last_write(world["store"])
    done = cluster.cli("--format", "json", "placement", "allocations", "not-a-uuid")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["peerctl: bad consumer 'not-a-uuid': not a UUID"]
    assert last_write(world["store"]) == before
    unknown = "00000000-0000-4000-8000-000000000000"       # a uuid holding nothing
    assert cluster.cli_json("placement", "allocations", unknown) == []


@pytest.mark.parametrize("args", [["placement", "providers"],
                                  ["placement", "allocations"],
                                  ["placement", "candidates", "VCPU:1"]])
def test_an_unreachable_openstack_placement_exits_3(cluster, world, args):
    """With $PEERCTL_PLACEMENT naming a Placement that does not answer, every
    placement command says so in one line and exits 3 (not 2: the input is fine)."""
    url = "http://127.0.0.1:1"
    done = cluster.cli("--format", "json", *args, env={"PEERCTL_PLACEMENT": url})
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"peerctl: placement unreachable at {url}"]


def test_placement_without_etcd_exits_3(cluster):
    done = cluster.cli("--etcd", "http://127.0.0.1:1", "--format", "json",
                       "placement", "providers")
    assert done.returncode == 3 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "127.0.0.1:1" in done.stderr


def test_the_placement_backend_comes_from_the_config_file(cluster, world, tmp_path):
    """`placement = URL` in the config file is used like $PEERCTL_PLACEMENT;
    the environment still overrides it."""
    url = "http://127.0.0.1:1"
    conf = tmp_path / "peerctl.conf"
    conf.write_text(f"[peerctl]\nplacement = {url}\n")
    done = cluster.cli("placement", "providers", env={"PEERCTL_CONF": str(conf)})
    assert (done.returncode, done.stderr) == (3, f"peerctl: placement unreachable at {url}\n")
    names = [row["name"] for row in cluster.cli_json(
        "placement", "providers", env={"PEERCTL_CONF": str(conf), "PEERCTL_PLACEMENT": "etcd"})]
    assert "host1" in names


@pytest.mark.parametrize("setting, said", [
    ("placement = ftp://x", "bad placement 'ftp://x' in {conf} (want etcd, or the http(s):// "
                            "URL of an OpenStack Placement)"),
    ("placement = http://127.0.0.1:8778\nplacement_token_file = nowhere",
     "cannot read placement_token_file '{dir}/nowhere': No such file or directory")])
def test_a_bad_placement_setting_is_one_line_naming_where_it_came_from(cluster, tmp_path,
                                                                        setting, said):
    conf = tmp_path / "peerctl.conf"
    conf.write_text(f"[peerctl]\n{setting}\n")
    done = cluster.cli("vmlist", env={"PEERCTL_CONF": str(conf)})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "peerctl: " + said.format(conf=conf, dir=tmp_path) + "\n"


def test_a_config_file_named_by_the_environment_must_exist(cluster, tmp_path):
    """$PEERCTL_CONF naming no file is a usage error, as --conf is."""
    missing = tmp_path / "missing.conf"
    done = cluster.cli("vmlist", env={"PEERCTL_CONF": str(missing)})
    assert done.returncode == 2
    assert done.stderr == (f"peerctl: cannot read config file '{missing}' from $PEERCTL_CONF: "
                           "No such file or directory\n")
