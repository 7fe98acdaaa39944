"""Replica benchmark: recovery point and restart time of HA restarts from
replicas of a real QEMU guest's disk (issue 29).

    python bench/replica.py [--kills 20] [--every 10] [--image-rounds 3] [--seed 29] [--smoke]

Two private libvirtd daemons with a peerctl peer on each (host1, host2),
as bench/qemu_hosts.py sets them up, and the tier's busybox guest (TCG,
128 MiB of RAM, a 1 GiB disk) booted with ``--ha restart`` on host1 and
replicated with ``replicate bench-replica --every <every>s``.  The guest
keeps writing: 1 MiB of random data every second into its disk (past its
boot filesystem, a region that wraps after twice the interval), so that
every update has something to copy.  Then ``--kills`` times:

- once a replica update made on the other host after the last restart is
  incremental, the bench waits for the next update to land and kills at a
  random moment of the interval after it (``random.Random(--seed)``): the
  VM's host's peer is SIGKILLed, its guard fences the guest, and peerctl's
  HA restarts the VM on the replica's host from its replica;
- **recovery point**: the kill's time minus the restarted VM's
  ``recovered.data_as_of`` (vmlist), i.e. how old the data it came back
  with was at the kill (the replica record read just before the kill is
  printed beside, and the same age counted to the moment the guard fenced
  the guest, which outlived its peer by about a second: a dead host's
  guests die with it, a dead peer's write until fenced).  Target: at most
  the interval + 5 s, over every kill;
- **restart time**: from the SIGKILL to the restarted guest's ready marker
  on its console (libvirt's running state is printed beside);
- the killed peer is started again, its stale copy goes aside, and
  replication now runs the other way, so the kills alternate hosts;
- **the update back** (issue 53): the first replica update to the host
  that came back, which starts from the disk it kept aside: its bytes
  against what the guest wrote since the point in time of the replica it
  restarted from (on the old host until it was fenced, its last second
  extrapolated from its rate when the sampler was late, on the new one
  until the update's point in time).  Target: at most x1.1.  The bench deletes
  the disks kept aside after it (``aside delete``).

After the kills, one **move onto the replica's host** (``migrate --to``,
the hand-off of ``engine/hypervisor/moves/handoff.py``), and the first update
back to the host it left: bytes against what the guest wrote since the
hand-off's update (no target).

AGAINST, in the same run: ``--image-rounds`` HA restarts of a second
guest booted ``--ha restart`` with no replication on the host the first
one is not on, timed the same way (SIGKILL of its peer to the ready marker
on the other host), before and after a replica kill in turn.  Target: a
restart from a replica takes at most 1.5x a restart from the image
(medians).

**Bytes per update**: each incremental update's ``replica.bytes`` (the
record) against what the guest wrote to its disk between the update's
point in time and the one before it (libvirt's block statistics of the
running guest, sampled 4 times a second and interpolated).  The ratio is
printed, with no target.

References, from their own documentation, printed beside:

- Proxmox VE storage replication (``pvesr``): asynchronous, snapshot-based,
  "the minimum replication interval is one minute", local ZFS storage only
  (https://pve.proxmox.com/wiki/Storage_Replication);
- DRBD, protocol C: synchronous ("local write operations on the primary
  node are considered completed only after both the local and the remote
  disk write(s) have been confirmed"): recovery point 0, at the price of a
  write's latency and a kernel module (LINBIT, DRBD 9 User's Guide,
  "Replication protocols", https://linbit.com/drbd-user-guide/drbd-guide-9_0-en/).

``--smoke``: 2 kills, 1 image restart: every path, in a few minutes.
Needs root and the QEMU tier (``bash .ci/libvirtd.sh``); exits saying why
when this machine cannot run it.  Everything it starts (etcd, peers and
their guards, daemons, guests, volumes, tmp dirs) is removed at the end,
on error too; the processes it ends are its own, by PID.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import signal
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

from engine.core import api  # noqa: E402

from bench.options import BadInput, positive  # noqa: E402
from bench.backup import GuestShell  # noqa: E402
from bench.bulk import wait  # noqa: E402  (one polling loop for the benchmarks)
from bench.migrate import cannot_run  # noqa: E402
from bench.qemu_hosts import HOSTS, two_qemu_hosts  # noqa: E402

VM_NAME, IMAGE_VM = "bench-replica", "bench-image"
RESOURCES = "VCPU:1,MEMORY_MB:128,DISK_GB:1"
MIN_EVERY = 10.0            # engine.backups.replicas.MIN_EVERY: replicas' shortest interval
SLACK_S = 5.0               # recovery point target: at most the interval + this
TARGET_RESTART = 1.5        # restart from a replica over restart from the image, at most
TARGET_BACK = 1.1           # bytes of the update back over bytes the guest wrote, at most
WRITE_AT_MIB = 64           # past the guest's 32 MiB boot filesystem
PROXMOX_MIN_EVERY_S = 60.0
MB = 1e6
BOOT_TIMEOUT = 180.0
STEP_TIMEOUT = 240.0
SMOKE = {"kills": 2, "image_rounds": 1}


def interval(text: str) -> float:
    try:
        value = float(text[:-1] if text.endswith("s") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= MIN_EVERY or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is less than {MIN_EVERY:g} s, "
                                         "replicas' shortest interval")
    return value


def region_mib(every: float) -> int:
    """The guest writes 1 MiB a second into a region this big, wrapping: two
    intervals, so that no update sees a block written twice."""
    return min(max(64, 2 * math.ceil(every)), 896)


# -- what runs where ---------------------------------------------------------------

class Hypervisors:
    """One connection to each host's daemon, for this thread."""

    def __init__(self, uris: dict):
        import libvirt
        self.libvirt = libvirt
        self.conns = {host: libvirt.open(uri) for host, uri in uris.items()}

    def domain(self, host: str, uuid: str):
        try:
            return self.conns[host].lookupByUUIDString(uuid)
        except self.libvirt.libvirtError:
            return None

    def running_on(self, uuid: str) -> str | None:
        for host in self.conns:
            dom = self.domain(host, uuid)
            try:
                if dom is not None and dom.state()[0] == self.libvirt.VIR_DOMAIN_RUNNING:
                    return host
            except self.libvirt.libvirtError:
                pass
        return None

    def close(self):
        for conn in self.conns.values():
            conn.close()


