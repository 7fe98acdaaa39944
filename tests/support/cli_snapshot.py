"""Snapshot peerctl's command line, to prove that a refactor only moved code.

    python tests/support/cli_snapshot.py --repo DIR --out OUTDIR

For the checkout DIR (run as ``DIR/peerctl.py`` with cwd=DIR) it writes into
OUTDIR ``help/<cmd>[_<sub>].txt``, the ``--help`` of the top level
(``peerctl.txt``), of every command that help lists and of every subcommand
theirs list (COLUMNS=100: argparse wraps the same way every time); and
``json/<NN>_<step>.json``, the fixed SCENARIO below of ``--format json``
commands run against an etcd of its own on free loopback ports and three
real peers on libvirt's test driver.  Each file is one record: the command
line, its exit code, its stdout and its stderr.

What it promises: what differs from run to run is normalised first (uuids,
named after their VM or host where known, automation ids, times, ports,
addresses, paths, progress lines, which member leads, figures such as
latency); nothing a command orders is sorted, except rows it orders by a
random key.  Two runs of one tree give identical directories, so ``diff -r``
of snapshots before and after a refactor shows what the refactor changed.
Whatever it starts is stopped by PID, even on error, and its temporary
directory removed.  The standard library only: it imports nothing of DIR.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SPEC = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
CLUSTER = "snap"
HOSTS = ("host1", "host2", "host3")
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
VARYING = ("latency_ms", "downtime_ms", "bytes", "cpu_usage", "free_memory_mb",
           "free_disk_gb", "net_rx_bytes", "net_tx_bytes", "pid")
PATTERNS = [   # (regex, replacement), applied in order
    (r"(?m)^\d\d:\d\d:\d\d (?!automation ).*\n", ""),     # progress: timing decides which
    (r"(?m)^\d\d:\d\d:\d\d ", "<time> "),
    (UUID, "<uuid>"),
    (r"\b\d{8}-\d{6}-[0-9a-f]{6}\b", "<id>"),                    # engine.core.api.new_id
    (r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2}|\s?UTC)?", "<time>"),
    (r"\b1[6-9]\d{8}(\.\d+)?\b", "<time>"),                      # epoch seconds
    (r'("(?:%s)": )-?\d+(\.\d+)?([eE][+-]?\d+)?' % "|".join(VARYING), r"\1<n>"),
    (r"\b(127\.0\.0\.1|localhost):\d+", r"\1:<port>"),
    (r"\bpid \d+", "pid <n>"),
    (r"\b(?!127\.)\d{1,3}(\.\d{1,3}){3}\b", "<ip>"),             # the test driver's leases
    (r"\b[0-9a-f]{2}(:[0-9a-f]{2}){5}\b", "<mac>"),             # derived from the VM's uuid
    (r'("initiator": )"[^"]*"', r'\1"<host>"'),                 # whichever member leads
]


class Snapshot:
    """Runs one checkout's command line and writes normalised records."""

    def __init__(self, repo: str, out: str, tmp: str):
        self.repo, self.out, self.tmp = repo, out, tmp
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCTL_")}
        self.env.update(COLUMNS="100", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
                        PEERCTL_CLUSTER=CLUSTER, PEERCTL_ETCD="http://127.0.0.1:1")
        self.names: dict[str, str] = {}     # uuid -> the VM or provider it names
        self.results: dict = {}             # step -> its stdout, parsed
        self.written = self.steps = 0

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, os.path.join(self.repo, "peerctl.py"), *args],
                              cwd=self.repo, env=self.env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=180)

    def json(self, *args: str):
        return parse(self.run("--format", "json", *args).stdout)

    def learn(self, doc) -> None:
        """Name every uuid that ``doc`` gives a name (VMs, providers)."""
        if isinstance(doc, dict) and all(isinstance(doc.get(k), str) for k in ("uuid", "name")):
            self.names.setdefault(doc["uuid"], doc["name"])
        for value in (doc.values() if isinstance(doc, dict) else
                      doc if isinstance(doc, list) else ()):
            self.learn(value)

    def normalise(self, text: str) -> str:
        text = text.replace(self.tmp, "<tmp>").replace(self.repo, "<repo>")
        text = re.sub(UUID, lambda m: f"<uuid:{self.names[m[0]]}>" if m[0] in self.names
                      else m[0], text)
        text = re.sub(r'"members": \[[^\]]*\]', sort_members, text)
        for pattern, replacement in PATTERNS:
            text = re.sub(pattern, replacement, text)
        return text

    def write(self, relative: str, args, done, sort_rows: bool = False) -> None:
        stdout = self.normalise(done.stdout)
        lines = stdout.splitlines(keepends=True)
        if sort_rows and len(lines) > 2:     # one row a line between "[" and "]"
            rows = sorted(line.rstrip(",\n") for line in lines[1:-1])
            stdout = lines[0] + ",\n".join(rows) + "\n" + lines[-1]
        record = (self.normalise(f"$ peerctl {' '.join(args)}\nexit: {done.returncode}\n")
                  + f"--- stdout\n{stdout}--- stderr\n{self.normalise(done.stderr)}")
        path = os.path.join(self.out, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(record)
        self.written += 1

    def step(self, name: str, words: list[str]) -> None:
        """Run ``--format json WORDS`` and record it as step ``name``."""
        words = [re.sub(r"\{([\w:]+)\}", lambda m: self.lookup(m[1]), w) for w in words]
        args = ["--format", "json", *words]
        done = self.run(*args)
        self.results[name] = parse(done.stdout)
        self.learn(self.results[name])
        self.steps += 1
        self.write(f"json/{self.steps:02d}_{name}.json", args, done, name in SORTED_ROWS)

    def lookup(self, what: str) -> str:
        """``spec``, ``uuid:VM``, or the automation id that step ``what`` printed."""
        if what == "spec":
            return SPEC
        if what.startswith("uuid:"):
            found = [u for u, name in self.names.items() if name == what[5:]]
            if not found:
                raise RuntimeError(f"no step printed the uuid of {what[5:]}")
            return found[0]
        doc = self.results.get(what)
        if not isinstance(doc, dict) or not doc.get("automation"):
            raise RuntimeError(f"step {what} printed no automation id: {doc!r}")
        return doc["automation"]


def parse(stdout: str):
    try:
        return json.loads(stdout)
    except ValueError:
        return None


def sort_members(match: re.Match) -> str:
    """An automation's members are chosen in random order (api.automation_ops):
    the same hosts (all named host*), sorted, in the JSON's own layout."""
    hosts = iter(sorted(re.findall(r'"host[^"]*"', match[0])))
    return re.sub(r'"host[^"]*"', lambda _: next(hosts), match[0])


# -- help ---------------------------------------------------------------------------

def listed_commands(help_text: str) -> list[str]:
    """The names argparse lists under a metavar line (COMMAND, WHAT, ACTION)."""
    names, inside = [], False
    for line in help_text.splitlines():
        if re.fullmatch(r"  [A-Z]+", line):
            inside = True
        elif inside and (m := re.match(r"    ([a-z][\w-]*)(\s|$)", line)):
            names.append(m[1])
        elif inside and not line.startswith("      "):     # not a wrapped summary
            inside = False
    return names


def snapshot_help(snap: Snapshot) -> None:
    top = snap.run("--help")
    snap.write("help/peerctl.txt", ["--help"], top)
    for command in listed_commands(top.stdout):
        done = snap.run(command, "--help")
        snap.write(f"help/{command}.txt", [command, "--help"], done)
        for sub in listed_commands(done.stdout):
            snap.write(f"help/{command}_{sub}.txt", [command, sub, "--help"],
                       snap.run(command, sub, "--help"))


# -- a cluster of its own -----------------------------------------------------------

def wait_until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def spawn(started: list, command: list[str], log: str, **options) -> None:
    """Start ``command`` in a session of its own (so that its group can be
    killed), output to ``log``, and remember it in ``started``."""
    with open(log, "ab") as out:
        started.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        **options))


