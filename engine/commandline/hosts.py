"""Hosts: hostlist, hoststats, ping."""
from __future__ import annotations

from engine.errors import Failed
from engine.operations import hosts as ops

from . import table, through
from .context import say
from .follow import act
from .listing import listing
from .options import detach_option, listing_options

C = table.Column
BUSY_CPU = 90     # a host at or above this CPU usage counts as busy in the totals

HOST_COLUMNS = [
    C("host", "Host"), C("status", "Status"), C("alive", "Alive"), C("enabled", "Enabled"),
    C("drained", "Drained"), C("reserved_by", "Lease", lambda v: v or "-"),
    C("hypervisor", "Hypervisor"), C("vcpus", "CPUs", right=True),
    C("memory_mb", "Memory", table.human_mb, True),
    C("free_memory_mb", "MemFree", table.human_mb, True),
    C("vms", "VMs", right=True), C("foreign_vms", "Foreign", right=True),
    C("foreign_vcpus", "ForeignCPUs", right=True),
    C("foreign_memory_mb", "ForeignMem", table.human_mb, True),
    C("foreign_disk_gb", "ForeignDisk", table.human_gb, True),
    C("disk_gb", "Disk", table.human_gb, True),
    C("free_disk_gb", "DiskFree", table.human_gb, True),
    C("kernel", "Kernel"), C("cpu_model", "CPU model"),
    C("cpu_usage", "CPU%", table.percent, True),
    C("used_memory_mb", "MemUsed", table.human_mb, True),
    C("memory_usage", "Mem%", table.percent, True),
    C("used_disk_gb", "DiskUsed", table.human_gb, True),
    C("disk_usage", "Disk%", table.percent, True),
    C("net_rx_bytes", "NetRx", table.human_bytes, True),
    C("net_tx_bytes", "NetTx", table.human_bytes, True),
    C("libvirt_uri", "Libvirt"), C("libvirt_remote", "Reached at", lambda v: v or "-"),
    C("api", "API", lambda v: v or "-"),
    C("machine", "Machine", lambda v: (v or "-")[:12]), C("provider_uuid", "Provider"),
    C("migration_address", "Migration", lambda v: v or "-"),
    C("migration_ports", "MigrationPorts",
      lambda v: "-".join(str(p) for p in dict.fromkeys(v)) if isinstance(v, list) and v else "-"),
    C("networks", "Networks", lambda names: ",".join(names) or "-"),
    C("version", "Version"), C("feature_level", "Level", right=True),
    C("verify", "Verify", lambda v: v or "-"),
]
HOSTLIST_DEFAULT = ["host", "status", "hypervisor", "vcpus", "memory_mb", "free_memory_mb",
                    "vms", "foreign_vms", "free_disk_gb", "kernel", "cpu_model", "verify"]
HOSTLIST_JSON = ops.LISTED
HOSTSTATS_DEFAULT = ["host", "status", "vcpus", "cpu_usage", "memory_mb", "used_memory_mb",
                     "memory_usage", "vms", "disk_gb", "used_disk_gb", "disk_usage",
                     "net_rx_bytes", "net_tx_bytes"]
HOSTSTATS_JSON = ops.STATS

def host_totals(hosts: list[dict]) -> str:
    alive = [h for h in hosts if h["alive"]]
    def total(key):
        return sum(h.get(key) or 0 for h in alive)
    cores, vms = total("vcpus"), total("vms")
    enabled = sum(1 for h in alive if h.get("enabled"))
    drained = sum(1 for h in alive if h.get("drained"))
    busy = sum(1 for h in alive if (h.get("cpu_usage") or 0) >= BUSY_CPU)
    cpu = (sum((h.get("cpu_usage") or 0) * (h.get("vcpus") or 0) for h in alive) / cores
           if cores else 0.0)
    mem, mem_free = total("memory_mb"), total("free_memory_mb")
    disk, disk_free = total("disk_gb"), total("free_disk_gb")
    lines = [f"{len(alive)} host{'s' if len(alive) != 1 else ''} responded "
             f"({enabled} enabled, {f'{drained} drained, ' if drained else ''}{busy} busy) "
             f"for a total of {cores} cores "
             f"hosting {vms} VM{'s' if vms != 1 else ''}",
             f"CPU: {cpu:.0f}% used, {100 - cpu:.0f}% free",
             f"Memory: {table.human_mb(mem_free)} free, "
             f"{table.human_mb(max(mem - mem_free, 0))} used of {table.human_mb(mem)}",
             f"Disk: {table.human_gb(disk_free)} free, "
             f"{table.human_gb(max(disk - disk_free, 0))} used of {table.human_gb(disk)}"]
    down = [h["host"] for h in hosts if not h["alive"]]
    if down:
        lines.append(f"{len(down)} host{'s' if len(down) != 1 else ''} not responding: "
                     + ", ".join(down))
    return "\n".join(lines)