class Sampler(threading.Thread):
    """Four times a second: the replica record of the VM (each update it
    shows, by host and seq) and the bytes the running guest has written
    (``blockStats``), per incarnation (host, domain id)."""

    def __init__(self, store, uris: dict, uuid: str):
        super().__init__(daemon=True)
        self.store, self.uris, self.uuid = store, uris, uuid
        self.updates: dict = {}         # (host, seq) -> {time, kind, bytes, seen}
        self.writes: list = []          # (time, host, domain id, bytes written)
        self.stopping = threading.Event()
        self.error = None

    def run(self):
        from engine.backups import replicas
        hypervisors = Hypervisors(self.uris)
        try:
            while not self.stopping.wait(0.25):
                record = replicas.read(self.store, self.uuid) or {}
                replica = record.get("replica")
                if replica and (replica["host"], replica["seq"]) not in self.updates:
                    self.updates[(replica["host"], replica["seq"])] = {
                        "time": replica["time"], "kind": replica.get("kind"),
                        "bytes": replica.get("bytes") or 0, "seen": time.time()}
                host = hypervisors.running_on(self.uuid)
                if host is not None:
                    dom = hypervisors.domain(host, self.uuid)
                    try:
                        written = dom.blockStats("vda")[3]
                        self.writes.append((time.time(), host, dom.ID(), written))
                    except hypervisors.libvirt.libvirtError:
                        pass
        except Exception as exc:        # noqa: BLE001  (reported by the main thread)
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            hypervisors.close()

    def written_at(self, moment: float):
        """``(incarnation, bytes written)`` by the guest at ``moment``,
        interpolated between two samples of one incarnation; None when
        none brackets it."""
        samples = self.writes
        for before, after in zip(samples, samples[1:]):
            if before[0] <= moment <= after[0] and before[1:3] == after[1:3]:
                share = (moment - before[0]) / max(after[0] - before[0], 1e-9)
                return before[1:3], before[3] + share * (after[3] - before[3])
        return None

    def written_between(self, start: float, end: float, fenced: float | None = None) -> float:
        """Bytes the guest wrote from ``start`` to ``end``, over every
        incarnation (a copy that began after ``start`` counts from its boot:
        its counter starts at 0).  A copy that ended before ``end`` wrote
        until ``fenced``, when its guard stopped it: from its last sample to
        then (the sampler is late on a loaded machine), at its rate over the
        2 s before."""
        total, rows = 0.0, {}
        for sample in self.writes:
            rows.setdefault(sample[1:3], []).append(sample)
        for samples in rows.values():
            if samples[-1][0] < start or samples[0][0] > end:
                continue
            first = 0.0 if samples[0][0] >= start else self._at(samples, start)
            last = samples[-1][3] if samples[-1][0] <= end else self._at(samples, end)
            if fenced is not None and samples[-1][0] < min(fenced, end):
                recent = [s for s in samples if s[0] >= samples[-1][0] - 2.0]
                span = recent[-1][0] - recent[0][0]
                if span > 0:
                    rate = (recent[-1][3] - recent[0][3]) / span
                    last += rate * (min(fenced, end) - samples[-1][0])
            total += last - first
        return total

    @staticmethod
    def _at(samples, moment: float) -> float:
        for before, after in zip(samples, samples[1:]):
            if before[0] <= moment <= after[0]:
                share = (moment - before[0]) / max(after[0] - before[0], 1e-9)
                return before[3] + share * (after[3] - before[3])
        return samples[-1][3]

    def incrementals(self) -> list[dict]:
        """Each incremental update with the bytes the guest wrote since the
        update before it on the same host (both in one incarnation)."""
        rows, ordered = [], sorted(self.updates.items(), key=lambda kv: kv[1]["time"])
        for (prev_key, prev), (key, update) in zip(ordered, ordered[1:]):
            if update["kind"] != "incremental" or prev_key[0] != key[0]:
                continue
            start, end = self.written_at(prev["time"]), self.written_at(update["time"])
            if start is None or end is None or start[0] != end[0]:
                continue
            rows.append({"seq": key[1], "bytes": update["bytes"], "written": end[1] - start[1],
                         "apart": update["time"] - prev["time"]})
        return rows