def stop(started: list) -> None:
    for process in reversed(started):
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def free_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as reply:
            return b'"true"' in reply.read()
    except OSError:
        return False


def start_etcd(tmp: str, started: list) -> str:
    """etcd on free loopback ports, as engine/core/etcd_server.py starts it."""
    client, peer = free_url(), free_url()
    spawn(started, [shutil.which("etcd") or "/usr/bin/etcd", "--name", "snap",
                    "--data-dir", os.path.join(tmp, "etcd"), "--listen-client-urls", client,
                    "--advertise-client-urls", client, "--listen-peer-urls", peer,
                    "--initial-advertise-peer-urls", peer, "--initial-cluster", f"snap={peer}",
                    "--heartbeat-interval", "10", "--election-timeout", "100",
                    "--log-level", "warn"], os.path.join(tmp, "etcd.log"))
    wait_until(lambda: healthy(client), "etcd healthy", timeout=20)
    return client


def start_peers(snap: Snapshot, started: list) -> None:
    for host in HOSTS:
        spawn(started, [sys.executable, os.path.join(snap.repo, "peerctl.py"), "peer",
                        "--host", host, "--libvirt", "test:///default", "--ttl", "2",
                        "--state-dir", os.path.join(snap.tmp, f"state-{host}")],
              os.path.join(snap.tmp, f"{host}.log"), cwd=snap.repo, env=snap.env)
    wait_until(lambda: {h["host"] for h in snap.json("hostlist") or [] if h["alive"]}
               >= set(HOSTS), "three peers alive in hostlist")
    wait_until(lambda: {p["name"] for p in snap.json("placement", "providers") or []}
               >= set(HOSTS), "three placement providers")


