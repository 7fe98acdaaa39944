"""``inventory``: what the hypervisor really holds, for reconcilers and checks.

Returns ``{"host", "domains": [{uuid, name, state}], "volumes": [name]}``:
every libvirt domain and every volume of peerctl's storage pool.  Read-only.
"""
from engine.core.handlers import handler
from engine.hypervisor.storage import images
from engine.hypervisor.domain.records import vm_state


@handler("inventory")
def inventory(host, args: dict) -> dict:
    conn = host.conn
    domains = [{"uuid": dom.UUIDString(), "name": dom.name(), "state": vm_state(dom)}
               for dom in conn.listAllDomains()]
    pool = images.ensure_pool(host)
    pool.refresh(0)
    return {"host": host.host, "domains": domains, "volumes": sorted(pool.listVolumes())}
