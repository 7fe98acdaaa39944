"""The documents of ``peerctl lease ...`` (docs/cli.md): plain functions
over lease records, for every face; the command line's text is in
engine/commandline/lease_views.py."""
from __future__ import annotations

import fnmatch

from engine.leases.times import iso

__all__ = ["lease_doc", "lease_detail", "spec_text", "calendar_doc", "LEASE_FIELDS"]

LEASE_FIELDS = ["lease", "state", "start", "end", "kind", "hosts", "resources", "amount",
                "used", "vms"]


def spec_text(resources: dict | None) -> str | None:
    if not resources:
        return None
    return ",".join(f"{rc}:{n}" for rc, n in sorted(resources.items()))


def lease_doc(record: dict, vms: list[dict] | None = None) -> dict:
    """``{lease, state, start, end, kind, hosts, resources, amount, used, vms}``:
    times in ISO 8601 UTC; ``amount`` is the number of hosts or slots;
    ``used`` how many VMs run in it."""
    vms = vms or []
    hosts = sorted(record.get("hosts") or record.get("slots") or [])
    amount = record.get("count") if record["kind"] == "hosts" else record.get("amount")
    return {"lease": record["lease"], "state": record["state"], "start": iso(record["start"]),
            "end": iso(record["end"]), "kind": record["kind"], "hosts": hosts,
            "resources": spec_text(record.get("resources")), "amount": amount,
            "used": len(vms), "vms": [vm["name"] for vm in vms]}


def lease_detail(record: dict, vms: list[dict] | None = None) -> dict:
    """``lease show``: the listing's fields and its reservations, events,
    VMs (with hosts), policy and warning."""
    doc = lease_doc(record, vms)
    doc.update({"on_end": record.get("on_end", "destroy"), "warn": record.get("warn"),
                "warned": bool(record.get("warned")), "required": record.get("required"),
                "on": record.get("on"), "slots": record.get("slots"),
                "automation": record.get("automation"), "error": record.get("error"),
                "consumer": record.get("consumer"),
                "uncleared": record.get("uncleared") or [],
                "events": [{**e, "time": iso(e.get("time"))} for e in record.get("events", [])],
                "vm_hosts": {vm["name"]: vm["host"] for vm in vms or []}})
    return doc


def calendar_doc(entries: list[dict], hosts: list[str], since: float, until: float,
                 glob: str = "*") -> dict:
    """``{from, to, hosts: {host: [{lease, kind, start, end, slots?}]}}``."""
    shown = {h: [] for h in hosts if fnmatch.fnmatchcase(h, glob)}
    for entry in sorted(entries, key=lambda e: (e["start"], e["lease"])):
        if entry["end"] <= since or entry["start"] >= until:
            continue
        held = entry.get("hosts") or list((entry.get("slots") or {}).keys())
        for host in held:
            if host in shown:
                item = {"lease": entry["lease"], "kind": entry["kind"],
                        "start": iso(entry["start"]), "end": iso(entry["end"])}
                if entry["kind"] == "capacity":
                    item["slots"] = entry["slots"][host]
                shown[host].append(item)
    return {"from": iso(since), "to": iso(until), "hosts": shown}
