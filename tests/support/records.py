"""Records written straight into etcd, for tests of listings and
refusals that need no peer: live-looking hosts and VMs."""
import time
import uuid

from engine.core import keys

__all__ = ["listed_hosts", "put_vm"]


def listed_hosts(store, names) -> None:
    """Live host records (held by a lease, as a peer's are), no peer running."""
    lease = store.grant(600)
    for name in names:
        record = {"host": name, "enabled": True, "vcpus": 8, "memory_mb": 16384,
                  "disk_gb": 500, "libvirt_uri": "test:///default", "updated": time.time()}
        store.put(keys.host_config(name), record)
        store.put(keys.host(name), record, lease)


def put_vm(store, host, name, state="running") -> str:
    """A VM record on ``host``; its uuid."""
    vm_uuid = str(uuid.uuid4())
    store.put(keys.vm(host, vm_uuid), {"host": host, "name": name, "uuid": vm_uuid,
                                       "state": state, "vcpus": 1, "memory_mb": 512,
                                       "disk_gb": 10})
    return vm_uuid
