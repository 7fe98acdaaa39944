"""VM clusters on the test driver, as the VM and move tests build them:
peers started with the test automations (``inventory``), VMs booted small,
and what the cluster holds read back (placement, ``vms/``, the hypervisors)."""
from engine.core import api
from engine.placement import open_placement
from tests.support import TEST_AUTOMATIONS, wait_for
from tests.support.cluster import finished, start_automation

ENV = {"PEERCTL_AUTOMATIONS_PATH": TEST_AUTOMATIONS}
SMALL = {"VCPU": 1, "MEMORY_MB": 64, "DISK_GB": 1}


def start(cluster, store, names, hooks=None, env=None):
    for name in names:
        extra = ["--hooks", hooks[name] if isinstance(hooks, dict) else hooks] \
            if hooks and (not isinstance(hooks, dict) or name in hooks) else []
        cluster.start_peer(name, extra_args=extra, env={**ENV, **(env or {})})
    wait_for(lambda: set(names) <= set(api.live_hosts(store)), what=f"{names} alive")
    placement = open_placement("etcd", store)
    wait_for(lambda: {n for n in names} <= {p["name"] for p in placement.providers()},
             what="providers registered")


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
