"""The shapes of the keys the hypervisor room writes (see
``engine/core/values.py``).  Free of libvirt, so that listings can check
``vms/`` records without loading it."""
from engine.core import keys
from engine.core.values import declare, shape

__all__ = ["VM", "DISOWNED", "RECONCILE_REPORT"]

VM = shape("VM record", host=str, name=str, uuid=str, state=str)
DISOWNED = shape("disowned mark", uuid=str, host=str)
RECONCILE_REPORT = shape("reconcile report")

declare(keys.vm() + "*", VM)
declare(keys.disowned() + "*", DISOWNED)
declare(keys.RECONCILE_REPORT, RECONCILE_REPORT)