def ready_at(console: str, timeout: float) -> float:
    """When the guest's ready marker shows in ``console`` (a file started
    afresh by this boot), polled every 50 ms."""
    from tests.support.qemu_guest import READY_MARKER

    def seen():
        try:
            with open(console, errors="replace") as f:
                return time.time() if READY_MARKER in f.read() else None
        except FileNotFoundError:
            return None
    try:
        return wait(seen, timeout=timeout, interval=0.05)
    except TimeoutError:
        raise SystemExit(f"the guest did not come up in {timeout:.0f} s (see {console})") \
            from None


def forget_console(hosts, hypervisors, host: str, uuid: str) -> str:
    """The console log ``uuid`` will have on ``host``, removed first when it
    is a former copy's (the domain is not there): so that the ready marker
    found in it is the next boot's."""
    path = hosts.console(host, uuid)
    if hypervisors.domain(host, uuid) is None and os.path.exists(path):
        os.unlink(path)
    return path


def start_writing(hosts, host: str, uuid: str, every: float) -> None:
    """The guest's loop: 1 MiB of random data a second, synced, at the next
    MiB of its region (64 KiB blocks)."""
    region = region_mib(every)
    shell = GuestShell(hosts.uris[host], uuid, hosts.console(host, uuid))
    shell(f"(i=0; while true; do dd if=/dev/urandom of=/dev/vda bs=64k "
          f"seek=$(( {WRITE_AT_MIB * 16} + (i % {region}) * 16 )) count=16 conv=fsync; "
          f"i=$((i+1)); sleep 1; done) </dev/null >/dev/null 2>&1 & true", timeout=60)


def other(host: str) -> str:
    return HOSTS[1 - HOSTS.index(host)]


