"""peerctl's command line, behind ``peerctl.py`` (the one file a user runs,
also installed as the ``peerctl`` console script).

It lives in this module rather than in ``peerctl.py`` itself because Python
never caches the bytecode of the script it is given: 2,000 lines compiled
on every command cost more than a listing's own work.  It runs a peer
(``peer``), starts and follows replicated automations (``boot``,
``destroy`` ... ``ping``, ``migrate``, ``evacuate``), drains hosts (``drain``,
``undrain``), lists what the cluster knows (``vmlist``,
``hostlist``, ``hoststats``, ``tasks``, ``placement``), finds what nobody
can read in etcd (``scrub``) and brings up an embedded local cluster (``up`` /
``down``).  It is the command line only: reading the cluster is
``engine/cluster.py``, the local cluster ``engine/supervisor.py``, the live
view ``engine/progress.py``, the checks of endpoints and durations
``engine/core/validate.py``, resource specs ``engine/placement/query.py``.

What it promises (see ../shared/CONTRACT.md, beside this repository):
- exit 0 on success, 1 when the operation ran and failed or a pattern matched
  nothing, 2 on a usage error (one line naming the bad part), 3 when etcd is
  unreachable (one line naming the endpoint); 130 after Ctrl-C detached from
  an automation, which goes on;
- ``--format json`` prints exactly one JSON document on stdout, messages and
  progress go to stderr;
- no traceback reaches the user unless ``--debug`` is given.

Engine modules are imported inside the commands, so ``--help`` and listings
answer fast and work whatever else is installed.
"""
from __future__ import annotations

import argparse
import configparser
import fnmatch
import functools
import gc
import json
import math
import os
import re
import signal
import sys
import time
import uuid

from engine import table  # pure Python, no engine dependencies
from engine.core.credentials import Credentials  # cheap
from engine.core.validate import endpoint_scheme, parse_duration, parse_endpoints, parse_size
from engine.errors import (Failed, PeerctlError, PermissionDenied, PlacementError, StoreRefused,
                           StoreUnavailable, Unavailable, UsageError)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_DETACHED = 0, 1, 2, 3, 130

DEFAULTS = {"etcd": "http://127.0.0.1:2379", "cluster": "default", "format": "table",
            "ttl": "5", "workers": "8", "retention": "7d", "state_dir": "state",
            "libvirt": "test:///default", "hosts": "3", "network": "default",
            "networks": "default", "etcd_history": "1h", "etcd_quota": "2G",
            "ha_margin": "3s"}

TLS_FLAGS = {"cacert": "CA certificate that signed etcd's (https:// endpoints)",
             "cert": "client certificate: who this is to etcd, and its role",
             "key": "the client certificate's private key"}

VM_ACTIONS = ("destroy", "start", "stop", "reboot", "suspend", "resume")
# Actions that take a service down: on more than one VM they need --yes.
DESTRUCTIVE = ("destroy", "stop", "reboot", "suspend")


# -- errors the user can act on -------------------------------------------------

# UsageError (exit 2), Failed (1), Unavailable (3), PermissionDenied (4): one
# root, engine.errors, cheap to import; every concept one class.

# -- settings: flag > environment > running `up` > config file > default -------

def _conf_path() -> str:
    return os.environ.get("PEERCTL_CONF") or os.path.join(ROOT, "conf", "peerctl.conf")


def read_conf(path: str) -> dict:
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error as exc:
        raise UsageError(f"bad config file {path}: {exc}".splitlines()[0]) from None
    if not parser.has_section("peerctl"):
        return {}
    return {k.replace("-", "_"): v.strip() for k, v in parser.items("peerctl")}


_CLUSTER = re.compile(r"[A-Za-z0-9._-]+")
WHOLE_NUMBERS = {"ttl": "seconds", "workers": "requests", "hosts": "peers"}


def settings_for(args) -> dict:
    settings = dict(DEFAULTS)
    path = getattr(args, "conf", None)
    if path is not None:        # named on the command line: it must be there
        try:
            with open(path):
                pass
        except OSError as exc:
            raise UsageError(f"cannot read config file {path!r} from --conf: "
                             f"{exc.strerror}") from None
    else:
        path = _conf_path()
    settings.update(read_conf(path))
    for key, unit in WHOLE_NUMBERS.items():
        if not re.fullmatch(r"[0-9]+", settings[key]) or int(settings[key]) < 1:
            raise UsageError(f"bad {key} {settings[key]!r} in {path} "
                             f"(want a whole number of {unit}, at least 1)")
    parse_duration(settings["retention"], "retention", f"in {path}")
    for key in ("etcd_history", "etcd_quota", "ha_margin"):
        where = f"in {path}"
        if os.environ.get("PEERCTL_" + key.upper()):
            settings[key], where = os.environ["PEERCTL_" + key.upper()], f"from $PEERCTL_{key.upper()}"
        (parse_size if key == "etcd_quota" else parse_duration)(settings[key], key, where)
    for name in TLS_FLAGS:      # a config file's relative paths are relative to it
        if settings.get(name) and not os.path.isabs(settings[name]):
            settings[name] = os.path.join(os.path.dirname(os.path.abspath(path)), settings[name])
    source = {"etcd": f"in {path}", "cluster": f"in {path}",
              **{name: f"in {path}" for name in TLS_FLAGS}}
    from engine import supervisor       # cheap: etcd's client is not loaded
    up = supervisor.running_up(os.path.abspath(settings["state_dir"]))
    if up:     # the embedded default: a running `peerctl.py up` in ./state
        settings["etcd"], settings["cluster"] = supervisor.etcd_urls(up), up.get("cluster",
                                                                                  "default")
        where = f"in {supervisor.up_file(settings['state_dir'])}"
        source.update(etcd=where, cluster=where)
        for name, value in supervisor.client_tls(up).items():     # the operator's identity
            settings[name], source[name] = value, where
    for key in ("network", "networks"):         # set, even empty: "" offers none
        if os.environ.get("PEERCTL_" + key.upper()) is not None:
            settings[key] = os.environ["PEERCTL_" + key.upper()]
    for key in ("etcd", "cluster", "format", *TLS_FLAGS):
        if os.environ.get("PEERCTL_" + key.upper()):     # set but empty: unset
            settings[key] = os.environ["PEERCTL_" + key.upper()]
            source[key] = f"from $PEERCTL_{key.upper()}"
        if getattr(args, key, None) is not None:        # given, even if empty
            settings[key] = getattr(args, key)
            source[key] = f"from --{key}"
    if settings["format"] not in ("table", "json"):
        raise UsageError(f"bad format {settings['format']!r} (want table or json)")
    if not _CLUSTER.fullmatch(settings["cluster"]):
        raise UsageError(f"bad cluster name {settings['cluster']!r} {source['cluster']} "
                         "(want letters, digits, '-', '_' or '.')")
    parse_endpoints(settings["etcd"], source["etcd"])      # exit 2 before anything connects
    credentials = Credentials.from_settings(settings, source)
    if credentials and endpoint_scheme(settings["etcd"]) == "https":
        credentials.read()          # exit 2 naming a missing or unreadable file
    settings["credentials"] = credentials
    return settings


class Context:
    """What every command gets: settings, the store (opened on first use), output."""

    def __init__(self, args, settings: dict):
        self.args = args
        self.settings = settings
        self.json = settings["format"] == "json"
        self._store = None
        self.space = None       # etcd's database size and alarms, once the store is open

    def store(self):
        if self._store is None:
            from engine.core.store import Store
            self._store = Store(self.settings["etcd"], self.settings["cluster"], timeout=5.0,
                                credentials=self.settings["credentials"])
            if self.args.command != "peer":
                self._check_space()
        return self._store

    def _check_space(self) -> None:
        """etcd's space, for hostlist's totals; a warning on stderr when it is
        out of space or nearing its quota.  Not reaching it is left to the
        command's own first call to report."""
        from engine.core.maintenance import space, space_warning
        try:
            self.space = space(self._store, parse_size(self.settings["etcd_quota"]))
        except (Unavailable, PermissionDenied):
            return
        warning = space_warning(self.space)
        if warning:
            say(f"peerctl: warning: {warning}")

    def emit(self, doc, text: str | None = None) -> None:
        """The command's answer: ``doc`` as JSON, else ``text`` (or nothing)."""
        if self.json:
            sys.stdout.write(table.to_json(doc) + "\n")
        elif text:
            sys.stdout.write(text.rstrip("\n") + "\n")
        sys.stdout.flush()


def say(message: str) -> None:
    """A message for the user, on stderr."""
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()


def warn_unreadable(key: str, why: str, skipped: bool = True) -> None:
    """One line per key a command had to skip, or read only in part (each
    once; see engine/core/values.py)."""
    say(f"peerctl: warning: {'skipped unreadable key' if skipped else 'partly unreadable key'} "
        f"{key}: {why}")


def me() -> str:
    """How the user called us, for the commands we suggest."""
    base = os.path.basename(sys.argv[0] or "peerctl")
    return "python peerctl.py" if base.endswith(".py") else "peerctl"


def _engine_api():
    configure_logging("DEBUG" if _DEBUG else "WARNING")
    try:
        from engine.core import api
    except ImportError as exc:
        raise Failed(f"the automation engine is not available ({exc})") from None
    return api


# -- patterns and specs ------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_RC = re.compile(r"^[A-Z][A-Z0-9_]*$")


def check_glob(text: str, what: str) -> str:
    if not text:
        raise UsageError(f"empty {what}")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise UsageError(f"bad {what} {text!r}: whitespace or control character")
    depth = 0
    for c in text:
        if c == "[":
            depth += 1
        elif c == "]" and depth:
            depth -= 1
    if depth:
        raise UsageError(f"bad {what} {text!r}: unclosed '['")
    return text


def host_pattern(text: str | None) -> str:
    if text is None:
        return "*"
    if "/" in text:
        raise UsageError(f"bad host pattern {text!r}: a host pattern has no '/'")
    return check_glob(text, "host pattern")


def vm_pattern(text: str) -> tuple[str, str]:
    """``HOSTGLOB/VMGLOB`` or ``VMGLOB`` -> (hostglob, vmglob)."""
    if text.count("/") > 1:
        raise UsageError(f"bad VM pattern {text!r}: more than one '/' (want HOSTGLOB/VMGLOB)")
    if "/" in text:
        host, vm = text.split("/")
        if not host or not vm:
            raise UsageError(f"bad VM pattern {text!r}: empty {'host' if not host else 'VM'} part")
        return check_glob(host, "VM pattern"), check_glob(vm, "VM pattern")
    return "*", check_glob(text, "VM pattern")


def match_vms(vms: list[dict], patterns: list[str]) -> tuple[list[dict], list[str]]:
    """VMs matching any pattern (in listing order) and the patterns matching none."""
    parsed = [(p, vm_pattern(p)) for p in patterns]
    hits, unmatched = {}, []
    for text, (hglob, vglob) in parsed:
        found = False
        for vm in vms:
            if fnmatch.fnmatchcase(vm.get("host") or "", hglob) and \
                    fnmatch.fnmatchcase(vm.get("name") or "", vglob):
                hits[(vm.get("host"), vm.get("uuid"), vm.get("name"))] = vm
                found = True
        if not found:
            unmatched.append(text)
    return list(hits.values()), unmatched


def parse_resources(spec: str, required: str | None = None) -> tuple[dict, list]:
    """``VCPU:1,MEMORY_MB:256`` or ``resources=...&required=...`` plus ``--required``
    -> (resources, traits) with forbidden traits as ``!TRAIT``.

    Placement's own parser reads it, so that the command line and the
    placement service agree on one grammar; boot takes one request group."""
    parse_traits(required)      # a bad --required is blamed on the traits, not the spec
    from engine.placement.query import parse_query     # no store, no grpc
    try:
        query = parse_query(spec)
    except PlacementError as exc:
        raise UsageError(f"bad resource spec {spec!r}: {exc}") from None
    if required:
        try:
            query = parse_query(spec, required=required)
        except PlacementError as exc:
            raise UsageError(f"bad --required {required!r}: {exc}") from None
    group = query.groups[0]
    traits = [next(iter(any_of)) for any_of in group.required if len(any_of) == 1]
    if len(query.groups) > 1 or len(traits) != len(group.required) or group.member_of \
            or group.in_tree or query.root_required or query.root_forbidden:
        raise UsageError(f"bad resource spec {spec!r}: boot takes one request group of "
                         "resources and required traits")
    return dict(group.resources), traits + ["!" + t for t in sorted(group.forbidden)]


def parse_traits(text: str | None) -> list[str]:
    traits = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        if not _RC.match(part.lstrip("!")) or part.count("!") > 1:
            raise UsageError(f"bad trait {part!r} (want TRAIT or !TRAIT, e.g. HW_CPU_X86_AVX2)")
        traits.append(part)
    return traits


# -- listings ----------------------------------------------------------------

