"""Disks kept aside, as a test sets them up: the record an HA restart
leaves when it keeps a stale copy's disks on its old host."""
from __future__ import annotations

import time
import uuid

from engine.core import keys

__all__ = ["keep_aside"]


def keep_aside(store, host: str, name: str) -> dict:
    """A record of disks an HA restart kept aside on ``host``."""
    vm_uuid = str(uuid.uuid4())
    record = {"host": host, "name": name, "uuid": vm_uuid, "id": vm_uuid, "time": time.time(),
              "reason": "restarted on host2", "automation": None,
              "volumes": [{"name": f"aside-{vm_uuid}-1-disk0", "bytes": 1024}]}
    store.put(keys.aside(host, vm_uuid), record)
    return record
