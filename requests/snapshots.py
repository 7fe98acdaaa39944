"""The requests of snapshots (see ``automations/snapshots.py``), run on the
VM's host by :mod:`engine.hypervisor.data.snapshots`:

- ``snapshot_create`` ``{uuid, name, snapshot, memory, owner}`` -> the
  record ``{vm, uuid, host, name, time, memory, state, automation}`` plus
  ``dropped`` (checkpoints a shut-off VM lost);
- ``snapshot_revert`` ``{uuid, name, snapshot}`` -> ``{uuid, snapshot,
  memory, state, dropped}`` (every checkpoint of the VM is deleted first);
- ``snapshot_delete`` ``{uuid, name, snapshot}`` -> ``{uuid, snapshot,
  deleted, state}``.

Each is idempotent by (uuid, snapshot): run again after a lost reply, it
finds the first run's work."""
from engine.core.handlers import handler
from engine.hypervisor.data import snapshots

handler("snapshot_create")(snapshots.create)
handler("snapshot_revert")(snapshots.revert)
handler("snapshot_delete")(snapshots.delete)