C = table.Column
HOST_COLUMNS = [
    C("host", "Host"), C("status", "Status"), C("alive", "Alive"), C("enabled", "Enabled"),
    C("drained", "Drained"), C("reserved_by", "Lease", lambda v: v or "-"),
    C("hypervisor", "Hypervisor"), C("vcpus", "CPUs", right=True),
    C("memory_mb", "Memory", table.human_mb, True),
    C("free_memory_mb", "MemFree", table.human_mb, True),
    C("vms", "VMs", right=True), C("disk_gb", "Disk", table.human_gb, True),
    C("free_disk_gb", "DiskFree", table.human_gb, True),
    C("kernel", "Kernel"), C("cpu_model", "CPU model"),
    C("cpu_usage", "CPU%", table.percent, True),
    C("used_memory_mb", "MemUsed", table.human_mb, True),
    C("memory_usage", "Mem%", table.percent, True),
    C("used_disk_gb", "DiskUsed", table.human_gb, True),
    C("disk_usage", "Disk%", table.percent, True),
    C("net_rx_bytes", "NetRx", table.human_bytes, True),
    C("net_tx_bytes", "NetTx", table.human_bytes, True),
    C("libvirt_uri", "Libvirt"), C("provider_uuid", "Provider"),
    C("networks", "Networks", lambda names: ",".join(names) or "-"),
]
HOSTLIST_DEFAULT = ["host", "status", "hypervisor", "vcpus", "memory_mb", "free_memory_mb",
                    "vms", "free_disk_gb", "kernel", "cpu_model"]
HOSTLIST_JSON = ["host", "alive", "enabled", "drained", "reserved_by", "vcpus", "memory_mb",
                 "free_memory_mb",
                 "disk_gb", "free_disk_gb", "vms", "hypervisor", "kernel", "cpu_model",
                 "networks"]
HOSTSTATS_DEFAULT = ["host", "status", "vcpus", "cpu_usage", "memory_mb", "used_memory_mb",
                     "memory_usage", "vms", "disk_gb", "used_disk_gb", "disk_usage",
                     "net_rx_bytes", "net_tx_bytes"]
HOSTSTATS_JSON = ["host", "alive", "enabled", "vcpus", "cpu_usage", "memory_mb",
                  "free_memory_mb", "vms", "disk_gb", "free_disk_gb",
                  "net_rx_bytes", "net_tx_bytes"]
VM_COLUMNS = [C("host", "Host"), C("name", "Name"), C("uuid", "UUID"),
              C("vcpus", "VCPUs", right=True),
              C("memory_mb", "Memory", table.human_mb, True), C("state", "State"),
              C("disk_gb", "Disk", table.human_gb, True), C("ip", "IP"),
              C("addresses", "Addresses", lambda a: " ".join(
                  x["addr"] if x["prefix"] is None else f"{x['addr']}/{x['prefix']}"
                  for x in a or []) or "-"),
              C("ha", "HA"),
              C("recovered", "Recovered", lambda r: f"from {r['from']}" if r else "-"),
              C("crashed", "Crashed", lambda c: "yes" if c else "-"),
              C("restarts", "Restarts", right=True)]
VMLIST_DEFAULT = ["host", "name", "vcpus", "memory_mb", "state", "ip"]
VMLIST_JSON = ["host", "name", "uuid", "state", "vcpus", "memory_mb", "disk_gb", "ip",
               "addresses", "ha", "recovered", "crashed", "restarts"]
ASIDE_COLUMNS = [C("host", "Host"), C("name", "Name"), C("uuid", "UUID"),
                 C("time", "Since", lambda t: _when(t)), C("bytes", "Size", table.human_bytes,
                                                          True),
                 C("volumes", "Volumes", lambda v: ",".join(v)), C("reason", "Reason"),
                 C("id", "Id")]
ASIDE_DEFAULT = ["host", "name", "time", "bytes", "reason"]
ASIDE_JSON = ["host", "name", "uuid", "id", "time", "bytes", "volumes", "reason",
              "automation"]
BUSY_CPU = 90     # a host at or above this CPU usage counts as busy in the totals


def _ratio(used, total):
    return round(100.0 * used / total, 1) if total else None


def _networks_of(record: dict) -> list[str]:
    """A host record's ``networks``, the names only (garbage in etcd: none)."""
    networks = record.get("networks")
    return [n for n in networks if isinstance(n, str)] if isinstance(networks, list) else []


def _host_derived(record: dict) -> dict:
    def used(total, free):
        return None if total is None or free is None else max(total - free, 0)
    record["networks"] = _networks_of(record)
    record["used_memory_mb"] = used(record.get("memory_mb"), record.get("free_memory_mb"))
    record["used_disk_gb"] = used(record.get("disk_gb"), record.get("free_disk_gb"))
    record["memory_usage"] = _ratio(record["used_memory_mb"] or 0, record.get("memory_mb"))
    record["disk_usage"] = _ratio(record["used_disk_gb"] or 0, record.get("disk_gb"))
    return record


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


def vm_totals(vms: list[dict]) -> str:
    """The line under vmlist's table, in one pass over the rows."""
    states: dict[str, int] = {}
    hosts = set()
    vcpus = memory_mb = disk_gb = 0
    for vm in vms:
        get = vm.get
        state = get("state") or "unknown"
        if get("crashed"):
            state += " crashed"
        states[state] = states.get(state, 0) + 1
        hosts.add(get("host"))
        vcpus += get("vcpus") or 0
        memory_mb += get("memory_mb") or 0
        disk_gb += get("disk_gb") or 0
    by_state = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    return (f"{len(vms)} VM{'s' if len(vms) != 1 else ''} ({by_state or 'none'}) on "
            f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} using {vcpus} vCPUs, "
            f"{table.human_mb(memory_mb)} memory and {table.human_gb(disk_gb)} disk")


def check_fields(args, columns, default) -> list:
    """The ``-o`` columns, with ``-o`` and ``--sort`` checked against the
    listing's fields: a usage error (exit 2) before etcd is read."""
    try:
        chosen = table.select(columns, args.output, default)
        table.sort_rows([], args.sort, [c.field for c in columns])
    except table.FieldError as exc:
        raise UsageError(str(exc)) from None
    return chosen


def show_listing(ctx: Context, rows: list[dict], columns, default, json_fields,
                 default_sort: str, totals=None) -> None:
    args = ctx.args
    chosen = check_fields(args, columns, default)
    try:
        rows = table.sort_rows(rows, args.sort or default_sort, [c.field for c in columns])
    except table.FieldError as exc:
        raise UsageError(str(exc)) from None
    if ctx.json:
        fields = [c.field for c in chosen] if args.output else json_fields
        ctx.emit([{f: row.get(f) for f in fields} for row in rows])
        return
    text = table.render(rows, chosen, headers=not args.no_headers, separator=args.separator)
    if totals and not args.no_headers and args.separator is None:
        text = (text + "\n" if text else "") + totals(rows)
    ctx.emit(None, text)


def cmd_vmlist(ctx: Context) -> int:
    for text in ctx.args.patterns:
        vm_pattern(text)        # a bad pattern is a usage error before any read
    check_fields(ctx.args, VM_COLUMNS, VMLIST_DEFAULT)      # so is a bad -o / --sort
    from engine.cluster import read_vms
    vms = read_vms(ctx.store())
    if ctx.args.patterns:
        vms, unmatched = match_vms(vms, ctx.args.patterns)
        if unmatched:
            ctx.emit([])
            raise Failed("no VM matches " + ", ".join(repr(p) for p in unmatched))
    show_listing(ctx, vms, VM_COLUMNS, VMLIST_DEFAULT, VMLIST_JSON, "host,name", vm_totals)
    return EXIT_OK


def _hosts_matching(ctx: Context, default: list[str]) -> list[dict]:
    glob = host_pattern(ctx.args.hostglob)
    check_fields(ctx.args, HOST_COLUMNS, default)       # a bad -o / --sort: before etcd
    from engine.cluster import read_hosts
    hosts = [_host_derived(h) for h in read_hosts(ctx.store())
             if fnmatch.fnmatchcase(h["host"], glob)]
    if not hosts and ctx.args.hostglob is not None:
        ctx.emit([])
        raise Failed(f"no host matches {ctx.args.hostglob!r}")
    return hosts


def cmd_hostlist(ctx: Context) -> int:
    hosts = _hosts_matching(ctx, HOSTLIST_DEFAULT)

    def totals(rows):
        return host_totals(rows) + ("\n" + store_totals(ctx.space) if ctx.space else "")
    show_listing(ctx, hosts, HOST_COLUMNS, HOSTLIST_DEFAULT, HOSTLIST_JSON, "host", totals)
    return EXIT_OK


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


def cmd_hoststats(ctx: Context) -> int:
    hosts = _hosts_matching(ctx, HOSTSTATS_DEFAULT)
    show_listing(ctx, hosts, HOST_COLUMNS, HOSTSTATS_DEFAULT, HOSTSTATS_JSON, "host",
                 host_totals)
    return EXIT_OK


# -- following an automation ----------------------------------------------------

def follow(ctx: Context, automation: str, timeout: float | None = None,
           quiet: bool = False) -> dict:
    """Follow ``automation`` to a terminal state; Ctrl-C detaches (exit 130)."""
    try:
        api = _engine_api()
        store = ctx.store()
        from engine.progress import ProgressView
        view = None if quiet else ProgressView(sys.stderr, automation, sys.stderr.isatty())
        last = None
        for task in api.follow(store, automation, timeout=timeout):
            last = task
            if view:
                view.update(task)
        if last is None:
            last = api.get_task(store, automation)
            if view:
                view.update(last)
    except KeyboardInterrupt:
        detach(ctx, automation)
    except StoreUnavailable as exc:
        raise Unavailable(f"etcd unreachable at {ctx.settings['etcd']} while following "
                          f"automation {automation}, which goes on; re-attach with: "
                          f"{me()} wait {automation}") from exc
    return last


def detach(ctx: Context, automation: str):
    """Leave ``automation`` running: say how to re-attach and exit 130.  With
    ``--format json`` stdout still gets ``{"automation": ID}`` for scripts."""
    if ctx.json:
        ctx.emit({"automation": automation})
    say(f"\nDetached from automation {automation}; it goes on without us.\n"
        f"Re-attach with: {me()} wait {automation}")
    raise Detached()


class Detached(Exception):
    """Ctrl-C while following: the automation goes on; exit 130."""


# -- automations -----------------------------------------------------------------

def start(ctx: Context, kind: str, args: dict) -> str:
    api = _engine_api()
    # the command's JSON shape, empty: {automation, state, vms} or {..., replies}
    failed = {"automation": None, "state": "failed", "replies" if kind == "ping" else "vms": []}
    try:
        return api.start_automation(ctx.store(), kind, args)
    except api.NoPeers as exc:
        raise Failed(str(exc), result=failed) from None
    except LookupError as exc:      # the engine does not know this kind of automation
        raise Failed(exc.args[0] if exc.args else str(exc), result=failed) from None


VM_RESULT_FIELDS = ["name", "uuid", "host", "state", "error"]
VM_RESULT_COLUMNS = [C("name", "Name"), C("host", "Host"), C("state", "State"),
                     C("uuid", "UUID")]


def vm_outcome(ctx: Context, automation: str, task: dict, fields=VM_RESULT_FIELDS,
               columns=VM_RESULT_COLUMNS, verb: str | None = None) -> int:
    """A VM automation's result, ``{automation, state, vms: [{FIELDS}]}``, as
    JSON or a table (with an Error column when any VM has one, and ``N of M
    VMs VERB`` when a verb is given); exit 1 unless done with no VM in error."""
    vms = [{f: vm.get(f) for f in fields} for vm in (task.get("result") or {}).get("vms") or []]
    doc = {"automation": automation, "state": task.get("state"), "vms": vms}
    if task.get("error"):
        doc["error"] = task["error"]
    columns = list(columns)
    if any(vm.get("error") for vm in vms):
        columns.append(C("error", "Error"))
    failed = [vm for vm in vms if vm.get("error") or vm.get("state") == "error"]
    text = table.render(vms, columns)
    text = (text + "\n" if text else "") + f"automation {automation} {task.get('state')}"
    if verb:
        text += f": {len(vms) - len(failed)} of {len(vms)} VMs {verb}"
    ctx.emit(doc, text)
    if task.get("state") != "done" or failed:
        why = task.get("error") or ", ".join(f"{vm['name']}: {vm.get('error') or 'error'}"
                                             for vm in failed)
        raise Failed(f"{task.get('kind') or 'automation'} {automation} "
                     f"{task.get('state')}" + (f": {why}" if why else ""))
    return EXIT_OK


