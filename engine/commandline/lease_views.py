"""The text of ``peerctl lease show`` and the timeline of ``lease calendar``
(their documents: engine/operations/lease_docs.py)."""
from __future__ import annotations

import fnmatch
import string

from engine.leases.times import human_span, iso

__all__ = ["detail_text", "calendar_text"]

SYMBOLS = string.ascii_uppercase + string.digits


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


def calendar_parts(doc: dict) -> dict:
    """What :func:`calendar_text` needs, from the calendar's document (as
    the API answers it): one entry per lease, with the hosts it holds."""
    from engine.leases.times import parse_time
    entries: dict[str, dict] = {}
    for host, held in doc["hosts"].items():
        for item in held:
            entry = entries.setdefault(item["lease"], {
                "lease": item["lease"], "kind": item["kind"], "hosts": [],
                "start": parse_time(item["start"], "start"), "end": parse_time(item["end"], "end")})
            entry["hosts"].append(host)
    return {"entries": list(entries.values()), "hosts": list(doc["hosts"]),
            "since": parse_time(doc["from"], "from"), "until": parse_time(doc["to"], "to")}