def put_garbled(etcd: str, key: str) -> None:
    """A value that is not msgpack, for scrub to find (etcd's JSON gateway)."""
    body = {"key": base64.b64encode(f"/peerctl/{CLUSTER}/{key}".encode()).decode(),
            "value": base64.b64encode(b"\xc1garbled").decode()}
    urllib.request.urlopen(urllib.request.Request(
        etcd + "/v3/kv/put", json.dumps(body).encode(),
        {"Content-Type": "application/json"}), timeout=10).read()


# -- the scenario -------------------------------------------------------------------

# In order.  ``STEP COMMAND...`` runs ``peerctl --format json COMMAND`` and
# records it; in COMMAND, {spec} is SPEC, {STEP} the automation id that step
# printed, {uuid:VM} that VM's uuid.  ``= VM=HOST:STATE ...`` waits until
# vmlist shows exactly those VMs; ``! ACTION ARGS`` is one of ACTIONS.
# Placement breaks ties between equally loaded hosts at random, so the VMs
# are spread unevenly (host1 none, host2 one, host3 three) before anything
# else is placed.
SCENARIO = r"""
hostlist                    hostlist
hostlist_pattern            hostlist 'host1*'
hostlist_nomatch            hostlist 'nosuch*'
vmlist_empty                vmlist
boot_three                  boot web1 web2 db1 --resources {spec} --on host1
boot_one                    boot app1 --resources {spec} --on host2
boot_clash                  boot web1 --resources {spec} --on host1
boot_bad_spec               boot x1 --resources VCPU:x
boot_unplaceable            boot huge1 --resources VCPU:100000,MEMORY_MB:128
= web1=host1:running web2=host1:running db1=host1:running app1=host2:running
vmlist                      vmlist
vmlist_glob                 vmlist '*web*'
vmlist_patterns             vmlist 'host2/*' 'host1/db*'
vmlist_nomatch              vmlist nothing
vmlist_fields               vmlist -o name,state --sort -name
hostlist_vms                hostlist -o host,status,vms
hoststats                   hoststats
stop_dry_run                stop '*web*' --dry-run
stop_needs_yes              stop '*web*'
stop                        stop '*web*' --yes
= web1=host1:shutoff web2=host1:shutoff db1=host1:running app1=host2:running
start_one                   start host1/web1
suspend                     suspend app1
= web1=host1:running web2=host1:shutoff db1=host1:running app1=host2:paused
resume                      resume 'app*'
reboot                      reboot app1
reboot_needs_yes            reboot '*web*'
start_all                   start '*web*' --yes
= web1=host1:running web2=host1:running db1=host1:running app1=host2:running
ha_restart                  ha 'db*' restart
ha_none                     ha 'db*' none
migrate_dry_run             migrate 'web*' --to host3 --dry-run
migrate                     migrate web1 --to host3
= web1=host3:running web2=host1:running db1=host1:running app1=host2:running
migrate_nowhere             migrate web1 --to host3
migrate_nomatch             migrate nosuch
drain                       drain host3
hostlist_drained            hostlist
undrain                     undrain host3
drain_nomatch               drain 'nosuch*'
evacuate_needs_yes          evacuate host1 --to host3
evacuate                    evacuate host1 --to host3 --yes --parallel 1
= web1=host3:running web2=host3:running db1=host3:running app1=host2:running
evacuate_empty              evacuate host1
undrain_all                 undrain 'host*'
ping                        ping --rounds 2
ping_host                   ping host2
ping_nomatch                ping 'nosuch*'
ping_detach                 ping host3 --detach
wait                        wait {ping_detach}
task                        task {ping}
abort_finished              abort {ping}
tasks                       tasks
tasks_all                   tasks --all
placement_providers         placement providers
placement_providers_glob    placement providers 'host1*'
placement_providers_nomatch placement providers 'nohost*'
placement_allocations       placement allocations
placement_allocations_one   placement allocations {uuid:web1}
placement_allocations_bad   placement allocations not-a-uuid
placement_candidates        placement candidates VCPU:1,MEMORY_MB:256
placement_candidates_none   placement candidates VCPU:99
placement_candidates_bad    placement candidates VCPU:0
aside_list                  aside list
lease_create_hosts          lease create maint --hosts 1 --on host1 --start +1h --end +1d
lease_create_slots          lease create ci --resources {spec} --amount 2 --start now --end +2h --on-end keep
lease_create_clash          lease create maint --hosts 1 --start +1h --end +1d
! lease-active ci
boot_reservation            boot ci1 --resources {spec} --reservation ci
lease_list                  lease list
lease_show                  lease show ci
lease_extend                lease extend maint --end +2d
lease_calendar              lease calendar --days 3
lease_calendar_host         lease calendar host1 --days 3
lease_show_unknown          lease show nosuch
lease_delete_slots          lease delete ci
lease_delete_hosts          lease delete maint
lease_list_empty            lease list
scrub_clean                 scrub
! garble vms/host9/garbled
scrub                       scrub
scrub_delete                scrub --delete --yes
destroy_dry_run             destroy '*' --dry-run
destroy                     destroy '*' --yes
=
vmlist_after                vmlist
task_unknown                task nosuch
wait_unknown                wait nosuch
abort_unknown               abort nosuch
usage_no_command
usage_unknown_command       nosuchcommand
usage_vm_pattern            vmlist a/b/c
usage_no_resources          boot vm1
usage_rounds                ping --rounds 0
usage_timeout               wait x1 --timeout soon
usage_migrate               migrate
usage_lease                 lease create x --hosts 1
usage_format                --format yaml vmlist
etcd_unreachable            --etcd http://127.0.0.1:1 vmlist
"""
SORTED_ROWS = {"placement_allocations"}     # ordered by consumer uuid: random per run
ACTIONS = {
    "lease-active": lambda snap, etcd, lease: wait_until(
        lambda: (snap.json("lease", "show", lease) or {}).get("state") == "active",
        f"lease {lease} active"),
    "garble": lambda snap, etcd, key: put_garbled(etcd, key),
}


