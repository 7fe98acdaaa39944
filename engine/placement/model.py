"""The Placement data model, as OpenStack Placement defines it, in plain dicts.

Both backends speak these shapes:

- a provider is ``{uuid, name, parent, root, generation, inventories, usages,
  traits, aggregates}``;
- an inventory is ``{total, reserved, min_unit, max_unit, step_size,
  allocation_ratio}`` per resource class;
- allocations are ``{provider_uuid: {resource_class: amount}}``.

This module holds the rules that do not depend on where the data lives:
names of resource classes and traits, inventory defaults, input validation
(one clear :class:`PlacementError` naming the bad part) and the capacity rule
``used + amount <= (total - reserved) * allocation_ratio`` with
``min_unit <= amount <= max_unit`` and ``amount % step_size == 0``.
"""
from __future__ import annotations

import functools
import re
import uuid as uuidlib

from engine.errors import Conflict, NotFound, PlacementError, PlacementUnavailable

__all__ = [
    "PlacementError", "NotFound", "Conflict", "PlacementUnavailable", "STANDARD_RESOURCE_CLASSES",
    "SHARING_TRAIT", "DISABLED_TRAIT", "INVENTORY_DEFAULTS", "capacity",
    "check_resource_class_name", "check_trait_name", "check_uuid",
    "normalize_inventories", "normalize_allocations", "amount_problem",
    "consumer_doc", "empty_consumer", "same_holding", "standard_traits",
]


# os-resource-classes 1.1.0, so that the etcd backend needs no OpenStack package.
STANDARD_RESOURCE_CLASSES = frozenset([
    "VCPU", "MEMORY_MB", "DISK_GB", "PCI_DEVICE", "SRIOV_NET_VF", "NUMA_SOCKET",
    "NUMA_CORE", "NUMA_THREAD", "NUMA_MEMORY_MB", "IPV4_ADDRESS", "VGPU",
    "VGPU_DISPLAY_HEAD", "NET_BW_EGR_KILOBIT_PER_SEC", "NET_BW_IGR_KILOBIT_PER_SEC",
    "PCPU", "MEM_ENCRYPTION_CONTEXT", "FPGA", "PGPU",
    "NET_PACKET_RATE_KILOPACKET_PER_SEC", "NET_PACKET_RATE_EGR_KILOPACKET_PER_SEC",
    "NET_PACKET_RATE_IGR_KILOPACKET_PER_SEC"])

SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"
DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"     # what nova sets on a disabled compute
MAX_INT = 2147483647

INVENTORY_DEFAULTS = {"reserved": 0, "min_unit": 1, "max_unit": MAX_INT,
                      "step_size": 1, "allocation_ratio": 1.0}
_NAME = re.compile(r"^[A-Z0-9_]{1,255}$")


def check_resource_class_name(name) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise PlacementError(f"bad resource class {name!r}: want upper-case "
                             "letters, digits and _")
    if name not in STANDARD_RESOURCE_CLASSES and not name.startswith("CUSTOM_"):
        raise PlacementError(f"unknown resource class {name!r}: not a standard "
                             "class, and custom classes start with CUSTOM_")
    return name


@functools.lru_cache(maxsize=1)
def standard_traits() -> frozenset | None:
    """The standard trait names of the ``os-traits`` package (what Placement
    itself knows; requirements.txt installs it), None without the package."""
    try:
        import os_traits
    except ImportError:
        return None
    return frozenset(os_traits.get_traits())


def check_trait_name(name) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise PlacementError(f"bad trait {name!r}: want upper-case letters, digits and _")
    standard = standard_traits()
    if standard is not None and not name.startswith("CUSTOM_") and name not in standard:
        raise PlacementError(f"unknown trait {name!r}: not a standard trait, and custom "
                             "traits start with CUSTOM_")
    return name


def check_uuid(value, what: str) -> str:
    try:
        return str(uuidlib.UUID(str(value)))
    except (ValueError, TypeError, AttributeError):
        raise PlacementError(f"bad {what} {value!r}: not a UUID") from None