def kill_and_time(hosts, hypervisors, host: str, uuid: str) -> dict:
    """SIGKILL ``host``'s peer; ``{kill, fenced, running, ready}``: when,
    and seconds after it, the guest stopped running on ``host`` (its guard
    fenced it), ran on the other host, and showed its ready marker there."""
    there = other(host)
    console = forget_console(hosts, hypervisors, there, uuid)
    seen: dict = {}

    def runs(where):
        dom = hypervisors.domain(where, uuid)
        try:
            return dom is not None and dom.state()[0] == hypervisors.libvirt.VIR_DOMAIN_RUNNING
        except hypervisors.libvirt.libvirtError:
            return False

    def restarted():
        now = time.time()
        if "fenced" not in seen and not runs(host):
            seen["fenced"] = now
        if "running" not in seen and runs(there):
            seen["running"] = now
        return len(seen) == 2
    killed = time.time()
    hosts.kill(host)
    try:
        wait(restarted, timeout=STEP_TIMEOUT, interval=0.05)
    except TimeoutError:
        raise SystemExit(f"the VM {uuid} was not restarted on {there} within "
                         f"{STEP_TIMEOUT:.0f} s of {host}'s kill ({seen})") from None
    if seen["running"] < seen["fenced"]:
        raise SystemExit(f"the VM {uuid} ran on {there} {seen['fenced'] - seen['running']:.2f}"
                         f" s before its copy on {host} was fenced")
    ready = ready_at(console, BOOT_TIMEOUT)
    return {"kill": killed, "fenced": seen["fenced"] - killed,
            "running": seen["running"] - killed, "ready": ready - killed}


def bring_back(hosts, hypervisors, host: str, uuids: list[str], before_delete=None) -> None:
    """``host``'s peer started again; its stale copies undefined and their
    disks, kept aside, deleted (after ``before_delete()``, if given)."""
    hosts.start_peer(host)
    try:
        wait(lambda: host in api.live_hosts(hosts.store), timeout=60, interval=0.2)
        wait(lambda: all(hypervisors.domain(host, uuid) is None for uuid in uuids),
             timeout=STEP_TIMEOUT, interval=0.2)
    except TimeoutError:
        raise SystemExit(f"{host} came back but kept its stale copy of {uuids}") from None
    if before_delete is not None:
        before_delete()
    if hosts.cli_json("aside", "list", host):
        done = hosts.cli_json("aside", "delete", f"{host}/*", "--yes", timeout=STEP_TIMEOUT)
        if done.get("state") != "done":
            raise SystemExit(f"aside delete on {host} ended {done.get('state')}: {done}")


def listed(hosts, name: str) -> dict:
    (vm,) = [v for v in hosts.cli_json("vmlist") if v["name"] == name]
    return vm


# -- the two kinds of restart ---------------------------------------------------------

def next_incremental(sampler, host: str, timeout: float) -> float:
    """When an incremental update to ``host`` that is newer than every
    update seen so far was seen: the anchor of the next kill."""
    known = set(sampler.updates)

    def landed():
        fresh = [u for k, u in list(sampler.updates.items())
                 if k not in known and k[0] == host and u["kind"] == "incremental"]
        return fresh[0]["seen"] if fresh else None
    try:
        return wait(landed, timeout=timeout, interval=0.05)
    except TimeoutError:
        raise SystemExit(f"no incremental replica update to {host} in {timeout:.0f} s; "
                         f"updates seen: {sorted(sampler.updates)}") from None


