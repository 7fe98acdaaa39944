"""A planned automation: what it is, what it acts on, and whether a person
should confirm it first; :func:`engine.operations.tasks.start` starts it."""
from __future__ import annotations

import dataclasses
import fnmatch

from engine.cluster import read_hosts
from engine.errors import Failed
from engine.wording import given

__all__ = ["Plan", "failed_doc", "refuse_down_hosts", "check_somewhere"]


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


def refuse_down_hosts(vms: list[dict], then: str, lead: str = "VM {name!r}",
                      after: str = "") -> None:
    """Refuse, in one line and before anything starts, VMs whose host is
    down (listed ``unknown``): ``LEAD is on HOST, which is down: THEN once
    its host is back AFTER (and N more)``, naming the first one."""
    down = [vm for vm in vms if vm.get("state") == "unknown"]
    if down:
        vm = down[0]
        raise Failed(lead.format(name=vm["name"])
                     + f" is on {vm['host']}, which is down: {then} once its host is back"
                     + after + (f" (and {len(down) - 1} more)" if len(down) > 1 else ""),
                     result=failed_doc())


def check_somewhere(ctx, on: str, reservation: str | None) -> None:
    """``--on`` matching no host, or only hosts that take no new VM (down,
    drained, disabled, reserved by another lease), is refused before an
    automation starts, naming why."""
    hosts = [h for h in read_hosts(ctx.store()) if fnmatch.fnmatchcase(h["host"], on)]
    if not hosts:
        raise Failed(f"no host matches {given('on', on)}", result=failed_doc())

    def takes(host):
        return host.get("status") == "up" or (
            host.get("status") == "reserved" and host.get("reserved_by") == reservation)
    if not any(takes(h) for h in hosts):
        why = ", ".join(f"{h['host']} {h.get('status')}" + (
            f" by lease {h['reserved_by']}" if h.get("status") == "reserved" else "")
            for h in hosts)
        raise Failed(f"no host among {given('on', on)} takes new VMs: {why}",
                     result=failed_doc())