def run_automation(ctx: Context, kind: str, args: dict, outcome) -> int:
    # Ctrl-C while the automation is being created waits until its id is
    # known, so that the user always learns what to re-attach to.
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        automation = start(ctx, kind, args)
    except BaseException:
        signal.signal(signal.SIGINT, previous)
        raise
    try:
        signal.signal(signal.SIGINT, previous)
        if interrupted:
            raise KeyboardInterrupt
        if ctx.args.detach:
            ctx.emit({"automation": automation}, automation)
            return EXIT_OK
        if not ctx.json and not sys.stderr.isatty():
            say(f"automation {automation} started ({kind}); Ctrl-C detaches")
        task = follow(ctx, automation)
    except KeyboardInterrupt:
        detach(ctx, automation)
    return outcome(ctx, automation, task)


def cmd_boot(ctx: Context) -> int:
    args = ctx.args
    for name in args.names:
        if not _NAME.match(name):
            raise UsageError(f"bad VM name {name!r} (letters, digits, '.', '_', '-'; "
                             "no wildcards)")
    twice = sorted({name for name in args.names if args.names.count(name) > 1})
    if twice:
        raise UsageError("VM name given more than once: " + ", ".join(twice))
    resources, required = parse_resources(args.resources, args.required)
    on = host_pattern(args.on) if args.on is not None else None
    from engine.cluster import read_vms
    taken = {vm["name"]: vm["host"] for vm in read_vms(ctx.store())}
    clash = [f"{name} (on {taken[name]})" for name in args.names if name in taken]
    if clash:
        raise Failed("VM name already in use: " + ", ".join(clash),
                     result={"automation": None, "state": "failed", "vms": []})
    networks, seed = _boot_networks(ctx, args), _boot_seed(args)
    required = required + [t for t in _network_traits(networks) if t not in required]
    if args.reservation is not None:
        from engine.leases import commands as leases
        from engine.leases.model import check_name
        check_name(args.reservation)
        required += [t for t in leases.boot_into(ctx.store(), args.reservation, resources)
                     if t not in required]
    vms = [{"name": name, "resources": resources, "required": required,
            "image": args.image, "on": on, **({"ha": args.ha} if args.ha != "none" else {}),
            **({"reservation": args.reservation} if args.reservation else {}),
            **({"networks": networks} if networks else {}),
            **({"seed": {**seed, "hostname": seed["hostname"] or _hostname_of(name)}}
               if seed else {})} for name in args.names]
    outcome = vm_outcome
    if args.wait_ip:
        outcome = functools.partial(boot_outcome, timeout=args.ip_timeout)
    return run_automation(ctx, "boot", {"vms": vms}, outcome)


def _boot_networks(ctx: Context, args) -> list[str]:
    """``--network`` (else the ``network`` setting) as names some live host
    offers; ``none``: no interface."""
    from engine.hypervisor.networks import parse_names
    given = args.network if args.network else [ctx.settings["network"]]
    where = "in --network" if args.network else "in the network setting"
    networks = parse_names(given, where)
    if not networks:
        return []
    from engine.cluster import read_hosts
    hosts = read_hosts(ctx.store())
    offered = {name for host in hosts for name in _networks_of(host)}
    unknown = [name for name in dict.fromkeys(networks) if name not in offered]
    if unknown and hosts:   # no host known at all: the boot says so itself
        hint = (f"hosts offer: {', '.join(sorted(offered))}" if offered
                else "no host offers any network")
        none = "" if args.network else "; boot --network none for a VM without one"
        raise UsageError(f"unknown network {', '.join(unknown)} ({hint}{none})")
    return networks


def _network_traits(networks: list[str]) -> list[str]:
    from engine.hypervisor.networks import network_trait
    return list(dict.fromkeys(network_trait(name) for name in networks))


def _boot_seed(args) -> dict | None:
    """``--user-data``, ``--ssh-key``, ``--hostname`` read and checked: the
    cloud-init seed's inputs, or None when none is given."""
    if not (args.user_data or args.ssh_key or args.hostname):
        return None
    from engine.hypervisor import seed
    keys = [key for path in args.ssh_key or [] for key in seed.read_ssh_keys(path)]
    if len(keys) > seed.MAX_SSH_KEYS:
        raise UsageError(f"{len(keys)} SSH keys; at most {seed.MAX_SSH_KEYS}")
    return {"hostname": seed.check_hostname(args.hostname) if args.hostname else None,
            "user_data": seed.read_user_data(args.user_data) if args.user_data else None,
            "ssh_keys": keys}


def _hostname_of(name: str) -> str:
    """A VM name made a hostname: lower case, other characters as '-'."""
    label = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:63].strip("-")
    return label or "vm"


def boot_outcome(ctx: Context, automation: str, task: dict, timeout: float) -> int:
    """``boot --wait-ip``: once built, wait until every built VM's record has
    an address (its guest got one), then report with an IP column."""
    vms = (task.get("result") or {}).get("vms") or []
    waiting = [vm for vm in vms if vm.get("host") and not vm.get("error")]
    missing = []
    if task.get("state") == "done" and waiting:
        say(f"waiting up to {timeout:g} s for the address of {len(waiting)} "
            f"VM{'s' if len(waiting) != 1 else ''}")
        from engine.cluster import read_vms
        deadline = time.monotonic() + timeout
        while True:
            ips = {vm["uuid"]: vm["ip"] for vm in read_vms(ctx.store()) if vm.get("ip")}
            for vm in waiting:
                vm["ip"] = ips.get(vm["uuid"])
            missing = [vm["name"] for vm in waiting if not vm["ip"]]
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    status = vm_outcome(ctx, automation, task, VM_RESULT_FIELDS + ["ip"],
                        VM_RESULT_COLUMNS + [C("ip", "IP")])
    if missing:
        raise Failed(f"no address within {timeout:g} s for: {', '.join(missing)} "
                     "(the VMs run; vmlist shows their address once they have one)")
    return status


def confirm(ctx: Context, kind: str, vms: list[dict]) -> None:
    listing = "\n".join(f"  {vm['host']}/{vm['name']} ({vm.get('state')})" for vm in vms)
    if not sys.stdin.isatty():
        say(f"{kind} would act on {len(vms)} VMs:\n{listing}")
        raise UsageError(f"{kind} matches {len(vms)} VMs: add --yes to confirm "
                         "(no terminal to ask on)")
    say(f"{kind} will act on {len(vms)} VMs:\n{listing}")
    ask(f"{kind.capitalize()} these {len(vms)} VMs?",
        cancelled={"automation": None, "state": "cancelled", "vms": []})


