"""What ``peerctl.py lease ...`` shows: the JSON shapes (CONTRACT.md) and the
text timeline of ``lease calendar``.  Plain functions over lease records;
the command line prints what they return."""
from __future__ import annotations

import fnmatch
import string

from .times import human_span, iso

__all__ = ["lease_doc", "lease_detail", "spec_text", "calendar_doc", "calendar_text",
           "LEASE_FIELDS"]

LEASE_FIELDS = ["lease", "state", "start", "end", "kind", "hosts", "resources", "amount",
                "used", "vms"]
SYMBOLS = string.ascii_uppercase + string.digits


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


def detail_text(doc: dict) -> str:
    lines = [f"lease {doc['lease']}: {doc['state']}, {doc['kind']}, "
             f"{doc['start']} .. {doc['end']}"]
    if doc["kind"] == "hosts":
        lines.append(f"hosts: {', '.join(doc['hosts']) or '-'} ({doc['amount']} asked)")
    else:
        slots = ", ".join(f"{h}: {n}" for h, n in sorted((doc.get("slots") or {}).items()))
        lines.append(f"slots: {doc['amount']} x {doc['resources']} ({slots or 'none'})")
    if doc.get("required") or doc.get("on"):
        lines.append(f"required: {doc.get('required') or '-'}; on: {doc.get('on') or '*'}")
    warn = f", warning {human_span(doc['warn'])} before" if doc.get("warn") else ""
    lines.append(f"at the end: {doc['on_end']} its VMs{warn}"
                 + (" (warned)" if doc.get("warned") else ""))
    lines.append("VMs: " + (", ".join(f"{n} on {h}" for n, h in sorted(doc["vm_hosts"].items()))
                            or "none"))
    if doc.get("uncleared"):
        lines.append("not cleared at the start: " + "; ".join(
            f"{u['name']} on {u['host']}: {u.get('error')}" for u in doc["uncleared"]))
    if doc.get("error"):
        lines.append(f"error: {doc['error']}")
    lines.append(f"automation: {doc.get('automation') or '-'}")
    for item in doc["events"]:
        lines.append(f"  {item['time']}  {item['event']}"
                     + (f": {item['note']}" if item.get("note") else ""))
    return "\n".join(lines)


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


def calendar_text(entries: list[dict], hosts: list[str], since: float, until: float,
                  glob: str = "*", width: int = 56) -> str:
    """One row per host, one column per ``(until - since) / width``: ``.``
    free, a letter for the lease holding it (upper case a whole-host lease,
    lower case capacity slots), ``*`` for several; a legend below."""
    names = sorted({e["lease"] for e in entries if e["end"] > since and e["start"] < until})
    symbol = {name: SYMBOLS[i % len(SYMBOLS)] for i, name in enumerate(names)}
    step = (until - since) / width
    shown = [h for h in hosts if fnmatch.fnmatchcase(h, glob)]
    label = max([len(h) for h in shown] + [4])
    header = f"{'':{label}}  {iso(since)[:16]}" + " " * max(1, width - 32) + f"{iso(until)[:16]}"
    rows = [header]
    for host in shown:
        cells = []
        for col in range(width):
            t0, t1 = since + col * step, since + (col + 1) * step
            here = [e for e in entries if e["start"] < t1 and e["end"] > t0
                    and host in (e.get("hosts") or e.get("slots") or ())]
            if not here:
                cells.append(".")
            elif len({e["lease"] for e in here}) > 1:
                cells.append("*")
            else:
                mark = symbol[here[0]["lease"]]
                cells.append(mark.upper() if here[0]["kind"] == "hosts" else mark.lower())
        rows.append(f"{host:{label}}  {''.join(cells)}")
    per = human_span(step)
    rows.append(f"(one column = {per}; upper case: whole hosts, lower case: capacity "
                "slots, *: several leases)")
    for entry in sorted({e["lease"]: e for e in entries}.values(), key=lambda e: e["start"]):
        if entry["lease"] in symbol:
            rows.append(f"  {symbol[entry['lease']]}  {entry['lease']}  {entry['kind']}  "
                        f"{iso(entry['start'])} .. {iso(entry['end'])}")
    return "\n".join(rows)
