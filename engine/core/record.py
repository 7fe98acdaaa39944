"""An automation as read from etcd in one range read of ``auto/<id>/``."""
from __future__ import annotations

from dataclasses import dataclass, field

from .replay import LoggedStep, Response
from .store import KV
from .values import readable, report

__all__ = ["AutomationRecord", "response_from"]


def response_from(kv: KV, requested: float = 0.0) -> Response:
    value = kv.value or {}
    return Response(value.get("status", "error"), value.get("value"), value.get("error"),
                    value.get("executor"), value.get("time", 0.0), kv.mod_revision,
                    requested)


@dataclass
class AutomationRecord:
    id: str
    spec: dict | None = None
    status: dict | None = None
    entries: dict[int, dict] = field(default_factory=dict)
    responses: dict[int, KV] = field(default_factory=dict)
    claims: dict[int, KV] = field(default_factory=dict)
    candidates: list[KV] = field(default_factory=list)
    abort: dict | None = None
    aborting: KV | None = None      # the workers were told of the abort, at this revision
    wakes: list[KV] = field(default_factory=list)     # nudges not yet answered
    progress: dict[int, dict] = field(default_factory=dict)
    revision: int = 0
    unreadable: list[str] = field(default_factory=list)    # "key: why", skipped

    @classmethod
    def parse(cls, automation_id: str, kvs: list[KV], revision: int = 0) -> "AutomationRecord":
        """Every key that cannot be read (see ``engine/core/values.py``) is
        left out and named in ``unreadable``."""
        record = cls(automation_id, revision=revision)
        for kv in kvs:
            parts = kv.key.split("/")
            part = parts[2] if len(parts) > 2 else ""
            if part == "wake":
                record.wakes.append(kv)     # whatever it holds, it only wakes timers
            elif part in ("log", "resp", "claim") and not (len(parts) == 4 and parts[3].isdigit()):
                report(kv.key, f"not a {part} key: want auto/<id>/{part}/<index>")
                record.unreadable.append(kv.key)
            elif readable(kv) is None:
                record.unreadable.append(kv.key)
            elif part == "spec":
                record.spec = kv.value
            elif part == "status":
                record.status = kv.value
            elif part == "abort":
                record.abort = kv.value
            elif part == "aborting":
                record.aborting = kv
            elif part == "progress" and len(parts) == 4 and parts[3].isdigit():
                record.progress[int(parts[3])] = kv.value
            elif part == "log":
                record.entries[int(parts[3])] = kv.value
            elif part == "resp":
                record.responses[int(parts[3])] = kv
            elif part == "claim":
                record.claims[int(parts[3])] = kv
            elif part == "elect":
                record.candidates.append(kv)
        record.candidates.sort(key=lambda kv: kv.create_revision)
        return record

    @property
    def state(self) -> str:
        return (self.status or {}).get("state", "running")

    @property
    def initiator(self) -> str | None:
        leader = self.candidates[0].value if self.candidates else None
        return leader if isinstance(leader, str) else None

    def logged_steps(self) -> dict[tuple[str, int], LoggedStep]:
        return {(e["worker"], e["seq"]): LoggedStep(
                    i, e["worker"], e["seq"], e["fingerprint"],
                    f"{e['request']}@{e['target']}" if e.get("target") else e["request"],
                    worker_name=e.get("worker_name"), request=e.get("request"),
                    target=None if e.get("local") else e.get("target"), args=e.get("args"))
                for i, e in self.entries.items()}

    def responses_in_order(self) -> list[tuple[int, Response]]:
        ordered = sorted(self.responses.items(), key=lambda item: item[1].mod_revision)
        return [(index, response_from(kv, self.entries.get(index, {}).get("time", 0.0)))
                for index, kv in ordered]

    def pending(self) -> list[int]:
        return sorted(i for i in self.entries if i not in self.responses)