def ask(question: str, cancelled) -> None:
    """A yes/no question on the terminal; anything but yes: exit 1, nothing
    done, with ``cancelled`` as the JSON document."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise Failed("nothing done", result=cancelled)


def cmd_vm_action(ctx: Context) -> int:
    args, kind = ctx.args, ctx.args.command
    for text in args.patterns:
        vm_pattern(text)        # a bad pattern is a usage error before anything else
    from engine.cluster import read_vms
    vms, unmatched = match_vms(read_vms(ctx.store()), args.patterns)
    if unmatched:
        raise Failed("no VM matches " + ", ".join(repr(p) for p in unmatched),
                     result={"automation": None, "state": "failed", "vms": []})
    vms.sort(key=lambda vm: (table.natural_key(vm["host"]), table.natural_key(vm["name"])))
    targets = [{"host": vm["host"], "name": vm["name"], "uuid": vm["uuid"]} for vm in vms]
    if args.dry_run:
        rows = [dict(t, state=vm.get("state")) for t, vm in zip(targets, vms)]
        ctx.emit({"automation": None, "state": "dry-run", "vms": rows},
                 table.render(rows, [C("host", "Host"), C("name", "Name"),
                                     C("state", "State"), C("uuid", "UUID")])
                 + f"\n{kind} would act on {len(rows)} VM{'s' if len(rows) != 1 else ''}")
        return EXIT_OK
    if kind in DESTRUCTIVE and len(vms) > 1 and not args.yes:
        confirm(ctx, kind, vms)
    return run_automation(ctx, kind, {"vms": targets}, vm_outcome)


def cmd_ha(ctx: Context) -> int:
    args = ctx.args
    for text in args.patterns:
        vm_pattern(text)
    from engine.cluster import read_vms
    vms, unmatched = match_vms(read_vms(ctx.store()), args.patterns)
    if unmatched:
        raise Failed("no VM matches " + ", ".join(repr(p) for p in unmatched),
                     result={"automation": None, "state": "failed", "vms": []})
    down = [vm for vm in vms if vm["state"] == "unknown"]
    if down:
        raise Failed(f"VM {down[0]['name']!r} is on {down[0]['host']}, which is down: its HA "
                     "policy can change once its host is back"
                     + (f" (and {len(down) - 1} more)" if len(down) > 1 else ""),
                     result={"automation": None, "state": "failed", "vms": []})
    vms.sort(key=lambda vm: (table.natural_key(vm["host"]), table.natural_key(vm["name"])))
    targets = [{"host": vm["host"], "name": vm["name"], "uuid": vm["uuid"]} for vm in vms]
    outcome = functools.partial(vm_outcome, fields=["name", "uuid", "host", "ha", "error"],
                                columns=[C("name", "Name"), C("host", "Host"), C("ha", "HA"),
                                         C("uuid", "UUID")], verb="changed")
    return run_automation(ctx, "ha", {"vms": targets, "policy": args.policy}, outcome)


def _asides(ctx: Context) -> list[dict]:
    from engine.core import keys as etcd_keys
    from engine.core.values import readable
    import engine.hypervisor.shapes  # noqa: F401  (declares aside/)
    rows = []
    for kv in ctx.store().range(etcd_keys.aside())[0]:
        record = readable(kv)
        if record is None:
            continue
        volumes = [v for v in record["volumes"] if isinstance(v, dict)]
        rows.append({"host": record["host"], "name": record["name"], "uuid": record["uuid"],
                     "id": record.get("id") or kv.key.rsplit("/", 1)[-1],
                     "time": record.get("time"), "reason": record.get("reason"),
                     "automation": record.get("automation"),
                     "volumes": [str(v.get("name")) for v in volumes],
                     "bytes": sum(v.get("bytes") or 0 for v in volumes
                                  if isinstance(v.get("bytes"), int))})
    return rows


def cmd_aside(ctx: Context) -> int:
    args = ctx.args
    if args.what == "list":
        glob = host_pattern(args.hostglob)
        check_fields(args, ASIDE_COLUMNS, ASIDE_DEFAULT)
        rows = [r for r in _asides(ctx) if fnmatch.fnmatchcase(r["host"], glob)]
        show_listing(ctx, rows, ASIDE_COLUMNS, ASIDE_DEFAULT, ASIDE_JSON, "host,name")
        return EXIT_OK
    for text in args.patterns:
        vm_pattern(text)
    empty = {"automation": None, "state": "failed", "disks": []}
    rows = _asides(ctx)
    chosen, unmatched = [], []
    for text in args.patterns:
        hosts, names = vm_pattern(text)
        found = [r for r in rows if fnmatch.fnmatchcase(r["host"], hosts)
                 and (fnmatch.fnmatchcase(r["name"], names) or r["uuid"] == names)]
        if not found:
            unmatched.append(text)
        chosen += [r for r in found if r not in chosen]
    if unmatched:
        raise Failed("no disks kept aside match " + ", ".join(repr(p) for p in unmatched),
                     result=empty)
    from engine.cluster import read_hosts
    alive = {h["host"] for h in read_hosts(ctx.store()) if h["alive"]}
    down = sorted({r["host"] for r in chosen} - alive)
    if down:
        raise Failed(f"host {down[0]} is down: its disks kept aside can be deleted once it is "
                     "back", result=empty)
    if len(chosen) > 1 and not args.yes:
        listing = "\n".join(f"  {r['host']}/{r['name']} ({', '.join(r['volumes'])})"
                            for r in chosen)
        if not sys.stdin.isatty():
            say(f"aside delete would delete {len(chosen)} disk sets:\n{listing}")
            raise UsageError(f"aside delete matches {len(chosen)}: add --yes to confirm "
                             "(no terminal to ask on)")
        say(f"aside delete will delete {len(chosen)} disk sets:\n{listing}")
        ask(f"Delete these {len(chosen)}?", cancelled={**empty, "state": "cancelled"})
    disks = [{k: r[k] for k in ("host", "name", "uuid", "id")} for r in chosen]

    def outcome(ctx, automation, task):
        done = (task.get("result") or {}).get("disks") or []
        doc = {"automation": automation, "state": task.get("state"), "disks": done}
        text = table.render(done, [C("host", "Host"), C("name", "Name"), C("state", "State"),
                                   C("error", "Error", lambda e: e or "-")])
        ctx.emit(doc, (text + "\n" if text else "") + f"automation {automation} "
                 f"{task.get('state')}")
        if task.get("state") != "done":
            raise Failed(f"aside_delete {automation} {task.get('state')}: "
                         f"{task.get('error') or ''}".rstrip(": "))
        return EXIT_OK
    return run_automation(ctx, "aside_delete", {"disks": disks}, outcome)


def cmd_console(ctx: Context) -> int:
    args = ctx.args
    vm_pattern(args.name)
    from engine.cluster import read_hosts, read_vms
    store = ctx.store()
    vms, unmatched = match_vms(read_vms(store), [args.name])
    if unmatched:
        raise Failed(f"no VM matches {args.name!r}")
    vms.sort(key=lambda vm: (table.natural_key(vm["host"]), table.natural_key(vm["name"])))
    if len(vms) > 1:
        raise UsageError(f"{args.name!r} matches {len(vms)} VMs ("
                         + ", ".join(f"{vm['host']}/{vm['name']}" for vm in vms[:5])
                         + (", ..." if len(vms) > 5 else "") + "): console needs one")
    vm = vms[0]
    record = {h["host"]: h for h in read_hosts(store)}.get(vm["host"]) or {}
    if not record.get("libvirt_uri"):
        raise Failed(f"no host record for {vm['host']}, the host of VM {vm['name']}: "
                     "its libvirt URI is unknown")
    from engine.hypervisor import console
    tty = not args.no_tty and os.isatty(0)
    attached = console.attach(record["libvirt_uri"], vm["uuid"], vm["name"], vm["host"])
    say(f"Connected to VM {vm['name']} on {vm['host']} ({attached.uri}). "
        + ("Escape character is ^]" if tty else
           "Plain byte stream: it ends with the console, a signal"
           + (f" or --timeout {args.timeout:g}" if args.timeout is not None else "")))
    ended = attached.run(tty=tty, timeout=args.timeout)
    say({"escape": "\nLeft the console", "closed": "Console closed: the VM stopped",
         "timeout": "Left the console: --timeout reached",
         "stdin": "Left the console: the terminal closed"}.get(
        ended.reason, f"Left the console on signal {ended.signum}")
        + f" (VM {vm['name']} on {vm['host']})")
    return ended.exit_code


def ping_outcome(ctx: Context, automation: str, task: dict) -> int:
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
    return EXIT_OK


def cmd_ping(ctx: Context) -> int:
    glob = host_pattern(ctx.args.hostglob)
    from engine.cluster import read_hosts
    hosts = [h["host"] for h in read_hosts(ctx.store())
             if h["alive"] and fnmatch.fnmatchcase(h["host"], glob)]
    if not hosts:
        raise Failed(f"no live host matches {glob!r}",
                     result={"automation": None, "state": "failed", "replies": []})
    return run_automation(ctx, "ping", {"hosts": hosts, "rounds": ctx.args.rounds},
                          ping_outcome)


# -- moving VMs: migrate, drain, undrain, evacuate ---------------------------------

MOVE_COLUMNS = [C("name", "Name"), C("from", "From"), C("host", "Host"), C("mode", "Mode"),
                C("state", "State"), C("downtime_ms", "Downtime (ms)", right=True)]
MOVE_FIELDS = ["name", "uuid", "from", "host", "state", "mode", "downtime_ms", "bytes", "error"]


def move_outcome(ctx: Context, automation: str, task: dict) -> int:
    """A move's result: ``{automation, state, vms: [{name, uuid, from, host,
    state, mode, downtime_ms, bytes, error}]}``; exit 1 unless every VM moved."""
    return vm_outcome(ctx, automation, task, MOVE_FIELDS, MOVE_COLUMNS, "moved")


def _takers(hosts: list[dict], glob: str) -> set[str]:
    """Hosts matching ``glob`` that can take a moved VM: alive, not drained,
    not disabled (placement refuses the others anyway; this says so first)."""
    return {h["host"] for h in hosts
            if h.get("status") == "up" and fnmatch.fnmatchcase(h["host"], glob)}


def _nowhere(what: str, to: str | None, hosts: list[dict], why_own: str) -> str:
    """The one line saying why ``what`` has no destination: ``--to`` (or
    the cluster) offers no live, undrained host but those it leaves."""
    where = f"--to {to!r}" if to is not None else "the cluster"
    matched = [h for h in hosts if fnmatch.fnmatchcase(h["host"], to or "*")]
    if not matched:
        return f"nowhere to move {what}: {where} matches no host"
    up = [h["host"] for h in matched if h.get("status") == "up"]
    if not up:
        return (f"nowhere to move {what}: {where} has no live, undrained host ("
                + ", ".join(f"{h['host']} {h.get('status')}" for h in matched) + ")")
    return (f"nowhere to move {what}: {where} offers only {', '.join(up)}, "
            f"{why_own}")


def _move_target(vm: dict) -> dict:
    return {"name": vm["name"], "uuid": vm["uuid"], "host": vm["host"], "state": vm.get("state")}


def cmd_migrate(ctx: Context) -> int:
    args = ctx.args
    failed = {"automation": None, "state": "failed", "vms": []}
    for text in args.patterns:
        vm_pattern(text)        # bad patterns are usage errors before anything is read
    to = host_pattern(args.to) if args.to is not None else None
    from engine.cluster import read_hosts, read_vms
    store = ctx.store()
    vms, unmatched = match_vms(read_vms(store), args.patterns)
    if unmatched:
        raise Failed("no VM matches " + ", ".join(repr(p) for p in unmatched), result=failed)
    vms.sort(key=lambda vm: (table.natural_key(vm["host"]), table.natural_key(vm["name"])))
    hosts = read_hosts(store)
    takers = _takers(hosts, to or "*")
    stuck = [vm for vm in vms if not takers - {vm["host"]}]
    if stuck:
        raise Failed(_nowhere(", ".join(repr(vm["name"]) for vm in stuck), to, hosts,
                              "where it is" if len(stuck) == 1 else "where they are"),
                     result=failed)
    if args.dry_run:
        rows = [{"name": vm["name"], "uuid": vm["uuid"], "from": vm["host"], "host": None,
                 "state": vm.get("state")} for vm in vms]
        ctx.emit({"automation": None, "state": "dry-run", "vms": rows},
                 table.render(rows, [C("name", "Name"), C("from", "From"), C("state", "State"),
                                     C("uuid", "UUID")])
                 + f"\nmigrate would move {len(rows)} VM{'s' if len(rows) != 1 else ''}"
                 + f" to {'hosts matching ' + repr(to) if to else 'any other host'}")
        return EXIT_OK
    if len(vms) > 1 and not args.yes:
        confirm(ctx, "migrate", vms)
    return run_automation(ctx, "migrate", {
        "vms": [_move_target(vm) for vm in vms], "to": to, "offline": bool(args.offline),
        "parallel": args.parallel,
        **({"bandwidth_mib": args.bandwidth} if args.bandwidth else {}),
        **({"postcopy": True} if args.postcopy else {})}, move_outcome)


def _operator() -> str:
    """Who drains, for ``drained/<host>``: user@machine."""
    import getpass
    import socket
    try:
        user = getpass.getuser()
    except Exception:       # no name for this uid
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _set_drained(ctx: Context, names: list[str], drained: bool) -> list[dict]:
    configure_logging("DEBUG" if _DEBUG else "WARNING")
    from engine.drains import set_drained
    try:
        return set_drained(ctx.store(), names, drained, by=_operator())
    except PlacementError as exc:
        raise Failed(f"placement: {exc}", result={"hosts": []}) from None


def cmd_drain(ctx: Context) -> int:
    """drain / undrain: two quick writes per host, no automation."""
    drained = ctx.args.command == "drain"
    glob = host_pattern(ctx.args.hostglob)
    from engine.cluster import read_hosts, read_vms
    hosts = [h for h in read_hosts(ctx.store()) if fnmatch.fnmatchcase(h["host"], glob)]
    if not hosts:
        raise Failed(f"no host matches {glob!r}", result={"hosts": []})
    done = _set_drained(ctx, [h["host"] for h in hosts], drained)
    vms: dict[str, int] = {}
    if drained:     # what stays there, as vmlist shows it now
        for vm in read_vms(ctx.store()):
            vms[vm["host"]] = vms.get(vm["host"], 0) + 1
    lines = []
    for row in done:
        line = f"{row['host']} {'drained' if row['drained'] else 'undrained'}"
        if row["drained"] and vms.get(row["host"]):
            n = vms[row["host"]]
            line += f" ({n} VM{'s' if n != 1 else ''} stay{'s' if n == 1 else ''} on it)"
        lines.append(line)
    ctx.emit({"hosts": done}, "\n".join(lines))
    return EXIT_OK


def cmd_evacuate(ctx: Context) -> int:
    args = ctx.args
    failed = {"automation": None, "state": "failed", "vms": []}
    glob = host_pattern(args.hostglob)
    to = host_pattern(args.to) if args.to is not None else None
    from engine.cluster import read_hosts, read_vms
    store = ctx.store()
    hosts = read_hosts(store)
    leaving = [h["host"] for h in hosts if fnmatch.fnmatchcase(h["host"], glob)]
    if not leaving:
        raise Failed(f"no host matches {glob!r}", result=failed)

    def on_them():
        found = [vm for vm in read_vms(store) if vm["host"] in leaving]
        return sorted(found, key=lambda vm: (table.natural_key(vm["host"]),
                                             table.natural_key(vm["name"])))
    vms = on_them()
    if (vms or to is not None) and not _takers(hosts, to or "*") - set(leaving):
        raise Failed(_nowhere(f"the VMs of {', '.join(leaving)}", to, hosts,
                              "which " + ("is" if len(leaving) == 1 else "are")
                              + " being evacuated"), result=failed)
    if len(vms) > 1 and not args.yes:
        confirm(ctx, "evacuate", vms)
    # Drained first, so that nothing new lands there while the VMs leave.
    _set_drained(ctx, leaving, True)
    vms = on_them()       # what is there now, booted since the listing or not
    if not vms:
        ctx.emit({"automation": None, "state": "done", "vms": []},
                 f"{', '.join(leaving)} drained; no VMs to move")
        return EXIT_OK
    return run_automation(ctx, "evacuate", {
        "hosts": leaving, "vms": [_move_target(vm) for vm in vms], "to": to,
        "parallel": args.parallel}, move_outcome)


def _when(value) -> str:
    if isinstance(value, (int, float)) and value > 0:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    return "-" if value is None else str(value)


TASK_COLUMNS = [C("id", "ID"), C("kind", "Kind"), C("state", "State"),
                C("initiator", "Initiator"), C("created", "Created", _when),
                C("steps", "Steps", right=True)]
TASK_FIELDS = [c.field for c in TASK_COLUMNS]


def cmd_tasks(ctx: Context) -> int:
    check_fields(ctx.args, TASK_COLUMNS, TASK_FIELDS)       # a bad -o / --sort: before etcd
    api = _engine_api()
    tasks = api.list_tasks(ctx.store(), include_finished=ctx.args.all)
    show_listing(ctx, list(tasks), TASK_COLUMNS, TASK_FIELDS, TASK_FIELDS, "created")
    return EXIT_OK


def _get_task(ctx: Context, automation: str) -> dict:
    api = _engine_api()
    try:
        return api.get_task(ctx.store(), automation)
    except api.UnknownTask:
        raise Failed(f"no automation {automation!r}") from None


def task_text(task: dict) -> str:
    head = [f"{key + ':':<11}{task.get(key)}" for key in ("id", "kind", "state", "initiator")]
    head.append(f"{'members:':<11}{', '.join(map(str, task.get('members') or []))}")
    if task.get("error"):
        head.append(f"{'error:':<11}{task['error']}")
    log = table.render(task.get("log") or [],
                       [C("index", "#", right=True), C("request", "Request"),
                        C("label", "Label"), C("target", "Target"), C("status", "Status"),
                        C("executor", "Executor")])
    result = task.get("result")
    tail = "result:    " + json.dumps(result, default=str) if result else ""
    return "\n".join(filter(None, ["\n".join(head), log, tail]))


def cmd_task(ctx: Context) -> int:
    task = _get_task(ctx, ctx.args.id)
    ctx.emit(task, task_text(task))
    return EXIT_OK


def cmd_wait(ctx: Context) -> int:
    _get_task(ctx, ctx.args.id)      # unknown id: exit 1 before following
    task = follow(ctx, ctx.args.id, timeout=ctx.args.timeout)
    ctx.emit(task, task_text(task))
    if task.get("state") == "running":
        raise Failed(f"automation {ctx.args.id} still running after {ctx.args.timeout}s")
    if task.get("state") != "done":
        raise Failed(f"automation {ctx.args.id} {task.get('state')}"
                     + (f": {task['error']}" if task.get("error") else ""))
    return EXIT_OK


def cmd_abort(ctx: Context) -> int:
    api = _engine_api()
    try:
        doc = api.abort(ctx.store(), ctx.args.id)
    except api.UnknownTask:
        raise Failed(f"no automation {ctx.args.id!r}") from None
    if doc.get("state") not in api.TERMINAL_STATES:
        # asked, but its leader has not stopped it within abort's wait
        raise Failed(f"automation {doc.get('id')} is still {doc.get('state')}: the abort "
                     f"is requested and its leader has not acted on it yet; follow it "
                     f"with: {me()} wait {doc.get('id')}", result=doc)
    ctx.emit(doc, f"automation {doc.get('id')} {doc.get('state')}")
    return EXIT_OK


# -- leases ------------------------------------------------------------------------

LEASE_COLUMNS = [C("lease", "Lease"), C("state", "State"), C("kind", "Kind"),
                 C("start", "Start"), C("end", "End"),
                 C("hosts", "Hosts", lambda h: ",".join(h) or "-"),
                 C("resources", "Slot", lambda r: r or "-"), C("amount", "Amount", right=True),
                 C("used", "VMs", right=True)]


def _lease_time(text: str, what: str) -> float:
    from engine.leases.times import parse_time
    return parse_time(text, what)


def cmd_lease(ctx: Context) -> int:
    from engine.leases import commands, records, views
    from engine.leases.model import check_name
    args = ctx.args
    if getattr(args, "name", None) is not None:
        check_name(args.name)
    if args.what == "create":
        start, end = _lease_time(args.start, "--start"), _lease_time(args.end, "--end")
        if (args.hosts is None) == (args.resources is None):
            raise UsageError("say what the lease holds: --hosts N, or --resources SPEC "
                             "--amount K")
        resources = None
        if args.resources is not None:
            resources, traits = parse_resources(args.resources)
            if traits:
                raise UsageError("put a capacity lease's traits in --required")
            if args.amount is None:
                raise UsageError("a capacity lease needs --amount K (how many slots of SPEC)")
        elif args.amount is not None:
            raise UsageError("--amount goes with --resources; a host lease counts --hosts")
        required = ",".join(parse_traits(args.required)) or None
        on = host_pattern(args.on) if args.on is not None else None
        from engine.leases.times import parse_span
        warn = parse_span(args.warn, "--warn") if args.warn else None
        placement, _ = _placement(ctx)
        try:
            record = commands.create(ctx.store(), placement, args.name, start, end,
                                     count=args.hosts, resources=resources, amount=args.amount,
                                     required=required, on=on, on_end=args.on_end, warn=warn)
        finally:
            placement.close()
        doc = views.lease_doc(record)
        ctx.emit(doc, f"lease {doc['lease']} granted ({doc['state']}): "
                 f"{', '.join(doc['hosts'])}, {doc['start']} .. {doc['end']}")
        return EXIT_OK
    store = ctx.store()
    if args.what == "list":
        vms = records.vms_by_lease(store)
        rows = [views.lease_doc(r, vms.get(r["lease"], []))
                for r in records.all_leases(store, args.pattern or "*")]
        show_listing(ctx, rows, LEASE_COLUMNS, [c.field for c in LEASE_COLUMNS],
                     views.LEASE_FIELDS, "start,lease")
        return EXIT_OK
    if args.what == "show":
        record = records.read(store, args.name)
        if record is None:
            raise Failed(f"no lease {args.name!r}")
        doc = views.lease_detail(record, records.lease_vms(store, args.name))
        ctx.emit(doc, views.detail_text(doc))
        return EXIT_OK
    if args.what == "extend":
        end = _lease_time(args.end, "--end")
        placement, _ = _placement(ctx)
        try:
            record = commands.extend(store, placement, args.name, end)
        finally:
            placement.close()
        doc = views.lease_doc(record, records.lease_vms(store, args.name))
        ctx.emit(doc, f"lease {doc['lease']} now ends at {doc['end']}")
        return EXIT_OK
    if args.what == "delete":
        placement, _ = _placement(ctx)
        try:
            if not ctx.json and records.read(store, args.name) is not None:
                say(f"ending lease {args.name}...")
            doc = commands.delete(store, placement, args.name, wait=args.timeout)
        finally:
            placement.close()
        ctx.emit(doc, f"lease {args.name} deleted")
        return EXIT_OK
    # calendar
    from engine.cluster import read_hosts
    from engine.leases import admission
    glob = host_pattern(args.hostglob)
    since = _lease_time(args.since, "--from")
    from engine.leases.times import parse_span
    until = since + parse_span(args.days + "d" if args.days.isdigit() else args.days, "--days")
    entries = admission.overlapping(store, since, until)
    hosts = [h["host"] for h in read_hosts(store)]
    ctx.emit(views.calendar_doc(entries, hosts, since, until, glob),
             views.calendar_text(entries, hosts, since, until, glob))
    return EXIT_OK


# -- scrub -------------------------------------------------------------------------

SCRUB_COLUMNS = [C("key", "Key"), C("why", "Problem")]


# -- TLS and roles on an etcd of one's own (engine/core/certs.py, auth.py) -----------

def _identities(args) -> dict[str, str]:
    """``{user: role}`` from ``--peer HOST`` and ``--user NAME:ROLE``."""
    from engine.core.auth import ROLES
    users = {"root": "root", "operator": "operator", "viewer": "viewer"}
    for host in args.peer or []:
        if not _NAME.match(host):
            raise UsageError(f"bad host name {host!r} in --peer")
        users[f"peer-{host}"] = "peer"
    for text in args.user or []:
        name, _, role = text.partition(":")
        if not _NAME.match(name) or role not in ROLES:
            raise UsageError(f"bad --user {text!r} (want NAME:ROLE, ROLE one of "
                             f"{', '.join(ROLES)})")
        users[name] = role
    return users


def cmd_tls(ctx: Context) -> int:
    from engine.core import auth, certs
    args = ctx.args
    users = _identities(args)
    if args.tls_command == "certs":
        directory = os.path.abspath(args.dir)
        try:
            certs.authority(directory, ctx.settings["cluster"])
            issued = {"etcd": certs.issue_server(directory, args.name or [])}
            issued.update({user: certs.issue(directory, user, role)
                           for user, role in users.items()})
        except OSError as exc:
            raise UsageError(f"cannot write certificates in {directory}: "
                             f"{exc.strerror or exc}") from None
        doc = {"dir": directory, "ca": os.path.join(directory, "ca.pem"),
               "certificates": [{"user": user, "role": users.get(user, "etcd server"),
                                 "cert": i.cert, "key": i.key} for user, i in issued.items()]}
        ctx.emit(doc, "\n".join(f"{c['user']:<16} {c['role']:<12} {_short(c['cert'])}"
                                for c in doc["certificates"]))
        return EXIT_OK
    done = auth.setup(ctx.store(), users)
    ctx.emit(done, f"roles {', '.join(done['roles'])} on /peerctl/{ctx.settings['cluster']}/; "
                   f"users {', '.join(sorted(done['users']))}; authentication on")
    return EXIT_OK


def cmd_scrub(ctx: Context) -> int:
    args = ctx.args
    if args.delete and not args.yes and not sys.stdin.isatty():
        raise UsageError("scrub --delete deletes keys: add --yes to confirm "
                         "(no terminal to ask on)")
    from engine.scrub import delete_unreadable, find_unreadable
    store = ctx.store()
    found = find_unreadable(store)
    rows = [{"key": bad.key, "why": bad.why} for bad in found]
    deleted: list[str] = []
    if args.delete and found:
        if not args.yes:
            say(table.render(rows, SCRUB_COLUMNS))
            ask(f"Delete these {len(found)} unreadable key{'s' if len(found) != 1 else ''}?",
                cancelled={"keys": rows, "deleted": []})
        deleted = delete_unreadable(store, found)
    text = table.render(rows, SCRUB_COLUMNS) if rows else ""
    summary = (f"{len(found)} unreadable key{'s' if len(found) != 1 else ''}" if found
               else "no unreadable keys")
    if args.delete and found:
        summary += f", {len(deleted)} deleted"
        if len(deleted) < len(found):
            summary += " (the others changed meanwhile: run scrub again)"
    ctx.emit({"keys": rows, "deleted": deleted}, (text + "\n" if text else "") + summary)
    return EXIT_OK


# -- placement -------------------------------------------------------------------

def _placement(ctx: Context):
    """The configured placement service and its JSON shapes (engine.placement.cli)."""
    configure_logging("DEBUG" if ctx.args.debug else "WARNING")
    from engine.placement import cli as placement_cli
    from engine.placement import open_placement
    try:
        return open_placement(None, ctx.store()), placement_cli
    except PlacementError as exc:
        raise Failed(f"placement: {exc}") from None


def _allocations_text(allocations: dict) -> str:
    return " ".join(f"{provider}:" + ",".join(f"{rc}={n}" for rc, n in sorted(res.items()))
                    for provider, res in sorted(allocations.items()))


def _candidates_query(args):
    """The full Placement query language for ``placement candidates`` (groups,
    member_of, in_tree, ...), checked before etcd is touched."""
    parse_traits(args.required)     # a bad --required is blamed on the traits
    from engine.placement.cli import candidates_query
    try:
        return candidates_query(args.spec, args.required, args.limit)
    except PlacementError as exc:
        raise UsageError(f"bad resource spec {args.spec!r}: {exc}") from None


def placement_rows(ctx: Context) -> tuple[list[dict], str]:
    args = ctx.args
    if args.what == "providers":
        glob = host_pattern(args.hostglob)
        service, pcli = _placement(ctx)
        rows = pcli.providers_rows(service, glob)
        if not rows and args.hostglob is not None:
            ctx.emit([])
            raise Failed(f"no provider matches {args.hostglob!r}")
        return rows, table.render(rows, [
            C("name", "Name"), C("uuid", "UUID"), C("generation", "Gen", right=True),
            C("inventories", "Inventory", lambda inv: " ".join(
                f"{rc}:{v.get('total')}" for rc, v in sorted(inv.items()))),
            C("usages", "Used", lambda u: " ".join(f"{rc}:{n}" for rc, n in sorted(u.items()))),
            C("traits", "Traits")])
    if args.what == "allocations":
        if args.consumer is not None:
            try:
                uuid.UUID(args.consumer)
            except ValueError:
                raise UsageError(f"bad consumer {args.consumer!r}: not a UUID") from None
        service, pcli = _placement(ctx)
        rows = pcli.allocations_rows(service, args.consumer)
        return rows, table.render(rows, [C("consumer", "Consumer"),
                                         C("allocations", "Allocations", _allocations_text)])
    query = _candidates_query(args)                 # exit 2 on a bad spec, before etcd
    service, pcli = _placement(ctx)
    try:
        rows = pcli.candidates_rows(service, query)
    except PlacementError as exc:       # what only the backend knows (a CUSTOM_ class)
        raise UsageError(f"bad resource spec {args.spec!r}: {exc}") from None
    return rows, table.render(rows, [C("host", "Host"),
                                     C("allocations", "Allocations", _allocations_text)])


def cmd_placement(ctx: Context) -> int:
    rows, text = placement_rows(ctx)
    ctx.emit(rows, text)
    return EXIT_OK


# -- the peer ----------------------------------------------------------------------

_DEBUG = False
_LOGGING = []


def configure_logging(level: str) -> None:
    """structlog to stderr (never stdout: it carries the JSON), once per process."""
    if _LOGGING:
        return
    _LOGGING.append(level)
    import logging
    import structlog
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso"),
                    structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True)


def cmd_peer(ctx: Context) -> int:
    args, settings = ctx.args, ctx.settings
    if not _NAME.match(args.host):
        raise UsageError(f"bad host name {args.host!r}")
    configure_logging("DEBUG" if args.debug else "INFO")
    import inspect
    from engine.peer import run_peer
    kwargs = {"ttl": args.ttl or int(settings["ttl"]), "hooks_dir": args.hooks,
              "workers": args.workers or int(settings["workers"]),
              "state_dir": args.state_dir, "retention": settings.get("retention"),
              "networks": args.networks if args.networks is not None else settings["networks"],
              "etcd_history": settings["etcd_history"],
              "ha_margin": args.ha_margin if args.ha_margin is not None
              else settings["ha_margin"]}
    from engine.hypervisor.networks import parse_offer
    parse_offer(kwargs["networks"], "in --networks" if args.networks is not None
                else "in the networks setting")
    accepted = inspect.signature(run_peer).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in accepted.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    return int(run_peer(ctx.store(), args.host, args.libvirt, **kwargs) or 0)


# -- the embedded default: up / down (engine/supervisor.py) ------------------------

def cmd_up(ctx: Context) -> int:
    from engine import supervisor
    args, settings = ctx.args, ctx.settings
    state_dir = os.path.abspath(args.state_dir or settings["state_dir"])
    recorded = supervisor.read_up(state_dir)
    _check_up_flags(ctx, state_dir, recorded)
    # a directory set up before keeps its host count and libvirt: flags may
    # only repeat them (checked above), the config file's defaults never apply
    config = supervisor.configuration(recorded)
    hosts = args.hosts or config["hosts"] or int(settings["hosts"])
    outcome = supervisor.start(
        state_dir, settings["cluster"], args.libvirt or config["libvirt"] or settings["libvirt"],
        hosts, settings["ttl"],
        up=recorded, members=args.etcd_members or 1, tls=args.tls,
        history=f"{int(parse_duration(settings['etcd_history']))}s")
    up = outcome.up
    cluster, urls = up["cluster"], supervisor.etcd_urls(up)
    running = [p for p in up["peers"] if supervisor.is_ours(p)]
    tls = supervisor.client_tls(up)
    doc = {"cluster": cluster, "etcd": urls.split(","),
           "processes": supervisor.processes(up),
           "state_dir": state_dir, "hosts": len(running),
           "peers": [dict(_public(p), started=p["host"] in outcome.started)
                     for p in up["peers"]],
           "tls": tls or None}
    if up.get("daemons"):
        doc.update(daemons=[_public(d) for d in up["daemons"]], netns=up.get("netns"))
    lines = []
    for name, what, record in outcome.report:
        where = record.get("url") or record.get("libvirt_uri") or record.get("libvirt")
        lines.append(f"{name:<14} {what:<16} pid {record['pid']:<8} {where}  "
                     f"log {_short(record['log'])}")
    default_dir = state_dir == os.path.abspath(DEFAULTS["state_dir"])
    exports = f"  export PEERCTL_ETCD={urls} PEERCTL_CLUSTER={cluster}"
    if tls:
        exports += "".join(f" \\\n         PEERCTL_{name.upper()}={path}"
                           for name, path in tls.items())
    lines += ["", f"{len(running)} peer{'s' if len(running) != 1 else ''} up in cluster "
              f"{cluster!r}, etcd at {urls}" + (" (TLS, roles on)." if tls else "."),
              ("In this directory peerctl finds them by itself; elsewhere:" if default_dir
               else "Use them with:"),
              exports,
              "Then for instance:",
              f"  {me()} hostlist",
              f"  {me()} boot vm1 --resources VCPU:1,MEMORY_MB:256,DISK_GB:1",
              f"  {me()} vmlist",
              f"Stop everything with: {me()} down"
              + ("" if default_dir else f" --state-dir {_short(state_dir)}")]
    ctx.emit(doc, "\n".join(lines))
    return EXIT_OK


def _check_up_flags(ctx: Context, state_dir: str, up: dict) -> None:
    """A cluster name, libvirt URI, host count, etcd size or TLS asked for
    explicitly must be what the state directory was set up with: `up` never
    silently keeps the recorded one, and switching a set-up directory over is
    not clean (etcd data, peer state and VMs belong to the old one), so it is
    a usage error naming both ways out, before anything starts."""
    from engine import supervisor
    args = ctx.args
    where = _short(state_dir)
    redo = (f"run '{me()} down' and remove {where} first"
            + ("" if state_dir == os.path.abspath(DEFAULTS["state_dir"])
               else " (or use another --state-dir)"))
    if args.cluster is not None:
        asked = f"--cluster {args.cluster}"
    elif os.environ.get("PEERCTL_CLUSTER"):
        asked = f"PEERCTL_CLUSTER={os.environ['PEERCTL_CLUSTER']}"
    else:
        asked = None
    members = len(supervisor.etcd_members(up))
    if args.etcd_members and members and args.etcd_members != members:
        raise UsageError(f"{where} was set up with {members} etcd member"
                         f"{'s' if members != 1 else ''}, not {args.etcd_members}: "
                         f"to change that, {redo}")
    if args.tls and up.get("etcd") and not up.get("tls"):
        raise UsageError(f"{where} was set up without TLS: to use --tls, {redo}")
    recorded = up.get("cluster")
    if asked and recorded and ctx.settings["cluster"] != recorded:
        raise UsageError(f"{where} was set up for cluster {recorded!r}, not "
                         f"{ctx.settings['cluster']!r} ({asked}): to use that, {redo}; "
                         f"or ask for --cluster {recorded}")
    config = supervisor.configuration(up)
    if args.libvirt is not None:
        if config.get("libvirt") and config["libvirt"] != args.libvirt:
            raise UsageError(f"{where} was set up with --libvirt {config['libvirt']}, not "
                             f"{args.libvirt}: to use that, {redo}; or ask for --libvirt "
                             f"{config['libvirt']}, or for nothing")
        for peer in up.get("peers") or []:
            if peer.get("libvirt") and peer["libvirt"] != args.libvirt:
                raise UsageError(f"{peer['host']} in {where} was set up with --libvirt "
                                 f"{peer['libvirt']}, not {args.libvirt}: to use that, "
                                 f"{redo}; or ask for --libvirt {peer['libvirt']}")
    if args.hosts is not None and config.get("hosts") and args.hosts != config["hosts"]:
        raise UsageError(f"{where} was set up with {config['hosts']} host"
                         f"{'s' if config['hosts'] != 1 else ''}, not {args.hosts}: to change "
                         f"that, {redo}; or ask for --hosts {config['hosts']}, or for nothing")


def _short(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _public(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "cmd"}


def cmd_down(ctx: Context) -> int:
    from engine import supervisor
    args = ctx.args
    state_dir = os.path.abspath(args.state_dir or ctx.settings["state_dir"])
    stopped = supervisor.stop(state_dir, keep_guests=args.keep_guests,
                              guest_timeout=args.guest_timeout, say=say)
    if stopped is None:
        ctx.emit({"state_dir": state_dir, "stopped": [], "kept": []},
                 f"nothing to stop: no {_short(supervisor.up_file(state_dir))}")
        return EXIT_OK
    kept = [s for s in stopped if s["what"] == "kept"]
    width = max([len(s["name"]) for s in stopped] + [8])
    lines = [f"{s['name']:<{width}} {s['role']:<9} pid {s['pid'] or '-':<8} {s['what']}"
             + (f" ({', '.join(s['inside'])} in it)" if s.get("inside") else "")
             for s in stopped]
    if kept:
        lines.append("kept running: " + ", ".join(
            f"{s['name']}" + (f" (pid {s['pid']})" if s["pid"] else "") for s in kept)
            + f"; the next '{me()} up' takes them up again")
    # up.json stays: the next `up` reuses its ports with the data kept here
    lines.append(f"data kept in {_short(state_dir)}")
    ctx.emit({"state_dir": state_dir, "stopped": stopped, "kept": kept}, "\n".join(lines))
    return EXIT_OK


# -- the argument parser -------------------------------------------------------------

# argparse asks gettext for each of its own strings as it builds a parser,
# and gettext looks for a catalogue on disk every time: about half of
# building the ~30 subcommands (3 of 6 ms), on every command.  Same answers,
# looked up once.
argparse._ = functools.lru_cache(maxsize=None)(argparse._)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit 2."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds: "
                                         f"{text!r}")
    return value


MAX_ROUNDS = 10000


def _rounds(text: str) -> int:
    value = _positive(text)
    if value > MAX_ROUNDS:
        raise argparse.ArgumentTypeError(f"at most {MAX_ROUNDS}: {text!r}")
    return value


EPILOG = """\
examples:
  python peerctl.py up                       # a local etcd and 3 test peers
  python peerctl.py boot web1 web2 --resources VCPU:1,MEMORY_MB:256,DISK_GB:1
  python peerctl.py vmlist 'host1/*'
  python peerctl.py --format json hostlist
  python peerctl.py stop 'host17/*sql*' --yes
  python peerctl.py migrate db1 --to host2
  python peerctl.py evacuate host1 --yes
  python peerctl.py tasks

