"""Disks of stale VM copies kept aside after an HA restart: list them, and
plan deleting them on their hosts (docs/ha.md)."""
from __future__ import annotations

from engine.errors import Failed

from .plans import Plan, failed_doc
from .select import select_hosts, select_vms
from .tasks import iso

__all__ = ["list_aside", "plan_delete", "LISTED", "ORDER"]

# aside list's JSON: each row's fields, and the order of the rows
LISTED = ["host", "name", "uuid", "id", "time", "bytes", "volumes", "reason", "automation"]
ORDER = "host,name"


def _asides(ctx) -> list[dict]:
    from engine.core import keys
    from engine.core.values import readable
    import engine.hypervisor.domain.shapes  # noqa: F401  (declares aside/)
    rows = []
    for kv in ctx.store().range(keys.aside())[0]:
        record = readable(kv)
        if record is None:
            continue
        volumes = [v for v in record["volumes"] if isinstance(v, dict)]
        rows.append({"host": record["host"], "name": record["name"], "uuid": record["uuid"],
                     "id": record.get("id") or kv.key.rsplit("/", 1)[-1],
                     "time": iso(record.get("time")), "reason": record.get("reason"),
                     "automation": record.get("automation"),
                     "volumes": [str(v.get("name")) for v in volumes],
                     "bytes": sum(v.get("bytes") or 0 for v in volumes
                                  if isinstance(v.get("bytes"), int))})
    return rows


def list_aside(ctx, pattern: str | None = None) -> list[dict]:
    """``[{host, name, uuid, id, time, bytes, volumes, reason, automation}]``
    on the hosts matching ``pattern``."""
    return select_hosts(lambda: _asides(ctx), pattern, what="host with disks kept aside",
                        result=[])


def plan_delete(ctx, patterns: list[str]) -> Plan:
    """Delete the disk sets matching ``patterns`` (the VM's name or uuid)
    on their hosts, which must be up."""
    chosen = select_vms(lambda: _asides(ctx), list(patterns), what="disks kept aside", key="disks",
                        by_uuid=True)
    from engine.cluster import read_hosts
    alive = {h["host"] for h in read_hosts(ctx.store()) if h["alive"]}
    down = sorted({r["host"] for r in chosen} - alive)
    if down:
        raise Failed(f"host {down[0]} is down: its disks kept aside can be deleted once it is "
                     "back", result=failed_doc("disks"))
    disks = [{k: r[k] for k in ("host", "name", "uuid", "id")} for r in chosen]
    return Plan("aside_delete", {"disks": disks}, chosen, ask=len(chosen) > 1,
                what="disk sets", key="disks")
