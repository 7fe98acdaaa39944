"""Test-driver hosts for HA and replica tests: peers with a short HA
margin on big fake hosts, VMs booted on one of them, and vmlist by name."""
from engine.core import api
from engine.placement import open_placement
from tests.support import TEST_AUTOMATIONS, wait_for
from tests.support.vms import big_test_host

__all__ = ["MARGIN", "SMALL", "start_hosts", "boot", "vmlist"]

MARGIN = 1.0
SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"


def start_hosts(cluster, store, tmp_path, names, margin=MARGIN, env=None):
    for name in names:
        uri = big_test_host(tmp_path / f"{name}.xml")
        cluster.start_peer(name, libvirt=uri, extra_args=["--ha-margin", str(margin)],
                           env={"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS, **(env or {})})
    wait_for(lambda: set(names) <= set(api.live_hosts(store)), what=f"{names} alive")
    placement = open_placement("etcd", store)
    wait_for(lambda: set(names) <= {p["name"] for p in placement.providers()},
             what="providers registered")


def boot(cluster, names, on, *flags):
    doc = cluster.cli_json("boot", *names, "--resources", SMALL, "--network", "none",
                           "--on", on, *flags)
    assert doc["state"] == "done", doc
    return {vm["name"]: vm["uuid"] for vm in doc["vms"]}


def vmlist(cluster):
    return {vm["name"]: vm for vm in cluster.cli_json("vmlist")}