Patterns: a VM pattern is HOSTGLOB/VMGLOB or VMGLOB (shell globs, quote them);
a host pattern is a glob on host names.
Settings: flags, then PEERCTL_ETCD / PEERCTL_CLUSTER / PEERCTL_FORMAT, then a
running `up` in ./state, then the config file (PEERCTL_CONF or conf/peerctl.conf).
Exit codes: 0 ok; 1 failed or nothing matched; 2 usage error; 3 etcd
unreachable; 4 permission denied by etcd (names the role); 130 detached from
an automation by Ctrl-C (it goes on).
TLS: --cacert/--cert/--key, or PEERCTL_CACERT / PEERCTL_CERT / PEERCTL_KEY,
or cacert/cert/key in the config file (docs/security.md).
Run `python peerctl.py COMMAND --help` for a command's options and an example."""

LISTING_HELP = "fields: {fields}"


def build_parser() -> Parser:
    common = Parser(add_help=False)
    group = common.add_argument_group("global options (also accepted before the command)")
    group.add_argument("--etcd", default=argparse.SUPPRESS, metavar="URLS",
                       help="comma-separated etcd endpoints [$PEERCTL_ETCD]")
    group.add_argument("--cluster", default=argparse.SUPPRESS, metavar="NAME",
                       help="cluster name [$PEERCTL_CLUSTER]")
    group.add_argument("--format", default=argparse.SUPPRESS, choices=("table", "json"),
                       help="table, or json: one JSON document on stdout [$PEERCTL_FORMAT]")
    group.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and debug logs")
    for name, what in TLS_FLAGS.items():
        group.add_argument(f"--{name}", default=argparse.SUPPRESS, metavar="FILE",
                           help=f"{what} [$PEERCTL_{name.upper()}]")

    called = me()       # "python peerctl.py", or "peerctl" as the console script

    def ex(text: str) -> str:
        """An example as the user would type it, however peerctl was called."""
        return text.replace("python peerctl.py", called)

    parser = Parser(prog="peerctl.py" if called.endswith(".py") else "peerctl",
                    description="peerctl: a masterless cluster "
                    "manager for KVM hosts. State lives in etcd; every host runs a peer.",
                    epilog=ex(EPILOG), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--etcd", metavar="URLS",
                        help="comma-separated etcd endpoints [$PEERCTL_ETCD, "
                             "default http://127.0.0.1:2379]")
    parser.add_argument("--cluster", metavar="NAME",
                        help="cluster name, keys live under /peerctl/NAME/ "
                             "[$PEERCTL_CLUSTER, default 'default']")
    parser.add_argument("--format", choices=("table", "json"),
                        help="output format [$PEERCTL_FORMAT, default table]")
    parser.add_argument("--conf", metavar="FILE",
                        help="config file [$PEERCTL_CONF, default conf/peerctl.conf]")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    for name, what in TLS_FLAGS.items():
        parser.add_argument(f"--{name}", metavar="FILE", help=f"{what} [$PEERCTL_{name.upper()}]")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def command(name, summary, example, func, description=None):
        sub = commands.add_parser(
            name, help=summary, parents=[common],
            description=(description or summary[0].upper() + summary[1:] + "."),
            epilog="example:\n  " + ex(example).replace("\n", "\n  "),
            formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(func=func)
        return sub

    def detach_option(sub):
        sub.add_argument("--detach", action="store_true",
                         help="print the automation id and return at once")

    def yes_option(sub, help="do not ask when several VMs match"):
        sub.add_argument("--yes", "-y", action="store_true", help=help)

    def listing_options(sub, columns, default_sort):
        sub.add_argument("-o", "--output", metavar="FIELDS",
                         help="comma-separated fields to show, '+F1,F2' adds to the "
                              "defaults; fields: " + ",".join(c.field for c in columns))
        sub.add_argument("--sort", metavar="FIELDS",
                         help=f"sort by these fields, -FIELD for descending "
                              f"(default {default_sort})")
        sub.add_argument("--no-headers", action="store_true",
                         help="no header line and no totals (for scripts)")
        sub.add_argument("--separator", metavar="SEP",
                         help="separate fields with SEP instead of aligning them")

    sub = command("vmlist", "list VMs: host, name, vcpus, memory, state",
                  "python peerctl.py vmlist 'host1/*web*' -o name,state,uuid --sort -memory_mb",
                  cmd_vmlist, "List VMs from one read of the cluster state, with a totals "
                  "line. With patterns, only the VMs matching any of them; a pattern "
                  "matching nothing exits 1.")
    sub.add_argument("patterns", nargs="*", metavar="PATTERN",
                     help="HOSTGLOB/VMGLOB or VMGLOB")
    listing_options(sub, VM_COLUMNS, "host,name")

    sub = command("hostlist", "list hosts: hypervisor, CPUs, memory, VMs, storage, kernel",
                  "python peerctl.py hostlist 'host1*' --sort -free_memory_mb",
                  cmd_hostlist, "List every host the cluster has seen (down ones too), "
                  "ending with the totals of the hosts that responded.")
    sub.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    listing_options(sub, HOST_COLUMNS, "host")

    sub = command("hoststats", "show host usage: CPU, memory, VMs, disk and network",
                  "python peerctl.py hoststats --sort -cpu_usage", cmd_hoststats,
                  f"Show how loaded each host is, ending with the totals line. A host "
                  f"at {BUSY_CPU}%% CPU or more counts as busy.")
    sub.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    listing_options(sub, HOST_COLUMNS, "host")

    sub = command("boot", "create and start VMs, placed by the cluster",
                  "python peerctl.py boot web1 web2 --resources VCPU:1,MEMORY_MB:256,DISK_GB:1 "
                  "--required '!CUSTOM_SLOW' --on 'host1*'", cmd_boot,
                  "Create and start one VM per NAME in one automation: each is placed "
                  "on a host with room for SPEC and the required traits, claimed, "
                  "built and started.")
    sub.add_argument("names", nargs="+", metavar="NAME")
    sub.add_argument("--resources", required=True, metavar="SPEC",
                     help="VCPU:1,MEMORY_MB:256,DISK_GB:1 or resources=...&required=...")
    sub.add_argument("--required", metavar="TRAITS",
                     help="traits the host must (TRAIT) or must not (!TRAIT) have")
    sub.add_argument("--image", metavar="URL",
                     help="disk image to boot from: http(s):// or file:// URL, cached per "
                          "host; end it with #sha256=HEX to have the download checked")
    sub.add_argument("--on", metavar="HOSTGLOB", help="only place on hosts matching this")
    sub.add_argument("--network", action="append", metavar="NAME",
                     help="a network interface on NAME (repeatable, in order; MACs derive "
                          "from the VM's uuid); 'none' for no interface (default: the "
                          "network setting, 'default')")
    sub.add_argument("--user-data", metavar="FILE",
                     help="cloud-init user-data (at most 64 KiB), on a NoCloud seed CD-ROM")
    sub.add_argument("--ssh-key", action="append", metavar="FILE",
                     help="an OpenSSH public key file for the guest (repeatable; default: "
                          "none), in the seed's meta-data public-keys")
    sub.add_argument("--hostname", metavar="NAME",
                     help="the guest's hostname in the seed (default: the VM name)")
    sub.add_argument("--reservation", metavar="LEASE",
                     help="boot into an active lease: on its hosts, or taking one of its "
                          "capacity slots (the VM must fit a slot)")
    sub.add_argument("--ha", choices=("restart", "none"), default="none",
                     help="restart: when the VM's host dies, the VM is fenced there and "
                          "started again on another host, from its image (default none: it "
                          "waits, state unknown, for its host; docs/ha.md)")
    sub.add_argument("--wait-ip", action="store_true",
                     help="after the build, wait for each VM's guest address and print it")
    sub.add_argument("--ip-timeout", type=_positive, default=300, metavar="SECONDS",
                     help="how long --wait-ip waits (default 300)")
    detach_option(sub)

    for action in VM_ACTIONS:
        caution = (" On more than one VM it lists them and asks for --yes."
                   if action in DESTRUCTIVE else "")
        sub = command(action, f"{action} the VMs matching patterns, in parallel",
                      f"python peerctl.py {action} 'host17/*sql*' --dry-run\n"
                      f"python peerctl.py {action} '*webfront*' --yes", cmd_vm_action,
                      f"{action.capitalize()} every VM matching any PATTERN, all in one "
                      f"automation.{caution} A pattern matching nothing exits 1.")
        sub.add_argument("patterns", nargs="+", metavar="PATTERN",
                         help="HOSTGLOB/VMGLOB or VMGLOB")
        yes_option(sub)
        sub.add_argument("--dry-run", action="store_true",
                         help="only list the VMs that would be acted on")
        detach_option(sub)

    sub = command("console", "an interactive serial console to a VM",
                  "python peerctl.py console web1\n"
                  "printf 'uname -a\\n' | python peerctl.py console web1 --no-tty --timeout 5",
                  cmd_console,
                  "Attach this terminal to the serial console of one VM, through its host's "
                  "libvirt (the URI in the host's record), from any machine that reaches it. "
                  "The console is forced: a client holding it already is cut off. On a "
                  "terminal, the terminal is raw and Ctrl-] leaves (exit 0). With --no-tty, or "
                  "when stdin is not a terminal, stdin is passed to the guest byte for byte "
                  "(Ctrl-] too) and its end does not leave: the session ends when the console "
                  "closes, on SIGINT/SIGTERM (exit 128+signal) or after --timeout (exit 0). "
                  "The guest's output is on stdout, peerctl's lines on stderr. The session "
                  "ends with exit 0 when the VM stops; a VM that is not running, a host that "
                  "does not answer (exit 3) or a hypervisor offering no console fail with one "
                  "line.")
    sub.add_argument("name", metavar="NAME", help="the VM: VMGLOB or HOSTGLOB/VMGLOB, "
                                                  "matching exactly one VM")
    sub.add_argument("--no-tty", action="store_true",
                     help="a plain byte stream even on a terminal: no raw mode, no escape")
    sub.add_argument("--timeout", metavar="SECONDS",
                     type=lambda text: parse_duration(text, "--timeout"),
                     help="leave after this long (exit 0); for scripts that pipe a command "
                          "in and read its output")

    sub = command("ha", "set the HA policy of VMs",
                  "python peerctl.py ha 'db*' restart\npython peerctl.py ha 'host3/*' none",
                  cmd_ha, "Set what happens to every VM matching a PATTERN when its host "
                  "dies: restart (fenced there, started again on another host from its "
                  "image; the old disks are kept aside when the host returns) or none (it "
                  "waits for its host, listed as unknown). The VMs' hosts must be up.")
    sub.add_argument("patterns", nargs="+", metavar="PATTERN",
                     help="HOSTGLOB/VMGLOB or VMGLOB")
    sub.add_argument("policy", choices=("restart", "none"), metavar="restart|none")
    detach_option(sub)

    sub = command("aside", "disks of stale VM copies kept aside after an HA restart",
                  "python peerctl.py aside list\n"
                  "python peerctl.py aside delete 'host3/db1' --yes", cmd_aside,
                  "When a host comes back after its HA VMs were restarted elsewhere, its "
                  "copies are stopped and undefined, and their disks kept aside: renamed "
                  "aside-UUID-TIME* in the host's pool, listed here until deleted on purpose.")
    what = sub.add_subparsers(dest="what", metavar="WHAT", required=True, parser_class=Parser)
    p = what.add_parser("list", parents=[common], help="list disks kept aside",
                        description="List disks kept aside, by host.")
    p.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    listing_options(p, ASIDE_COLUMNS, "host,name")
    p = what.add_parser("delete", parents=[common], help="delete disks kept aside",
                        description="Delete the disks kept aside matching a PATTERN, on "
                        "their hosts (which must be up). More than one asks for --yes.")
    p.add_argument("patterns", nargs="+", metavar="PATTERN",
                   help="HOSTGLOB/VMGLOB or VMGLOB (the VM's name or uuid)")
    yes_option(p, "do not ask when several match")
    detach_option(p)

    sub = command("migrate", "move VMs to other hosts, live where they run",
                  "python peerctl.py migrate db1 --to 'host2*'\n"
                  "python peerctl.py migrate 'host1/*web*' --yes --parallel 2\n"
                  "python peerctl.py migrate 'host1/*' --dry-run", cmd_migrate,
                  "Move every VM matching any PATTERN to another live, undrained host "
                  "that fits it (placement picks; --to narrows the choice), all in one "
                  "automation, N at a time (--parallel). Each VM's Mode says how it moved: "
                  "'live' (it ran on, memory and disks copied), 'cold' (shut off, or "
                  "stopped first with --offline: disks copied, left as it was), or "
                  "'redefine' (libvirt's test driver: the domain is defined anew on the "
                  "destination, no disk is copied). A VM that could not move says why in "
                  "the Error column and the command exits 1. On more than one "
                  "VM it lists them and asks for --yes. A pattern matching nothing, or "
                  "--to offering no host but the VM's own, exits 1 with nothing started.")
    sub.add_argument("patterns", nargs="+", metavar="PATTERN", help="HOSTGLOB/VMGLOB or VMGLOB")
    sub.add_argument("--to", metavar="HOSTGLOB", help="only move to hosts matching this")
    sub.add_argument("--offline", action="store_true",
                     help="stop a running VM, move it cold, start it again there")
    sub.add_argument("--parallel", type=_positive, default=4, metavar="N",
                     help="VMs moved at the same time (default 4)")
    sub.add_argument("--bandwidth", type=_positive, metavar="MIB",
                     help="cap each copy at MIB MiB/s (default: as fast as it goes)")
    sub.add_argument("--postcopy", action="store_true",
                     help="a live move that has not converged within its time (120 s per "
                          "GiB of RAM and disk) switches to post-copy instead of aborting")
    yes_option(sub)
    sub.add_argument("--dry-run", action="store_true",
                     help="only list the VMs that would move")
    detach_option(sub)

    for name, summary, what in (
            ("drain", "place no new VM on hosts; their VMs stay",
             "Drain every host matching HOSTGLOB, down ones too: no new VM is placed "
             "there (boot, migrate and evacuate skip it); the VMs on it stay. hostlist "
             "shows it drained. Two writes per host, no automation."),
            ("undrain", "let hosts take new VMs again",
             "Undrain every host matching HOSTGLOB: it takes new VMs again. No VM "
             "moves back.")):
        sub = command(name, summary, f"python peerctl.py {name} 'host1*'", cmd_drain, what)
        sub.add_argument("hostglob", metavar="HOSTGLOB")

    sub = command("evacuate", "drain hosts and move every VM off them",
                  "python peerctl.py evacuate host1 --yes\n"
                  "python peerctl.py evacuate 'rack3-*' --to 'rack4-*' --parallel 8 --detach",
                  cmd_evacuate,
                  "Drain every host matching HOSTGLOB, then move all its VMs to other "
                  "live, undrained hosts in one automation, N at a time (--parallel): live "
                  "where running, cold where shut off ('redefine' on libvirt's test "
                  "driver); see migrate. With more than one VM it lists them and asks "
                  "for --yes first (nothing is drained before that). With no VM, it only "
                  "drains. A VM that could not move says why and the command exits 1; "
                  "the hosts stay drained either way.")
    sub.add_argument("hostglob", metavar="HOSTGLOB")
    sub.add_argument("--to", metavar="HOSTGLOB", help="only move to hosts matching this")
    sub.add_argument("--parallel", type=_positive, default=4, metavar="N",
                     help="VMs moved at the same time (default 4)")
    yes_option(sub, "do not ask when several VMs would move")
    detach_option(sub)

    sub = command("ping", "round trips through the automation machinery to live hosts",
                  "python peerctl.py ping 'host*' --rounds 3", cmd_ping)
    sub.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    sub.add_argument("--rounds", type=_rounds, default=1, metavar="N",
                     help=f"round trips per host, 1 to {MAX_ROUNDS} (default 1)")
    detach_option(sub)

    sub = command("tasks", "list running automations (--all: finished ones too)",
                  "python peerctl.py tasks --all", cmd_tasks)
    sub.add_argument("--all", action="store_true", help="include finished automations")
    listing_options(sub, TASK_COLUMNS, "created")

    sub = command("task", "show one automation with its log",
                  "python peerctl.py task 0193f2c4a1b2", cmd_task)
    sub.add_argument("id", metavar="ID")

    sub = command("wait", "follow an automation until it ends (exit 1 unless done)",
                  "python peerctl.py wait 0193f2c4a1b2", cmd_wait,
                  "Follow an automation with the progress view until it ends; exit 0 "
                  "when done, 1 when failed, aborted or stuck. Ctrl-C detaches again.")
    sub.add_argument("id", metavar="ID")
    sub.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                     help="give up waiting after this long (exit 1)")

    sub = command("abort", "ask an automation to stop",
                  "python peerctl.py abort 0193f2c4a1b2", cmd_abort)
    sub.add_argument("id", metavar="ID")

    sub = command("placement", "inspect placement: providers, allocations, candidates",
                  "python peerctl.py placement providers 'host1*'\n"
                  "python peerctl.py placement allocations\n"
                  "python peerctl.py placement candidates VCPU:2,MEMORY_MB:512 --limit 5",
                  cmd_placement)
    what = sub.add_subparsers(dest="what", metavar="WHAT", required=True,
                              parser_class=Parser)
    p = what.add_parser("providers", parents=[common], help="resource providers",
                        epilog=ex("example:\n  python peerctl.py placement providers 'host1*'"),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    p = what.add_parser("allocations", parents=[common], help="allocations by consumer",
                        epilog=ex("example:\n  python peerctl.py placement allocations"),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("consumer", nargs="?", metavar="CONSUMER")
    p = what.add_parser("candidates", parents=[common], help="where SPEC would fit, best first",
                        epilog=ex("example:\n  python peerctl.py placement candidates "
                                  "VCPU:2,MEMORY_MB:512 --required HW_CPU_X86_AVX2 --limit 5\n"
                                  "  python peerctl.py placement candidates "
                                  "'resources=VCPU:1&resources1=VGPU:1&group_policy=none"
                                  "&member_of=in:AGG1,AGG2'"),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--required", metavar="TRAITS")
    p.add_argument("--limit", type=_positive, metavar="N",
                   help="at most N candidates (default: the query's limit=, else 10)")

    sub = command("lease", "reserve whole hosts or capacity over a time window",
                  "python peerctl.py lease create maint --start +1h --end +1d --hosts 2\n"
                  "python peerctl.py lease create ci --start now --end +8h "
                  "--resources VCPU:2,MEMORY_MB:2048,DISK_GB:10 --amount 4\n"
                  "python peerctl.py boot ci1 --resources VCPU:2,MEMORY_MB:2048,DISK_GB:10 "
                  "--reservation ci\n"
                  "python peerctl.py lease calendar 'host*' --days 3",
                  cmd_lease, "Leases reserve, from a start to an end, whole hosts (no "
                  "other VM is placed there) or slots of capacity (held in placement). "
                  "A lease is granted only if it fits over its whole window, atomically; "
                  "VMs boot into it with boot --reservation, and at its end its VMs are "
                  "destroyed, stopped or kept (--on-end). T is now, +DURATION (+2h, +1d) or "
                  "an ISO date-time (UTC unless it says otherwise).")
    what = sub.add_subparsers(dest="what", metavar="WHAT", required=True,
                              parser_class=Parser)

    def lease_sub(name, summary, example):
        return what.add_parser(name, parents=[common], help=summary,
                               description=summary[0].upper() + summary[1:] + ".",
                               epilog=ex("example:\n  " + example),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    p = lease_sub("create", "grant a lease if it fits over its whole window",
                  "python peerctl.py lease create maint --start +1h --end +1d --hosts 2 "
                  "--required CUSTOM_SSD --warn 30m")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--start", required=True, metavar="T", help="now, +DURATION or ISO time")
    p.add_argument("--end", required=True, metavar="T", help="+DURATION (from now) or ISO time")
    p.add_argument("--hosts", type=_positive, metavar="N", help="reserve N whole hosts")
    p.add_argument("--resources", metavar="SPEC", help="one slot: VCPU:2,MEMORY_MB:2048,...")
    p.add_argument("--amount", type=_positive, metavar="K", help="how many slots of SPEC")
    p.add_argument("--required", metavar="TRAITS", help="traits the hosts must have")
    p.add_argument("--on", metavar="HOSTGLOB", help="only hosts matching this (host leases)")
    p.add_argument("--on-end", default="destroy", choices=("destroy", "stop", "keep"),
                   help="what happens to the lease's VMs at its end (default destroy)")
    p.add_argument("--warn", metavar="DURATION",
                   help="run the lease_warn step (its hook warns people) this long before "
                        "the end")
    p = lease_sub("list", "list leases, soonest first", "python peerctl.py lease list 'ci*'")
    p.add_argument("pattern", nargs="?", metavar="GLOB")
    listing_options(p, LEASE_COLUMNS, "start,lease")
    p = lease_sub("show", "one lease with its reservations, events and VMs",
                  "python peerctl.py lease show maint")
    p.add_argument("name", metavar="NAME")
    p = lease_sub("extend", "move a lease's end (later if it still fits, or earlier)",
                  "python peerctl.py lease extend maint --end +2d")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--end", required=True, metavar="T")
    p = lease_sub("delete", "end a lease now (its --on-end policy applies) and forget it",
                  "python peerctl.py lease delete maint")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--timeout", type=_seconds, default=120.0, metavar="SECONDS",
                   help="how long the lease's automation gets to end it before this "
                        "command frees its capacity itself (default 120)")
    p = lease_sub("calendar", "who holds which host over the next days, as a timeline",
                  "python peerctl.py lease calendar 'host1*' --days 3")
    p.add_argument("hostglob", nargs="?", metavar="HOSTGLOB")
    p.add_argument("--days", default="7", metavar="N", help="how far to look (default 7)")
    p.add_argument("--from", dest="since", default="now", metavar="T",
                   help="where the timeline starts (default now)")

    sub = command("scrub", "list the keys in etcd nobody can read (--delete: remove them)",
                  "python peerctl.py scrub\npython peerctl.py scrub --delete --yes", cmd_scrub,
                  "List every key of the cluster whose value cannot be decoded or does not "
                  "have the shape its kind of key must have (every command skips those with "
                  "a warning). With --delete, delete them after asking; a key rewritten "
                  "meanwhile is kept.")
    sub.add_argument("--delete", action="store_true", help="delete the keys listed")
    yes_option(sub, "do not ask before deleting (needed without a terminal)")

    sub = command("tls", "certificates and etcd roles for an etcd of your own",
                  "python peerctl.py tls certs /etc/peerctl/tls --peer kvm1 --peer kvm2 "
                  "--name etcd1.example\n"
                  "python peerctl.py --etcd https://etcd1.example:2379 --cacert ca.pem "
                  "--cert root.pem --key root-key.pem tls roles --peer kvm1 --peer kvm2",
                  cmd_tls, "certs: make a CA (once) and certificates in DIR: etcd's (for "
                  "127.0.0.1, localhost and every --name), root, operator, viewer, one "
                  "per --peer host (user peer-HOST) and per --user NAME:ROLE; files "
                  "already there are kept. roles: as etcd's root, grant roles peer, "
                  "operator and viewer on this cluster's keys, add those users, and turn "
                  "etcd's authentication on (docs/security.md).")
    tls = sub.add_subparsers(dest="tls_command", metavar="ACTION", required=True)
    for action, summary in (("certs", "make the CA and certificates"),
                            ("roles", "set up etcd's roles and users, as root")):
        part = tls.add_parser(action, help=summary, parents=[common])
        if action == "certs":
            part.add_argument("dir", metavar="DIR", help="where the files go")
            part.add_argument("--name", action="append", metavar="HOST",
                              help="a name or address etcd is reached at (repeatable)")
        part.add_argument("--peer", action="append", metavar="HOST",
                          help="a host whose peer gets an identity (repeatable)")
        part.add_argument("--user", action="append", metavar="NAME:ROLE",
                          help="another identity: ROLE is peer, operator or viewer")

    sub = command("peer", "run this host's peer in the foreground",
                  "python peerctl.py peer --host host1 --libvirt qemu:///system --ttl 5",
                  cmd_peer, "Run the peer of one host: it registers the host, keeps its "
                  "records current, executes requests and leads automations. SIGTERM or "
                  "SIGINT stop it gracefully.")
    sub.add_argument("--host", required=True, metavar="NAME")
    sub.add_argument("--libvirt", required=True, metavar="URI")
    sub.add_argument("--ttl", type=_positive, metavar="SECONDS",
                     help="etcd lease TTL bounding failure detection (default 5)")
    sub.add_argument("--hooks", metavar="DIR", help="directory of R.pre / R.post hooks")
    sub.add_argument("--workers", type=_positive, metavar="N",
                     help="requests executed in parallel (default 8)")
    sub.add_argument("--state-dir", metavar="DIR", help="local state of this peer")
    sub.add_argument("--networks", metavar="LIST",
                     help="networks this host offers VMs: NAME (a libvirt network) or "
                          "NAME=BRIDGE, comma-separated; 'none' for none (default: the "
                          "networks setting, 'default')")
    sub.add_argument("--ha-margin", type=_seconds, metavar="SECONDS",
                     help="after a host's lease expired, how long before its HA VMs are "
                          "restarted elsewhere (default: the ha_margin setting, 3s)")

    sub = command("up", "start a local etcd and N peers on this machine",
                  "python peerctl.py up --hosts 3\npython peerctl.py up --libvirt qemu:///system",
                  cmd_up, "Start the embedded default: Debian's etcd with its data in the "
                  "state directory and N peers named host1..hostN (libvirt test driver "
                  "by default), all detached, with PIDs in STATE_DIR/up.json. Running it "
                  "again reports what is up and starts what is missing, with the host count "
                  "and libvirt the directory was set up with (other ones are refused).")
    sub.add_argument("--hosts", type=_positive, metavar="N",
                     help="number of peers (default 3; on a directory already set up, "
                          "what it was set up with)")
    sub.add_argument("--libvirt", metavar="URI",
                     help="libvirt URI, or 'qemu': a private libvirtd per host inside a "
                          "network namespace for the cluster, so that VMs can migrate "
                          "between hosts (default test:///default; on a directory already "
                          "set up, what it was set up with; docs/local-kvm.md)")
    sub.add_argument("--state-dir", metavar="DIR", help="default ./state")
    sub.add_argument("--etcd-members", type=_positive, metavar="N",
                     help="etcd members on loopback (default 1; 3 survives one's death); "
                          "fixed when the state directory is first set up")
    sub.add_argument("--tls", action="store_true",
                     help="etcd over TLS with client certificates and roles: a CA and "
                          "certificates in STATE_DIR/tls (peer per host, operator, viewer, "
                          "root); commands here use the operator's (docs/security.md)")

    sub = command("down", "stop what `up` started, by PID",
                  "python peerctl.py down\npython peerctl.py down --keep-guests", cmd_down,
                  "Stop what `up` started (by recorded PID, only if the process still "
                  "runs the recorded command): the peers, etcd, each host's guard and, "
                  "with --libvirt qemu, the guests (ACPI shutdown, powered off after "
                  "--guest-timeout), the guests' network, the private libvirtd and "
                  "virtlogd and the network namespace. Data stays; on the test driver "
                  "the VMs lived in the peers and are gone.")
    sub.add_argument("--state-dir", metavar="DIR", help="default ./state")
    sub.add_argument("--keep-guests", action="store_true",
                     help="leave the QEMU guests running, with what they need (their "
                          "virtlogd, the network's dnsmasq, the namespace); listed as kept")
    sub.add_argument("--guest-timeout", type=_seconds, default=None, metavar="SECONDS",
                     help="how long guests have to shut down before they are powered off "
                          "(default 30)")
    parser.command_names = list(commands.choices)
    return parser


# -- main --------------------------------------------------------------------------

def run(argv=None, one_shot: bool = False) -> int:
    """Parse, run one command, map every failure onto an exit code and one line.

    ``one_shot``: this process ends with the command (:func:`main`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    fixed = []
    for arg in argv:        # `--sort -memory_mb` (descending) is a value, not an option
        if fixed and fixed[-1] == "--sort" and arg.startswith("-") and arg != "--":
            fixed[-1] = f"--sort={arg}"
        else:
            fixed.append(arg)
    argv = fixed
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        debug = bool(getattr(args, "debug", False))
        if one_shot and args.command != "peer":
            _collect_rarely()
        if not args.command:
            say(f"usage: {me()} [--etcd URLS] [--cluster NAME] [--format table|json] "
                f"COMMAND ...\ncommands: {' '.join(parser.command_names)}\n"
                f"peerctl: no command given (see {me()} --help)")
            return EXIT_USAGE
        ctx = Context(args, settings_for(args))
        global _DEBUG
        _DEBUG = debug
        if args.command != "peer":
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # `vmlist | head` is fine
            from engine.core import values      # a peer logs them instead
            values.set_reporter(warn_unreadable)
        return args.func(ctx)
    except Failed as exc:
        if exc.result is not None and "ctx" in locals() and ctx.json:
            ctx.emit(exc.result)
        say(f"peerctl: {exc}")
        return exc.exit_code
    except Unavailable as exc:
        if debug:
            import traceback
            traceback.print_exc()
        code = exc.exit_code
        if isinstance(exc, StoreRefused):
            code = exc.exit_code    # etcd answered: its own words
        elif isinstance(exc, StoreUnavailable):
            exc = f"etcd unreachable at {ctx.settings['etcd'] if 'ctx' in locals() else '?'}"
        elif exc.where is not None:
            exc = f"{exc.service} unreachable at {exc.where}"
        say(f"peerctl: {exc}")
        return code
    except UsageError as exc:
        say(f"peerctl: {exc}")
        return EXIT_USAGE
    except PeerctlError as exc:
        if debug:
            import traceback
            traceback.print_exc()
        say(f"peerctl: {exc}".splitlines()[0])
        return exc.exit_code
    except Detached:
        return EXIT_DETACHED
    except KeyboardInterrupt:
        say("peerctl: interrupted")
        return EXIT_DETACHED
    except Exception as exc:
        if debug:
            import traceback
            traceback.print_exc()
        say(f"peerctl: {type(exc).__name__}: {exc}".splitlines()[0]
            + ("" if debug else " (--debug shows the traceback)"))
        return EXIT_FAILED


def _collect_rarely() -> None:
    """A command that ends with its process: the cyclic garbage collector
    would only walk, again and again, the tens of thousands of acyclic rows
    of a listing (about 10 ms of vmlist's 10,000 VMs), so it runs rarely
    and skips what the imports made.  A peer keeps the default."""
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def main(argv=None) -> None:
    code = run(argv, one_shot=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    # client library threads (watches, keepalives) must not hold the exit
    os._exit(code)

