"""Hosts: list them with what is derived from their records (used memory
and disk, ratios), and plan a ping through the automation machinery."""
from __future__ import annotations

import fnmatch

from .plans import Plan, failed_doc
from .select import host_pattern, select_hosts

__all__ = ["LISTED", "STATS", "ORDER", "list_hosts", "networks_of", "plan_ping", "MAX_ROUNDS"]

MAX_ROUNDS = 10000
# hostlist's and hoststats' JSON: each row's fields, and the order of the rows
LISTED = ["host", "alive", "enabled", "drained", "reserved_by", "vcpus", "memory_mb",
          "free_memory_mb", "disk_gb", "free_disk_gb", "vms", "foreign_vms", "foreign_vcpus",
          "foreign_memory_mb", "foreign_disk_gb", "hypervisor", "kernel", "cpu_model",
          "networks", "version", "feature_level", "verify"]
STATS = ["host", "alive", "enabled", "vcpus", "cpu_usage", "memory_mb", "free_memory_mb",
         "vms", "disk_gb", "free_disk_gb", "net_rx_bytes", "net_tx_bytes"]
ORDER = "host"


def _ratio(used, total):
    return round(100.0 * used / total, 1) if total else None


def networks_of(record: dict) -> list[str]:
    """A host record's ``networks``, the names only (garbage in etcd: none)."""
    networks = record.get("networks")
    return [n for n in networks if isinstance(n, str)] if isinstance(networks, list) else []


def _derived(record: dict) -> dict:
    def used(total, free):
        return None if total is None or free is None else max(total - free, 0)
    record["networks"] = networks_of(record)
    record["used_memory_mb"] = used(record.get("memory_mb"), record.get("free_memory_mb"))
    record["used_disk_gb"] = used(record.get("disk_gb"), record.get("free_disk_gb"))
    record["memory_usage"] = _ratio(record["used_memory_mb"] or 0, record.get("memory_mb"))
    record["disk_usage"] = _ratio(record["used_disk_gb"] or 0, record.get("disk_gb"))
    return record


def list_hosts(ctx, pattern: str | None = None) -> list[dict]:
    """Every host the cluster has seen, down ones too, or those matching the
    host pattern (:class:`NoMatch` when it matches none)."""
    from engine.cluster import read_hosts
    return [_derived(h) for h in select_hosts(lambda: read_hosts(ctx.store()), pattern,
                                                  result=[])]


def plan_ping(ctx, pattern: str | None = None, rounds: int = 1) -> Plan:
    """Round trips through the automation machinery to each live host
    matching ``pattern``."""
    from engine.errors import Failed, UsageError
    from engine.cluster import read_hosts
    if not 1 <= rounds <= MAX_ROUNDS:
        raise UsageError(f"bad rounds {rounds} (1 to {MAX_ROUNDS})")
    glob = host_pattern(pattern)
    hosts = [h["host"] for h in read_hosts(ctx.store())
             if h["alive"] and fnmatch.fnmatchcase(h["host"], glob)]
    if not hosts:       # none, or only down ones: nothing to ping either way
        raise Failed(f"no live host matches {glob!r}", result=failed_doc("replies"))
    return Plan("ping", {"hosts": hosts, "rounds": rounds},
                [{"host": h} for h in hosts], key="replies")