def play(snap: Snapshot, etcd: str) -> None:
    for line in SCENARIO.strip().splitlines():
        name, *words = shlex.split(line)
        if name == "=":
            want = dict(word.split("=") for word in words)
            wait_until(lambda: {vm["name"]: f"{vm['host']}:{vm['state']}"
                                for vm in snap.json("vmlist") or []} == want, line)
        elif name == "!":
            ACTIONS[words[0]](snap, etcd, *words[1:])
        else:
            snap.step(name, words)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="the peerctl checkout to snapshot")
    parser.add_argument("--out", required=True, help="where the snapshot goes")
    args = parser.parse_args()
    repo, out = os.path.abspath(args.repo), os.path.abspath(args.out)
    if not os.path.isfile(os.path.join(repo, "peerctl.py")):
        sys.exit(f"cli_snapshot: no peerctl.py in {repo}")
    if os.path.isdir(out) and set(os.listdir(out)) - {"help", "json"}:
        sys.exit(f"cli_snapshot: {out} holds more than a snapshot; give an empty directory")
    for part in ("help", "json"):
        shutil.rmtree(os.path.join(out, part), ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix="cli-snapshot-")
    snap, started = Snapshot(repo, out, tmp), []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("cli_snapshot: terminated"))
    try:
        snapshot_help(snap)
        etcd = start_etcd(tmp, started)
        snap.env["PEERCTL_ETCD"] = etcd
        start_peers(snap, started)
        play(snap, etcd)
    except (RuntimeError, OSError, subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        sys.exit(f"cli_snapshot: {str(exc) or 'interrupted'} (after {snap.written} files: "
                 "the snapshot is incomplete)")
    finally:
        stop(started)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"cli_snapshot: {snap.written} files written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
