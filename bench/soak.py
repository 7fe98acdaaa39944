"""Soak: a seeded stream of work and faults on a real cluster, then its
whole etcd history judged (issue 47).

    python bench/soak.py [--seeds N] [--first K] [--rounds R] [--smoke] [--keep]

Per seed, a fresh cluster: a 3-member etcd on loopback (no compaction:
etcd's own is off, and the peers run with ``etcd_history`` 0), five real
peers ``h1``..``h5`` on libvirt's test driver (one host file each, room for
many small VMs), TTL 2 s, HA margin 1.5 s, HA that never gives up on a VM.  Then ``--rounds`` rounds of a
few seconds, everything decided by ``random.Random(seed)`` before the first
one (:func:`plan`), so that a seed runs again the same way: each round boots
2-3 small VMs through the real command line (every other batch ``--ha
restart``), migrates an earlier batch, sometimes evacuates a host (undrained
a round later), backs a batch up, starts its replication or destroys one,
then injects ONE fault: SIGKILL of the newest running automation's
initiator, SIGKILL of a peer (back within its lease or past the HA
margin), SIGSTOP of a peer past its lease (then SIGCONT), or a restart of
one etcd member.  A command that fails while peers die is counted, not
judged: the history is the verdict.

At the end every peer is back, replications are stopped, and the cluster
settles (polled, bounded: every automation ended, every HA VM running on a
live host).  Then etcd's complete history of ``/peerctl/<cluster>/``, from
revision 1, goes to bench/soak_history.py.  Printed per seed: one line
(rounds, faults by kind, automations, VMs, verdict ``holds`` or ``N
violations``, seconds); on violations, each one with the whole history of
the VM it names.  At the end a summary (with each command's exit statuses);
exit 1 if any seed broke a rule or could not be run (every seed asked is
run first).

``--smoke``: 2 seeds of 5 rounds (every kind of fault).  Bad options: one
line, exit 2, nothing started.  Work under /var/tmp/peerctl-soak-*, removed
at the end with every peer and etcd member (by PID), on error and Ctrl-C
too; ``--keep`` keeps a failing seed's directory (peer logs, etcd data).
Not a test: what it finds depends on timing, which is the point.
docs/soak.md tells what each rule means and how to read a failure.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

from bench.ha import host_file  # noqa: E402  (a test-driver host with room for many VMs)
from bench.options import BadInput, positive, whole  # noqa: E402
from bench.processes import stop_processes  # noqa: E402
from bench.soak_history import Event, check, vm_history  # noqa: E402
from engine.cluster import ready_hosts  # noqa: E402
from engine.core import keys  # noqa: E402
from engine.core.etcd_server import EtcdCluster  # noqa: E402
from engine.core.store import Store  # noqa: E402
from engine.errors import PeerctlError  # noqa: E402

PEERCTL = os.path.join(ROOT, "peerctl.py")
WORK = "peerctl-soak-"          # the work directory's prefix, under /var/tmp
HOSTS = [f"h{i}" for i in range(1, 6)]
TTL = 2
MARGIN = 1.5
SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
ROUND_S = 3.0                   # a round's pace: its work, its fault, then the rest of this
COMMAND_TIMEOUT = 30.0
SETTLE_S = 75.0
SMOKE = {"seeds": 2, "rounds": 5}
FAULTS = ("kill-initiator", "kill-peer", "stop-peer", "restart-etcd")


# -- the plan: everything a seed decides ------------------------------------

@dataclass(frozen=True)
class Fault:
    kind: str                   # one of FAULTS
    host: str                   # the peer (kill-initiator: if none leads anything)
    member: int                 # restart-etcd: which member
    delay: float                # seconds before the peer or member is back


@dataclass(frozen=True)
class Round:
    number: int
    boot: list[str]
    ha: bool
    fault: Fault
    migrate: str | None = None      # a batch's pattern
    evacuate: str | None = None     # a host
    undrain: str | None = None      # the host evacuated a round ago
    backup: str | None = None
    replicate: str | None = None
    destroy: str | None = None


def plan(seed: int, rounds: int) -> list[Round]:
    """The seed's rounds: a pure function of ``seed`` and ``rounds``."""
    rng = random.Random(seed)
    planned, evacuated = [], None
    for number in range(rounds):
        earlier = [f"b{n}v*" for n in range(number)]
        evacuate = rng.choice(HOSTS) if evacuated is None and rng.random() < 0.25 else None
        planned.append(Round(
            number=number,
            boot=[f"b{number}v{i}" for i in range(rng.choice((2, 3)))],
            ha=number % 2 == 0,
            migrate=rng.choice(earlier) if earlier else None,
            evacuate=evacuate,
            undrain=evacuated,
            backup=rng.choice(earlier) if earlier and rng.random() < 0.3 else None,
            replicate=rng.choice(earlier) if earlier and rng.random() < 0.2 else None,
            destroy=rng.choice(earlier) if earlier and rng.random() < 0.15 else None,
            fault=_fault(rng)))
        evacuated = evacuate
    return planned


