"""A planned automation: what it is, what it acts on, and whether a person
should confirm it first; :func:`engine.operations.tasks.start` starts it."""
from __future__ import annotations

import dataclasses

__all__ = ["Plan", "failed_doc"]


@dataclasses.dataclass
class Plan:
    kind: str                   # the automation's kind: boot, destroy, migrate ...
    args: dict                  # its arguments, as the automation takes them
    targets: list[dict]         # what it acts on, one row each, for a listing
    ask: bool = False           # a person confirms it first (several things, a whole host)
    what: str = "VMs"           # what the targets are, for the question ("VMs", "disk sets")
    key: str = "vms"            # the result's list of targets: vms, disks, replies

    def dry_run(self) -> dict:
        """The document of a dry run: what would be acted on, nothing started."""
        return {"automation": None, "state": "dry-run", self.key: self.targets}


def failed_doc(key: str = "vms", state: str = "failed") -> dict:
    """The document of an automation that never started (refused, cancelled)."""
    return {"automation": None, "state": state, key: []}
