"""VM clusters on the test driver, as the VM and move tests build them:
peers started with the test automations (``inventory``), VMs booted small,
and what the cluster holds read back (placement, ``vms/``, the hypervisors)."""
from engine.core import api
from engine.placement import open_placement
from tests.support import TEST_AUTOMATIONS, wait_for
from tests.support.cluster import finished, start_automation

ENV = {"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS}
SMALL = {"VCPU": 1, "MEMORY_MB": 64, "DISK_GB": 1}


def start(cluster, store, names, hooks=None, env=None, libvirt="test:///default"):
    for name in names:
        extra = ["--hooks", hooks[name] if isinstance(hooks, dict) else hooks] \
            if hooks and (not isinstance(hooks, dict) or name in hooks) else []
        cluster.start_peer(name, libvirt=libvirt, extra_args=extra, env={**ENV, **(env or {})})
    wait_for(lambda: set(names) <= set(api.live_hosts(store)), what=f"{names} alive")
    placement = open_placement("etcd", store)
    wait_for(lambda: set(names) <= registered(store, placement),
             what="providers registered, with the traits of the networks their hosts offer")


def registered(store, placement) -> set[str]:
    """Hosts whose provider holds inventory and a trait for each network
    the host's record says it offers: a boot asking for one finds them."""
    from engine.hypervisor.domain.networks import network_trait
    offered = {name: record.get("networks") or [] for name, record in api.live_hosts(store).items()}
    return {p["name"] for p in placement.providers()
            if p.get("inventories") and p["name"] in offered
            and {network_trait(n) for n in offered[p["name"]]} <= set(p.get("traits") or ())}


def reconcile_every(seconds: float) -> dict:
    """Peers' environment for a reconciler pass every ``seconds``."""
    return {"PEERCTL_RECONCILE_INTERVAL": str(seconds)}


def run(store, kind, args, **options):
    """Start ``kind``, which may be one of tests/automations (``inventory``)."""
    return start_automation(store, kind, args, **options)


def inventory(store, hosts):
    task = finished(store, run(store, "inventory", {"hosts": hosts}))
    assert task["state"] == "done", task["error"]
    return task["result"]["hosts"]


def booted(names, on="t*"):
    return {"vms": [{"name": n, "resources": SMALL, "on": on} for n in names]}


def allocations(store):
    placement = open_placement("etcd", store)
    return {a["consumer"]: a for a in placement.all_allocations() if a["allocations"]}


def published(store):
    kvs, _ = store.range("vms/")
    return [kv.value for kv in kvs]


def big_test_host(path, cpus=32, memory_gib=16) -> str:
    """A test-driver host file with more room than ``test:///default``'s
    16 CPUs and 3 GiB (a hundred small VMs fit); its URI."""
    path.write_text(f"<node><cpu><nodes>1</nodes><sockets>1</sockets><cores>{cpus}</cores>"
                    f"<threads>1</threads><active>{cpus}</active><mhz>2000</mhz>"
                    f"<model>i686</model></cpu><memory>{memory_gib << 20}</memory></node>")
    return f"test://{path}"