def _fault(rng: random.Random) -> Fault:
    kind = rng.choice(FAULTS)
    within_lease = rng.random() < 0.5
    if kind == "stop-peer":
        delay = TTL + MARGIN + rng.uniform(0.5, 3.0)            # past its lease
    elif kind == "restart-etcd":
        delay = rng.uniform(0.2, 2.0)
    elif within_lease:
        delay = rng.uniform(0.2, TTL - 0.5)
    else:
        delay = TTL + MARGIN + rng.uniform(0.5, 4.0)            # past the HA margin
    return Fault(kind, rng.choice(HOSTS), rng.randrange(3), delay)


# -- the cluster: etcd members and peers, all ours, ended by PID ------------

class Cluster:
    """One seed's cluster: its etcd members and its peers, every process
    started here and ended here, by its Popen."""

    def __init__(self, work: str, name: str):
        self.work, self.name = work, name
        self.etcd = EtcdCluster(os.path.join(work, "etcd"), 3)     # no auto-compaction
        self.peers: dict[str, subprocess.Popen] = {}
        self.stopped: set[str] = set()
        self.store: Store | None = None
        # etcd_history 0: no compactor, the checker reads every revision; HA
        # never gives up on a VM (3 restarts an hour by default): a seed
        # kills peers far more often than that, and giving up is policy,
        # not a breach.
        self.env = {**os.environ, "PEERCTL_CLUSTER": name, "PEERCTL_ETCD_HISTORY": "0",
                    "PEERCTL_HA_MAX_RESTARTS": "1000", "PYTHONUNBUFFERED": "1"}
        self.env.pop("PEERCTL_FORMAT", None)

    def start(self) -> None:
        self.etcd.start()
        self.env["PEERCTL_ETCD"] = self.etcd.urls
        self.store = Store(self.etcd.urls, self.name)
        for host in HOSTS:
            self.start_peer(host)
        if not self.wait(lambda: ready_hosts(self.store, HOSTS) == set(HOSTS), 60):
            raise RuntimeError("the peers did not all come up within 60 s")

    def start_peer(self, host: str) -> None:
        log = open(os.path.join(self.work, f"{host}.log"), "ab")
        self.peers[host] = subprocess.Popen(
            [sys.executable, PEERCTL, "peer", "--host", host,
             "--libvirt", host_file(os.path.join(self.work, f"{host}.xml")),
             "--ttl", str(TTL), "--ha-margin", str(MARGIN),
             "--state-dir", os.path.join(self.work, host)],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT,
            start_new_session=True)
        log.close()

    def signal_peer(self, host: str, signum: int) -> None:
        process = self.peers[host]
        if process.poll() is None:
            process.send_signal(signum)
        if signum == signal.SIGKILL:
            process.wait()
        (self.stopped.add if signum == signal.SIGSTOP else self.stopped.discard)(host)

    def heal(self) -> None:
        """Every peer running again, every etcd member up."""
        for host in list(self.stopped):
            self.signal_peer(host, signal.SIGCONT)
        for host, process in self.peers.items():
            if process.poll() is not None:
                self.start_peer(host)
        for member in self.etcd.members:
            if not member.running():
                member.start()

    def cli(self, *args: str) -> int:
        """Run ``peerctl ARGS``: its exit status, -1 past the timeout (the
        command is killed; an automation it started goes on)."""
        try:
            return subprocess.run([sys.executable, PEERCTL, *args], capture_output=True,
                                  env=self.env, cwd=ROOT, timeout=COMMAND_TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            return -1

    def live(self) -> set[str]:
        return {keys.suffix(kv.key, keys.host())
                for kv in self.store.range(keys.host(), keys_only=True)[0]}

    def wait(self, predicate, timeout: float) -> bool:
        """Poll ``predicate`` (etcd may be down a moment) until it holds or
        ``timeout`` passes; whether it held."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return True
            except PeerctlError:
                pass
            time.sleep(0.2)
        return False

    def close(self) -> None:
        for host in list(self.stopped):
            self.signal_peer(host, signal.SIGCONT)
        stop_processes(list(self.peers.values()))
        if self.store is not None:
            self.store.close()
        self.etcd.stop()
        for member in self.etcd.members:
            member.kill()           # one that did not stop on SIGTERM


# -- a seed's run -----------------------------------------------------------

@dataclass
class Tally:
    faults: Counter = field(default_factory=Counter)
    commands: Counter = field(default_factory=Counter)      # "boot ok", "migrate exit 1"


def run_round(cluster: Cluster, planned: Round, tally: Tally) -> None:
    started = time.monotonic()
    for command in _commands(planned):
        run_command(cluster, command, tally)
    inject(cluster, planned.fault, tally)
    cluster.heal()
    rest = ROUND_S - (time.monotonic() - started)
    if rest > 0:
        time.sleep(rest)        # the workload's pace, by design


def run_command(cluster: Cluster, command: list[str], tally: Tally) -> None:
    """Counted by its outcome, never judged: peers may be dying."""
    status = cluster.cli(*command)
    outcome = {0: "ok", -1: "timed out"}.get(status, f"exit {status}")
    what = f"{command[0]} --stop" if "--stop" in command else command[0]
    tally.commands[f"{what} {outcome}"] += 1


def _commands(planned: Round) -> list[list[str]]:
    commands = [["boot", *planned.boot, "--resources", SMALL, "--network", "none",
                 "--ha", "restart" if planned.ha else "none", "--detach"]]
    if planned.undrain:
        commands.append(["undrain", planned.undrain])
    if planned.migrate:
        commands.append(["migrate", planned.migrate, "--yes", "--detach"])
    if planned.evacuate:
        commands.append(["evacuate", planned.evacuate, "--yes", "--detach"])
    if planned.backup:
        commands.append(["backup", planned.backup, "--yes", "--detach"])
    if planned.replicate:
        commands.append(["replicate", planned.replicate, "--every", "10s"])
    if planned.destroy:
        commands.append(["destroy", planned.destroy, "--yes", "--detach"])
    return commands


def inject(cluster: Cluster, fault: Fault, tally: Tally) -> None:
    """The round's one fault; the peer or member stays down ``fault.delay``
    (the fault's timing, by design), then comes back."""
    kind, host = fault.kind, fault.host
    if kind == "kill-initiator":
        host = newest_initiator(cluster.store)
        if host is None:
            kind, host = "kill-peer", fault.host    # nothing leads anything now
    tally.faults[kind] += 1
    if kind == "restart-etcd":
        member = cluster.etcd.members[fault.member]
        member.kill()
        time.sleep(fault.delay)
        member.start()
        return
    signum = signal.SIGSTOP if kind == "stop-peer" else signal.SIGKILL
    cluster.signal_peer(host, signum)
    time.sleep(fault.delay)
    if signum == signal.SIGSTOP:
        cluster.signal_peer(host, signal.SIGCONT)
    else:
        cluster.start_peer(host)


def newest_initiator(store: Store) -> str | None:
    """The peer leading the newest running automation (its election's
    first candidate), or None."""
    try:
        running = [kv.value for kv in store.range(keys.task())[0]
                   if isinstance(kv.value, dict) and kv.value.get("state") == "running"]
        for task in sorted(running, key=lambda t: t.get("created", 0), reverse=True):
            candidates = sorted(store.range(keys.elect(task["id"]))[0],
                                key=lambda kv: kv.create_revision)
            if candidates and isinstance(candidates[0].value, str):
                return candidates[0].value
    except PeerctlError:
        pass
    return None


def settle(cluster: Cluster, replicated: list[str], drained: list[str], tally: Tally) -> bool:
    """Every peer back, replications stopped, then polled until every
    automation ended and every HA VM runs on a live host (bounded)."""
    cluster.heal()
    cluster.wait(lambda: set(HOSTS) <= cluster.live(), 30)
    for host in drained:
        run_command(cluster, ["undrain", host], tally)
    for pattern in replicated:
        run_command(cluster, ["replicate", pattern, "--stop", "--yes"], tally)
    return cluster.wait(lambda: _settled(cluster), SETTLE_S)


def _settled(cluster: Cluster) -> bool:
    store = cluster.store
    statuses = [kv.value for kv in store.range(keys.auto())[0] if kv.key.endswith("/status")]
    if any(not isinstance(s, dict) or s.get("state") not in keys.TERMINAL_STATES
           for s in statuses):
        return False
    live = cluster.live()
    for kv in store.range(keys.vm())[0]:
        record = kv.value if isinstance(kv.value, dict) else {}
        if record.get("ha") == "restart" and (record.get("state") != "running"
                                              or record.get("host") not in live):
            return False
    return True


def read_history(store: Store, timeout: float = 60.0) -> list[Event]:
    """Every put and delete under the cluster's prefix from revision 1 to
    now, in revision order; RuntimeError if etcd does not give it all."""
    until = store.revision()
    stream = store.watch_stream("", 1)
    timer = threading.Timer(timeout, stream.cancel)
    timer.start()
    events: list[Event] = []
    try:
        for batch in stream:
            events += [Event(e.kv.mod_revision, e.kind, e.kv.key,
                             e.kv.value if e.kind == "put" else None)
                       for e in batch if e.kv.mod_revision <= until]
            if batch and batch[-1].kv.mod_revision >= until:
                break
    except PeerctlError as exc:
        raise RuntimeError(f"etcd's history stopped at revision "
                           f"{events[-1].revision if events else 0} of {until}: {exc}") from None
    finally:
        timer.cancel()
        stream.cancel()
    return events


@dataclass
class SeedReport:
    seed: int
    rounds: int
    tally: Tally
    automations: int = 0
    vms: int = 0
    violations: list = field(default_factory=list)
    settled: bool = True
    seconds: float = 0.0
    error: str | None = None        # why the seed could not be run to its verdict

    @property
    def failed(self) -> bool:
        return bool(self.violations or self.error)

    def line(self) -> str:
        faults = ",".join(f"{kind}={n}" for kind, n in sorted(self.tally.faults.items()))
        verdict = (f"could not run: {self.error}" if self.error
                   else f"{len(self.violations)} violations" if self.violations else "holds")
        return (f"seed {self.seed}: {self.rounds} rounds, faults {faults or 'none'}, "
                f"{self.automations} automations, {self.vms} VMs, "
                f"{'' if self.settled else 'not settled, '}"
                f"verdict {verdict}, {self.seconds:.0f} s")


def run_seed(seed: int, rounds: int, work: str) -> tuple[SeedReport, list[Event]]:
    """One seed from a fresh cluster to its verdict; the history judged."""
    started = time.monotonic()
    planned = plan(seed, rounds)
    report = SeedReport(seed, rounds, Tally())
    cluster = Cluster(work, f"soak{seed}")
    try:
        cluster.start()
        for one in planned:
            run_round(cluster, one, report.tally)
        last = planned[-1]
        report.settled = settle(cluster, [r.replicate for r in planned if r.replicate],
                                [last.evacuate] if last.evacuate else [], report.tally)
        events = read_history(cluster.store)
    finally:
        cluster.close()
    report.violations = check(events)
    report.automations = len({e.key.split("/")[1] for e in events
                              if e.key.startswith(keys.auto()) and e.key.endswith("/spec")})
    report.vms = len({e.key.split("/")[2] for e in events if e.key.startswith(keys.vm())})
    report.seconds = time.monotonic() - started
    return report, events


def explain(report: SeedReport, events: list[Event]) -> None:
    """Each violation in one line; for the first of each rule, the whole
    story of what it names (a VM's events, a provider's, an automation's)."""
    by_rule = Counter(v.rule for v in report.violations)
    print(f"  seed {report.seed}: violations by rule: "
          + ", ".join(f"rule {rule}: {n}" for rule, n in sorted(by_rule.items())))
    told = set()
    for violation in report.violations:
        print(f"  {violation}")
        if violation.rule not in told:
            told.add(violation.rule)
            print(f"  history of {violation.name or violation.subject} "
                  f"({violation.subject}, seed {report.seed}):")
            for line in vm_history(events, violation.subject):
                print(line)
    sys.stdout.flush()


def main() -> int:
    parser = BadInput(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive, default=100, metavar="N",
                        help="how many seeds (default 100)")
    parser.add_argument("--first", type=whole(0, 10 ** 9, "seeds"), default=0, metavar="K",
                        help="the first seed (default 0)")
    parser.add_argument("--rounds", type=whole(1, 100, "rounds"), default=8, metavar="R",
                        help="rounds per seed (default 8)")
    parser.add_argument("--smoke", action="store_true", help="2 seeds of 5 rounds")
    parser.add_argument("--keep", action="store_true",
                        help="keep a failing seed's work directory")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.rounds = SMOKE["seeds"], SMOKE["rounds"]
    work = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    started, reports, kept = time.monotonic(), [], False
    print(f"soak: seeds {args.first}..{args.first + args.seeds - 1}, {args.rounds} rounds each, "
          f"{len(HOSTS)} peers (TTL {TTL} s, HA margin {MARGIN:g} s, test driver), "
          f"3 etcd members; {os.cpu_count()} CPUs", flush=True)
    try:
        for seed in range(args.first, args.first + args.seeds):
            seed_work = os.path.join(work, f"seed{seed}")
            os.makedirs(seed_work)
            try:
                report, events = run_seed(seed, args.rounds, seed_work)
            except (RuntimeError, TimeoutError, PeerctlError) as exc:
                report, events = SeedReport(seed, args.rounds, Tally(), error=str(exc)), []
            reports.append(report)
            print(report.line(), flush=True)
            if report.violations:
                explain(report, events)
            if report.failed and args.keep:
                kept = True
                print(f"  kept: {seed_work}")
            else:
                shutil.rmtree(seed_work, ignore_errors=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if not kept:
            shutil.rmtree(work, ignore_errors=True)
    summary(reports, time.monotonic() - started)
    return 1 if any(r.failed for r in reports) else 0


def summary(reports: list[SeedReport], seconds: float) -> None:
    faults, commands, rules = Counter(), Counter(), Counter()
    for report in reports:
        faults.update(report.tally.faults)
        commands.update(report.tally.commands)
        rules.update(v.rule for v in report.violations)
    failing = [r.seed for r in reports if r.failed]
    print(f"summary: {len(reports)} seeds, {sum(r.rounds for r in reports)} rounds, faults "
          + (", ".join(f"{k}={n}" for k, n in sorted(faults.items())) or "none")
          + f"; {sum(r.automations for r in reports)} automations, "
          f"{sum(r.vms for r in reports)} VMs; violations "
          + (", ".join(f"rule {k}: {n}" for k, n in sorted(rules.items())) or "none")
          + (f" (seeds {', '.join(map(str, failing))})" if failing else "")
          + f"; {seconds:.0f} s")
    print("commands: " + ", ".join(f"{k}: {n}" for k, n in sorted(commands.items())))


if __name__ == "__main__":
    sys.exit(main())