def replica_kill(hosts, hypervisors, sampler, vm: dict, every: float, rng) -> dict:
    """One kill of the replicated VM's host at a random moment of the
    interval after an incremental update landed; the VM's figures."""
    from engine.backups import replicas
    host, there = vm["host"], other(vm["host"])
    anchor = next_incremental(sampler, there, 6 * every + STEP_TIMEOUT)
    phase = rng.uniform(0, every)
    time.sleep(max(0.0, anchor + phase - time.time()))      # the chosen moment, not a sync
    before = (replicas.read(hosts.store, vm["uuid"]) or {}).get("replica") or {}
    timed = kill_and_time(hosts, hypervisors, host, vm["uuid"])
    row = listed(hosts, VM_NAME)
    recovered = row.get("recovered") or {}
    if (row["host"], recovered.get("from")) != (there, host) or \
            recovered.get("data_as_of") is None:
        raise SystemExit(f"the VM came back otherwise than from its replica on {there}: {row}")
    vm["host"] = there
    start_writing(hosts, there, vm["uuid"], every)
    reverse = {}

    def reverse_update():       # while host's stale disk is still kept aside
        reverse.update(update_back(sampler, host, timed["kill"], recovered["data_as_of"],
                                   every, timed["kill"] + timed["fenced"]))
    bring_back(hosts, hypervisors, host, [vm["uuid"]], reverse_update)
    return {**timed, "from": host, "to": there, "phase": phase, "reverse": reverse,
            "point": timed["kill"] - recovered["data_as_of"],
            "to_fence": timed["kill"] + timed["fenced"] - recovered["data_as_of"],
            "before": timed["kill"] - before["time"] if before.get("time") else None,
            "kind_before": before.get("kind")}


def update_back(sampler, host: str, since: float, as_of: float, every: float,
                fenced: float | None = None) -> dict:
    """The first replica update to ``host`` seen after ``since`` (the
    replica going back to the host the VM left): its kind and bytes, and
    the bytes the guest wrote from ``as_of`` (the point in time of the copy
    the VM now runs from) to the update's point in time, on both hosts."""
    def landed():
        fresh = [(k, u) for k, u in list(sampler.updates.items())
                 if k[0] == host and u["seen"] > since]
        return min(fresh, key=lambda kv: kv[1]["time"]) if fresh else None
    try:
        (_, seq), update = wait(landed, timeout=6 * every + STEP_TIMEOUT, interval=0.1)
    except TimeoutError:
        raise SystemExit(f"no replica update back to {host} in time; updates seen: "
                         f"{sorted(sampler.updates)}") from None
    return {"seq": seq, "kind": update["kind"], "bytes": update["bytes"],
            "written": sampler.written_between(as_of, update["time"], fenced),
            "after": update["time"] - since}


def move_round(hosts, sampler, vm: dict, every: float) -> dict:
    """A live move onto the replica's host, once an incremental update
    landed there; then the first update back to the host it left."""
    from engine.backups import replicas
    host, there = vm["host"], other(vm["host"])
    next_incremental(sampler, there, 6 * every + STEP_TIMEOUT)
    started = time.time()
    moved = hosts.cli_json("migrate", VM_NAME, "--to", there, "--yes", timeout=STEP_TIMEOUT)
    (row,) = moved["vms"]
    if (moved.get("state"), row.get("host")) != ("done", there):
        raise SystemExit(f"the move onto {there} ended otherwise: {moved}")
    vm["host"] = there
    consumed = (replicas.read(hosts.store, vm["uuid"]) or {}).get("consumed") or {}
    # the guest's writing loop moved with it: it goes on writing
    back = update_back(sampler, host, started, consumed.get("time") or started, every)
    return {"from": host, "to": there, "via_replica": (row.get("via_replica") or {}).get("used"),
            "disk_bytes": row.get("disk_bytes"), **back}


def image_restart(hosts, hypervisors, avoid: str, round_no: int) -> dict:
    """A fresh VM with ``--ha restart`` and no replica on the host that is
    not ``avoid``; its host's peer killed, its restart from the image timed,
    then the VM destroyed."""
    from tests.support.qemu_guest import READY_MARKER, wait_for_console
    host = other(avoid)
    name = f"{IMAGE_VM}-{round_no}"
    booted = hosts.cli_json("boot", name, "--on", host, "--resources", RESOURCES,
                            "--image", f"file://{hosts.image}", "--network", "none",
                            "--ha", "restart", timeout=BOOT_TIMEOUT)
    (vm,) = booted["vms"]
    if not wait_for_console(hosts.console(host, vm["uuid"]), READY_MARKER, BOOT_TIMEOUT):
        raise SystemExit(f"{name} did not come up on {host}")
    timed = kill_and_time(hosts, hypervisors, host, vm["uuid"])
    row = listed(hosts, name)
    if (row["host"], (row.get("recovered") or {}).get("from")) != (avoid, host):
        raise SystemExit(f"{name} came back otherwise than on {avoid}: {row}")
    bring_back(hosts, hypervisors, host, [vm["uuid"]])
    hosts.cli_json("destroy", name, "--yes", timeout=STEP_TIMEOUT)
    return {**timed, "from": host, "to": avoid}