def _int(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlacementError(f"{what} must be an integer, not {value!r}")
    if value < minimum:
        raise PlacementError(f"{what} must be >= {minimum}, not {value}")
    return value


def normalize_inventories(inventories: dict) -> dict:
    """``{RC: total | {total, ...}}`` -> full inventory records with defaults."""
    if not isinstance(inventories, dict):
        raise PlacementError("inventories must be a mapping of resource class to inventory")
    result = {}
    for rc, record in inventories.items():
        check_resource_class_name(rc)
        if isinstance(record, int) and not isinstance(record, bool):
            record = {"total": record}
        if not isinstance(record, dict) or "total" not in record:
            raise PlacementError(f"inventory of {rc} needs a total")
        unknown = set(record) - set(INVENTORY_DEFAULTS) - {"total"}
        if unknown:
            raise PlacementError(f"inventory of {rc}: unknown field(s) {sorted(unknown)}")
        full = {**INVENTORY_DEFAULTS, **record}
        inv = {"total": _int(full["total"], f"{rc} total", 1),
               "reserved": _int(full["reserved"], f"{rc} reserved", 0),
               "min_unit": _int(full["min_unit"], f"{rc} min_unit", 1),
               "max_unit": _int(full["max_unit"], f"{rc} max_unit", 1),
               "step_size": _int(full["step_size"], f"{rc} step_size", 1)}
        ratio = full["allocation_ratio"]
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
            raise PlacementError(f"{rc} allocation_ratio must be a number > 0, not {ratio!r}")
        inv["allocation_ratio"] = float(ratio)
        if inv["reserved"] > inv["total"]:
            raise PlacementError(f"{rc} reserved ({inv['reserved']}) exceeds total "
                                 f"({inv['total']})")
        if inv["min_unit"] > inv["max_unit"]:
            raise PlacementError(f"{rc} min_unit exceeds max_unit")
        result[rc] = inv
    return result


def normalize_allocations(allocations: dict) -> dict:
    """Check ``{provider_uuid: {RC: amount}}``; amounts are integers >= 1."""
    if not isinstance(allocations, dict):
        raise PlacementError("allocations must be a mapping of provider uuid to resources")
    result = {}
    for rp, resources in allocations.items():
        rp = check_uuid(rp, "provider uuid")
        if isinstance(resources, dict) and set(resources) == {"resources"}:
            resources = resources["resources"]     # Placement's wire form
        if not isinstance(resources, dict) or not resources:
            raise PlacementError(f"allocation on provider {rp} names no resources")
        merged = result.setdefault(rp, {})
        for rc, amount in resources.items():
            check_resource_class_name(rc)
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
                raise PlacementError(f"amount of {rc} on provider {rp} must be an "
                                     f"integer >= 1, not {amount!r}")
            merged[rc] = merged.get(rc, 0) + amount
    return result


def capacity(inventory: dict) -> int:
    return int((inventory["total"] - inventory["reserved"]) * inventory["allocation_ratio"])


def amount_problem(inventory: dict | None, amount: int) -> str | None:
    """Why ``amount`` can never be allocated from ``inventory`` (None if it can)."""
    if inventory is None:
        return "no inventory"
    if amount < inventory["min_unit"]:
        return f"below min_unit {inventory['min_unit']}"
    if amount > inventory["max_unit"]:
        return f"above max_unit {inventory['max_unit']}"
    if amount % inventory["step_size"]:
        return f"not a multiple of step_size {inventory['step_size']}"
    return None


def consumer_doc(consumer, allocations, project, user, consumer_type) -> dict:
    """What a consumer holds: ``{consumer, generation, project, user,
    consumer_type, allocations}``."""
    for what, value in (("project", project), ("user", user),
                        ("consumer_type", consumer_type)):
        if not isinstance(value, str) or not value:
            raise PlacementError(f"{what} must be a non-empty string, not {value!r}")
    if not _NAME.match(consumer_type):
        raise PlacementError(f"bad consumer_type {consumer_type!r}: want upper-case "
                             "letters, digits and _ (at most 255)")
    return {"consumer": consumer, "generation": None, "project": project, "user": user,
            "consumer_type": consumer_type, "allocations": allocations}


def empty_consumer(consumer: str) -> dict:
    return {"consumer": consumer, "generation": None, "project": None, "user": None,
            "consumer_type": None, "allocations": {}}


def same_holding(have: dict, want: dict) -> bool:
    """Would writing ``want`` change nothing?  (A repeated claim.)"""
    return all(have[k] == want[k] for k in ("allocations", "project", "user", "consumer_type"))