def store_totals(space: dict) -> str:
    """hostlist's line about etcd itself: its database against its quota."""
    from engine.core.maintenance import WARN_RATIO
    line = (f"etcd: {space['db_size'] / 1024 ** 2:.1f} MiB of "
            f"{space['quota'] / 1024 ** 2:.0f} MiB quota ({space['ratio']:.0%})")
    if space["alarms"]:
        line += f", ALARM {', '.join(space['alarms'])}"
    elif space["ratio"] >= WARN_RATIO:
        line += ", nearing quota"
    return line



def ping_outcome(ctx, automation: str, task: dict) -> int:
    replies = (task.get("result") or {}).get("replies") or []
    doc = {"automation": automation, "state": task.get("state"), "replies": replies}
    if task.get("error"):
        doc["error"] = task["error"]
    stats: dict[str, list] = {}
    for reply in replies:
        stats.setdefault(reply.get("host"), []).append(reply.get("latency_ms") or 0.0)
    rows = [{"host": h, "replies": len(v), "min": f"{min(v):.1f}",
             "avg": f"{sum(v) / len(v):.1f}", "max": f"{max(v):.1f}"}
            for h, v in sorted(stats.items(), key=lambda i: table.natural_key(i[0]))]
    text = table.render(rows, [C("host", "Host"), C("replies", "Replies", right=True),
                               C("min", "Min ms", right=True), C("avg", "Avg ms", right=True),
                               C("max", "Max ms", right=True)])
    ctx.emit(doc, (text + "\n" if text else "") + f"automation {automation} {task.get('state')}")
    if task.get("state") != "done":
        raise Failed(f"ping {automation} {task.get('state')}"
                     + (f": {task['error']}" if task.get("error") else ""))
    return 0




def _hosts(ctx) -> list[dict]:
    """The hosts listed; with no pattern and no host ever seen, one warning:
    the likelier story is a mistyped ``--cluster`` (exit still 0)."""
    path = "/v1/hoststats" if ctx.args.command == "hoststats" else "/v1/hosts"
    hosts = through.read(ctx, lambda: ops.list_hosts(ctx, ctx.args.hostglob), path,
                         pattern=ctx.args.hostglob)
    if not hosts and not ctx.args.hostglob:
        say(f"peerctl: warning: no host has ever joined cluster {ctx.settings['cluster']!r} "
            f"at {ctx.settings['etcd']} (a mistyped --cluster?)" if ctx.api is None else
            f"peerctl: warning: no host has ever joined the cluster behind {ctx.remote.where()}")
    return hosts


def cmd_hostlist(ctx) -> int:
    def totals(rows):
        return host_totals(rows) + ("\n" + store_totals(ctx.space) if ctx.space else "")
    return listing(ctx, lambda: _hosts(ctx), HOST_COLUMNS,
                   HOSTLIST_DEFAULT, HOSTLIST_JSON, "host", totals)


def cmd_hoststats(ctx) -> int:
    return listing(ctx, lambda: _hosts(ctx), HOST_COLUMNS,
                   HOSTSTATS_DEFAULT, HOSTSTATS_JSON, "host", host_totals)


def cmd_ping(ctx) -> int:
    args = ctx.args
    plan = through.planned(ctx, lambda: ops.plan_ping(ctx, args.hostglob, args.rounds),
                           "/v1/ping", {"hosts": args.hostglob, "rounds": args.rounds}
                           if args.hostglob else {"rounds": args.rounds}, "ping", "hosts",
                           "replies")
    return act(ctx, plan, ping_outcome)


def _rounds(text: str) -> int:
    import argparse
    from .options import positive
    value = positive(text)
    if value > ops.MAX_ROUNDS:
        raise argparse.ArgumentTypeError(f"at most {ops.MAX_ROUNDS}: {text!r}")
    return value


def register(commands) -> None:
    sub = commands.add("hostlist", "list hosts: hypervisor, CPUs, memory, VMs, storage, kernel",
                       "python peerctl.py hostlist 'host1*' --sort -free_memory_mb",
                       cmd_hostlist, "List every host the cluster has seen (down ones too), "
                       "ending with the totals of the hosts that responded.")
    sub.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    listing_options(sub, HOST_COLUMNS, "host")

    sub = commands.add("hoststats", "show host usage: CPU, memory, VMs, disk and network",
                       "python peerctl.py hoststats --sort -cpu_usage", cmd_hoststats,
                       f"Show how loaded each host is, ending with the totals line. A host "
                       f"at {BUSY_CPU}% CPU or more counts as busy.")
    sub.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    listing_options(sub, HOST_COLUMNS, "host")

    sub = commands.add("ping", "round trips through the automation machinery to live hosts",
                       "python peerctl.py ping 'host*' --rounds 3", cmd_ping,
                       "Send each live host matching HOSTGLOB (all of them by default) N "
                       "round trips through one automation, and show the latency per host.")
    sub.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    sub.add_argument("--rounds", type=_rounds, default=1, metavar="N",
                     help=f"round trips per host, 1 to {ops.MAX_ROUNDS} (default 1)")
    detach_option(sub)
