"""The shapes of the keys the hypervisor room writes (see
``engine/core/values.py``).  Free of libvirt, so that listings can check
``vms/`` records without loading it."""
import ipaddress

from engine.core import keys
from engine.core.values import declare, shape

__all__ = ["VM", "DISOWNED", "RECONCILE_REPORT", "VM_DEFINITION", "ASIDE", "RECOVERY",
           "RESTART", "FOREIGN", "OWN_VOLUMES", "HA_POLICIES", "WANTED", "PASSING", "first_ip"]

VM = shape("VM record", host=str, name=str, uuid=str, state=str)
DISOWNED = shape("disowned mark", uuid=str, host=str)
RECONCILE_REPORT = shape("reconcile report")
VM_DEFINITION = shape("VM definition", uuid=str, name=str, build=dict)
ASIDE = shape("disks kept aside", uuid=str, host=str, name=str, volumes=list)
RECOVERY = shape("host recovery", host=str, automation=str)
RESTART = shape("HA restart request", uuid=str, host=str)
FOREIGN = shape("foreign domain", host=str, name=str, uuid=str, state=str, problems=list)
OWN_VOLUMES = shape("a VM's own volumes", uuid=str, host=str, paths=list)

HA_POLICIES = ("restart", "none")   # what happens to a VM when its host dies
WANTED = ("running", "paused", "shutoff")   # a VM's intended state (its record's ``want``)
# A paused VM record's ``state_reason`` that passes without anyone acting
# (libvirt pauses a guest for these and resumes it): waiting on it makes sense.
PASSING = ("migration", "save", "dump", "snapshot", "starting-up", "shutting-down",
           "postcopy")

declare(keys.vm() + "*", VM)
declare(keys.disowned() + "*", DISOWNED)
declare(keys.RECONCILE_REPORT, RECONCILE_REPORT)
declare(keys.vm_definition() + "*", VM_DEFINITION)
declare(keys.aside() + "*", ASIDE)
declare(keys.recovery() + "*", RECOVERY)
declare(keys.restart() + "*", RESTART)
declare(keys.foreign() + "*", FOREIGN)
declare(keys.own_volumes() + "*", OWN_VOLUMES)


def first_ip(addresses: list[dict]) -> str | None:
    """A VM record's ``ip``: the first IPv4 of its ``addresses``, else the
    first IPv6, else None."""
    for version in (4, 6):
        for entry in addresses or []:
            if ipaddress.ip_address(entry["addr"]).version == version:
                return entry["addr"]
    return None