# -- the run -----------------------------------------------------------------------------

def bench(kills: int, every: float, image_rounds: int, seed: int) -> dict:
    from tests.support.qemu_guest import LINUX_ACCEL, READY_MARKER, wait_for_console
    rng = random.Random(seed)
    with two_qemu_hosts("peerctl-brep-", "brep", peer_env={"PEERCTL_HA_RETRY": "2"}) as hosts:
        hypervisors = Hypervisors(hosts.uris)
        sampler = None
        try:
            booted = hosts.cli_json("boot", VM_NAME, "--on", "host1", "--resources", RESOURCES,
                                    "--image", f"file://{hosts.image}", "--network", "none",
                                    "--ha", "restart", timeout=BOOT_TIMEOUT)
            vm = {"uuid": booted["vms"][0]["uuid"], "host": "host1"}
            if not wait_for_console(hosts.console("host1", vm["uuid"]), READY_MARKER,
                                    BOOT_TIMEOUT):
                raise SystemExit("the guest did not come up on host1")
            sampler = Sampler(hosts.store, hosts.uris, vm["uuid"])
            sampler.start()
            start_writing(hosts, "host1", vm["uuid"], every)
            hosts.cli_json("replicate", VM_NAME, "--every", f"{every:g}s")
            print(f"guest up (accel {LINUX_ACCEL}), writing 1 MiB/s into a "
                  f"{region_mib(every)} MiB region; replicated every {every:g} s; {kills} "
                  f"kill(s), {image_rounds} restart(s) from the image, seed {seed}", flush=True)
            rows, images = [], []

            def from_image():
                images.append(image_restart(hosts, hypervisors, vm["host"], len(images) + 1))
                print_image(images[-1], len(images))
            # Image round j goes with kill j * kills // image_rounds: before it for
            # even j, after it for odd j, so that both kinds see the run's whole span.
            paired = {j * kills // image_rounds: j for j in range(image_rounds)}
            for kill_no in range(kills):
                if kill_no in paired and paired[kill_no] % 2 == 0:
                    from_image()
                rows.append(replica_kill(hosts, hypervisors, sampler, vm, every, rng))
                print_kill(rows[-1], kill_no + 1)
                if kill_no in paired and paired[kill_no] % 2 == 1:
                    from_image()
                if sampler.error:
                    raise SystemExit(f"the sampler failed: {sampler.error}")
            while len(images) < image_rounds:       # more image rounds than kills
                from_image()
            move = move_round(hosts, sampler, vm, every)
            print_move(move)
            sampler.stopping.set()
            sampler.join(10)
            return {"kills": rows, "images": images, "updates": sampler.incrementals(),
                    "all_updates": dict(sampler.updates), "move": move}
        finally:
            if sampler is not None:
                sampler.stopping.set()
                sampler.join(10)
            hypervisors.close()


def print_kill(row: dict, number: int) -> None:
    before = f"{row['before']:.1f} s ({row['kind_before']})" if row["before"] is not None \
        else "none"
    print(f"kill {number}: {row['from']} -> {row['to']} at {row['phase']:.1f} s into the "
          f"interval | recovery point {row['point']:.1f} s (replica read just before: "
          f"{before}; to the fence {row['to_fence']:.1f} s) | fenced {row['fenced']:.1f} s, "
          f"running {row['running']:.1f} s, ready {row['ready']:.1f} s | "
          f"{print_back(row['reverse'])}", flush=True)


def print_back(back: dict) -> str:
    ratio = f"x{back['bytes'] / back['written']:.2f}" if back["written"] else "n/a"
    return (f"update {back['seq']} back: {back['kind']}, {back['bytes'] / MB:.1f} MB sent for "
            f"{back['written'] / MB:.1f} MB the guest wrote since its copy's point in time "
            f"= {ratio}")


def print_move(row: dict) -> None:
    print(f"move {row['from']} -> {row['to']} (onto the replica: {row['via_replica']}, "
          f"{(row['disk_bytes'] or 0) / MB:.1f} MB of disk crossed) | {print_back(row)}",
          flush=True)


def print_image(row: dict, number: int) -> None:
    print(f"image restart {number}: {row['from']} -> {row['to']} | fenced "
          f"{row['fenced']:.1f} s, running {row['running']:.1f} s, ready {row['ready']:.1f} s",
          flush=True)


# -- report ---------------------------------------------------------------------------

def report(result: dict, every: float, seed: int) -> None:
    kills, images, updates = result["kills"], result["images"], result["updates"]
    points = [row["point"] for row in kills]
    from_replica = statistics.median(row["ready"] for row in kills)
    from_image = statistics.median(row["ready"] for row in images)
    print(f"\nHA restarts from replicas: {len(kills)} kill(s) at a random moment of the "
          f"{every:g} s interval (seed {seed}), {len(images)} restart(s) from the image\n")
    print(f"{'':<34} | {'median':>8} | {'max':>8} | {'min':>8}")
    print("-" * 68)
    for label, values in (
            ("recovery point (s)", points),
            ("  counted to the guard's fence (s)", [r["to_fence"] for r in kills]),
            ("guest fenced after the kill (s)", [r["fenced"] for r in kills + images]),
            ("restart from replica, ready (s)", [r["ready"] for r in kills]),
            ("restart from replica, running (s)", [r["running"] for r in kills]),
            ("restart from image, ready (s)", [r["ready"] for r in images]),
            ("restart from image, running (s)", [r["running"] for r in images])):
        print(f"{label:<34} | {statistics.median(values):8.1f} | {max(values):8.1f} | "
              f"{min(values):8.1f}")
    print("\n(recovery point: SIGKILL of the VM's host's peer minus the restarted VM's "
          "recovered.data_as_of, the point in time of the replica it came back with; a "
          "host that dies takes its guests with it, but here the guest lived until its "
          "guard fenced it, so the data it wrote meanwhile is lost too: 'counted to the "
          "fence'; "
          "restart: SIGKILL to the guest's ready marker on the other host's console)")

    kinds = [u["kind"] for u in result["all_updates"].values()]
    ordered = sorted(result["all_updates"].items(), key=lambda kv: kv[1]["time"])
    gaps = [b["time"] - a["time"] for (ka, a), (kb, b) in zip(ordered, ordered[1:])
            if ka[0] == kb[0] and b["kind"] == "incremental"]
    spacing = f"{statistics.median(gaps):.1f} s" if gaps else "n/a"
    print(f"\nreplica updates seen: {len(kinds)} ({kinds.count('full')} full, "
          f"{kinds.count('incremental')} incremental); an incremental's point in time "
          f"came {spacing} after its parent's (median); the guest wrote 1 MiB/s")
    if updates:
        moved = sum(u["bytes"] for u in updates)
        written = sum(u["written"] for u in updates)
        ratios = [u["bytes"] / u["written"] for u in updates if u["written"] > 0]
        per = statistics.median(u["bytes"] for u in updates)
        wrote = statistics.median(u["written"] for u in updates)
        apart = statistics.median(u["apart"] for u in updates)
        ratio = f"x{moved / written:.2f}" if written else "n/a"
        median_ratio = f"x{statistics.median(ratios):.2f}" if ratios else "n/a"
    else:
        ratio = median_ratio = "n/a"

    print("\ntargets")
    worst = max(points)
    print(f"  recovery point: median {statistics.median(points):.1f} s, max {worst:.1f} s "
          f"over {len(points)} kill(s) (target <= {every + SLACK_S:g} s, the interval + "
          f"{SLACK_S:g} s): {'PASS' if worst <= every + SLACK_S else 'MISS'}")
    share = from_replica / from_image
    print(f"  restart from a replica: {from_replica:.1f} s vs from the image "
          f"{from_image:.1f} s, same run = x{share:.2f} (target <= x{TARGET_RESTART}): "
          f"{'PASS' if share <= TARGET_RESTART else 'MISS'}")
    if updates:
        print(f"  bytes per update: incrementals moved {per / MB:.1f} MB (median) for "
              f"{wrote / MB:.1f} MB the guest wrote in {apart:.1f} s; over "
              f"{len(updates)} update(s) {moved / MB:.1f} MB for {written / MB:.1f} MB = "
              f"{ratio} (median per update {median_ratio}; no target)")
    else:
        print("  bytes per update: no incremental update with the guest's writes around "
              "it was seen: n/a (no target)")
    backs = [row["reverse"] for row in kills]
    sent, wrote = sum(b["bytes"] for b in backs), sum(b["written"] for b in backs)
    worst = max((b["bytes"] / b["written"] for b in backs if b["written"]), default=math.inf)
    kinds = sorted({b["kind"] for b in backs})
    print(f"  replica update after an HA restart from the replica: {sent / MB:.1f} MB sent "
          f"for {wrote / MB:.1f} MB the guest wrote since the replica's last update, over "
          f"{len(backs)} restart(s) ({', '.join(kinds)}); worst x{worst:.2f} (target <= "
          f"x{TARGET_BACK}): {'PASS' if worst <= TARGET_BACK else 'MISS'}")
    move = result["move"]
    print(f"  replica update after a move onto the replica's host: {move['kind']}, "
          f"{move['bytes'] / MB:.1f} MB sent for {move['written'] / MB:.1f} MB the guest "
          f"wrote since the hand-off's update (no target)")
    print("\nreferences (their own documentation)")
    print(f"  Proxmox VE storage replication: every {PROXMOX_MIN_EVERY_S:.0f} s at the "
          f"shortest, so a recovery point up to ~{PROXMOX_MIN_EVERY_S:.0f} s + a transfer; "
          "ZFS only (pve.proxmox.com/wiki/Storage_Replication)")
    print("  Proxmox VE after a migration: the replication job is switched to run from the "
          "new node back to the old one, and sends only what changed since their last common "
          "ZFS snapshot (pve-guest-common, switch_replication_job_target)")
    print("  DRBD protocol C: synchronous, recovery point 0 s, each write waits for the "
          "peer; needs the drbd kernel module (LINBIT DRBD 9 User's Guide, Replication "
          "protocols)")


def main() -> int:
    parser = BadInput(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=positive, default=20,
                        help="HA restarts from a replica (host deaths), alternating hosts")
    parser.add_argument("--every", type=interval, default=MIN_EVERY,
                        help="the replicas' interval, seconds (at least 10)")
    parser.add_argument("--image-rounds", type=positive, default=3,
                        help="HA restarts from the image, the reference, in the same run")
    parser.add_argument("--seed", type=int, default=29,
                        help="the seed of the kills' moments within the interval")
    parser.add_argument("--smoke", action="store_true",
                        help=f"{SMOKE['kills']} kills, {SMOKE['image_rounds']} restart from "
                             "the image: every path, quickly")
    options = parser.parse_args()
    kills = SMOKE["kills"] if options.smoke else options.kills
    image_rounds = SMOKE["image_rounds"] if options.smoke else options.image_rounds
    why = cannot_run()
    if why:
        raise SystemExit(f"bench/replica.py cannot run here: {why}")
    # SIGTERM ends the run as Ctrl-C does: through the cleanup.
    signal.signal(signal.SIGTERM, lambda _signo, _frame: sys.exit(
        "bench/replica.py: terminated (everything it started is gone)"))
    load = os.getloadavg()
    started = time.monotonic()
    try:
        result = bench(kills, options.every, image_rounds, options.seed)
    except KeyboardInterrupt:
        raise SystemExit("bench/replica.py: interrupted (everything it started is gone)") \
            from None
    report(result, options.every, options.seed)
    print(f"\nran {time.monotonic() - started:.0f} s; load average before "
          f"{' '.join(f'{x:.2f}' for x in load)}, after "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (figures from a loaded machine "
          "are not comparable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
