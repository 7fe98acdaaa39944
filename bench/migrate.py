"""Migration benchmark: live moves of a real QEMU guest, peerctl against
the same libvirt call made directly.

    python bench/migrate.py [--rounds 3] [--max-downtime 100] [--smoke]

Live migration of a guest with 256 MiB of RAM and a 1 GiB disk (the
tier's busybox Linux, ``--image file://...``, ``--network none``: the
private daemons offer no network) between two private libvirtd daemons, each a machine of a rack in a box
(bench/qemu_hosts.py), with a peerctl peer on each (host1, host2):
``--rounds`` hops each way through peerctl's ``migrate`` automation
(``--max-downtime`` passed as ``migrate --max-downtime`` does), timed
from start_automation to its terminal state, AGAINST the same libvirt
migration called from this process on a second guest (same XML, same
disk layout): migrateToURI3 with the flags and params
engine/hypervisor/moves/migration.py uses (PEER2PEER|PERSIST_DEST|
UNDEFINE_SOURCE|LIVE|NON_SHARED_DISK, or NON_SHARED_INC where the
destination has the base image, destination and persistent XML,
migrate_disks, to the destination's TLS URI with VIR_MIGRATE_TLS: both over
the rack's TCP link, with TLS, as between machines), the same downtime plan (the limit set
on the domain before the call, raised by the poller per unconverged pass
as migration.downtime_limit says, never above ``--max-downtime``), the
destination volume made first at the exact virtual size, as move_prepare
makes it.  A third figure, for reference: the same direct call with
``--max-downtime`` as QEMU's only limit from the start (what both sides
did before the plan).  The hops alternate (peerctl, direct, direct at the
ceiling, ...; the two direct kinds swap order each round) so that all see
the same machine.  Per hop: total time, downtime (libvirt's, from the
destination's completed job statistics, on every side), bytes moved, copy
rate.

Targets (issue 51; issue 34's were 1.2x over UNIX sockets), medians:
peerctl's total time <= 1.1x libvirt's;
peerctl's downtime of the idle guest <= 50 ms, and <= direct libvirt's
+ 10 ms in the same run; printed beside QEMU's default ceiling (300 ms)
and Proxmox's starting value (100 ms, peerctl's default).  ``--smoke``:
one hop each way, every path.  The load average is printed: downtime
under TCG on a loaded machine is mostly the load's.

Evacuations (on the test driver) are bench/evacuate.py's.

Needs root and the QEMU tier (``bash .ci/libvirtd.sh``: libvirtd, QEMU,
the guest kernel); exits saying why when this machine cannot run it.
Everything it starts (etcd, peers, daemons, guests, volumes, tmp dirs) is
removed at the end, on error too.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

from engine.core import api, keys  # noqa: E402
from engine.operations.moves import DEFAULT_MAX_DOWNTIME_MS, max_downtime  # noqa: E402
from engine.hypervisor.moves.migration import downtime_limit  # noqa: E402

from bench.options import BadInput, positive  # noqa: E402
from bench.bulk import wait  # noqa: E402  (one polling loop for the benchmarks)

QEMU_VM = "VCPU:1,MEMORY_MB:256,DISK_GB:1"
HOSTS = ("host1", "host2")
TARGET_RATIO = 1.1        # issue 51: between machines over TCP+TLS (issue 34 had 1.2)
TARGET_DOWNTIME_MS = 50
TARGET_OVER_DIRECT_MS = 10
QEMU_DEFAULT_MS, PROXMOX_MS = 300, 100
MB = 1e6


def run(store, kind, args, timeout=1800):
    started = time.perf_counter()
    automation_id = api.start_automation(store, kind, args)
    status = wait(lambda: (lambda s: s if s and s["state"] in keys.TERMINAL_STATES else None)(
        store.get(keys.status(automation_id)).value), timeout=timeout)
    elapsed = time.perf_counter() - started
    if status["state"] != "done":
        raise SystemExit(f"{kind} ended {status['state']}: {status.get('error')} "
                         f"{json.dumps(status.get('result'))[:600]}")
    return elapsed, status["result"], automation_id


def cannot_run() -> str | None:
    from tests.support import qemu_guest
    from tests.support.libvirtd_pair import cannot_run_reason
    return qemu_guest.skip_reason() or cannot_run_reason()


def _find_key(value, key):
    """The first dict inside ``value`` (nested lists/dicts) holding ``key``."""
    if isinstance(value, dict):
        if key in value and isinstance(value.get("downtime_ms", 0), (int, float, type(None))):
            return value
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found = _find_key(item, key)
            if found is not None:
                return found
    return None


def _migrate_step(store, automation_id) -> dict:
    """move_migrate's own result (its ``seconds``: the copy alone), or {}."""
    record = api._record(store, automation_id)
    for index, entry in record.entries.items():
        response = record.responses.get(index)
        if entry.get("request") == "move_migrate" and response is not None:
            return _find_key(response.value, "seconds") or {}
    return {}


# -- the direct reference: libvirt's migrateToURI3 from this process ----------

class DirectGuest:
    """A second guest, defined by this process on host1's daemon from the
    peerctl guest's XML (no peerctl metadata: the peers leave it alone), its
    disk an overlay on the same base image as peerctl's."""

    def __init__(self, libvirt, uris, remote_uris, workdir, template_xml):
        self.libvirt, self.uris, self.workdir = libvirt, uris, workdir
        self.remote_uris = remote_uris
        self.uuid = str(uuidlib.uuid4())
        self.name = "bench-direct"
        self.at = "host1"
        self.volumes = []           # (host, path) made by this process
        root = ET.fromstring(template_xml)
        root.find("name").text = self.name
        root.find("uuid").text = self.uuid
        for metadata in root.findall("metadata"):
            root.remove(metadata)
        conn = libvirt.open(uris["host1"])
        try:
            pool = conn.storagePoolLookupByName("peerctl-host1")
            for disk in root.findall("./devices/disk"):
                source = disk.find("source")
                if disk.get("device", "disk") != "disk" or source is None \
                        or not source.get("file"):
                    continue
                vol = conn.storageVolLookupByPath(source.get("file"))
                vxml = ET.fromstring(vol.XMLDesc(0))
                backing = vxml.findtext("./backingStore/path")
                backing_fmt = vxml.find("./backingStore/format")
                new = pool.createXML(self._volume_xml(
                    f"{self.uuid}-{disk.find('target').get('dev')}.qcow2", vol.info()[1],
                    backing, backing_fmt.get("type") if backing_fmt is not None else None), 0)
                self.volumes.append(("host1", new.path()))
                source.set("file", new.path())
            for log_element in root.findall("./devices/serial/log"):
                log_element.set("file", self.console("host1"))
            self.xml = ET.tostring(root, encoding="unicode")
            dom = conn.defineXML(self.xml)
            dom.create()
        finally:
            conn.close()

    def console(self, host):
        return os.path.join(self.workdir, f"direct-console-{host}.log")

    @staticmethod
    def _volume_xml(name, capacity, backing=None, backing_fmt=None):
        from engine.hypervisor.domain.domain_xml import volume_xml
        if backing:
            return volume_xml(name, capacity, "qcow2", backing_path=backing,
                              backing_format=backing_fmt or "raw")
        return volume_xml(name, capacity, "qcow2")

    def hop(self, dest_host, max_downtime_ms: int, planned: bool = True) -> dict:
        """One live move to ``dest_host``, as move_prepare + move_migrate do
        it; ``planned`` false: ``max_downtime_ms`` is QEMU's limit from the
        start (no plan)."""
        libvirt = self.libvirt
        src = libvirt.open(self.uris[self.at])
        dst = libvirt.open(self.uris[dest_host])
        try:
            dom = src.lookupByUUIDString(self.uuid)
            root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
            pool = dst.storagePoolLookupByName(f"peerctl-{dest_host}")
            disks, incremental = [], True
            for disk in root.findall("./devices/disk"):
                source = disk.find("source")
                if disk.get("device", "disk") != "disk" or source is None \
                        or not source.get("file"):
                    continue
                vol = src.storageVolLookupByPath(source.get("file"))
                backing = ET.fromstring(vol.XMLDesc(0)).findtext("./backingStore/path")
                base = None
                if backing:
                    try:
                        base = pool.storageVolLookupByName(os.path.basename(backing))
                    except libvirt.libvirtError:
                        base = None
                name = os.path.basename(source.get("file"))
                if base is not None:
                    fmt = ET.fromstring(base.XMLDesc(0)).find("./target/format")
                    new = pool.createXML(self._volume_xml(
                        name, vol.info()[1], base.path(),
                        fmt.get("type") if fmt is not None else "raw"), 0)
                else:
                    incremental = False
                    new = pool.createXML(self._volume_xml(name, vol.info()[1]), 0)
                self.volumes.append((dest_host, new.path()))
                source.set("file", new.path())
                disks.append(disk.find("target").get("dev"))
            for log_element in root.findall("./devices/serial/log"):
                log_element.set("file", self.console(dest_host))
            xml = ET.tostring(root, encoding="unicode")
            flags = (libvirt.VIR_MIGRATE_PEER2PEER | libvirt.VIR_MIGRATE_PERSIST_DEST
                     | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE | libvirt.VIR_MIGRATE_LIVE
                     | libvirt.VIR_MIGRATE_TLS)
            if disks:
                flags |= (libvirt.VIR_MIGRATE_NON_SHARED_INC if incremental
                          else libvirt.VIR_MIGRATE_NON_SHARED_DISK)
            params = {libvirt.VIR_MIGRATE_PARAM_DEST_XML: xml,
                      libvirt.VIR_MIGRATE_PARAM_PERSIST_XML: xml}
            if disks:
                params[libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS] = disks
            # The mirror's size is only visible while the job runs: polled
            # every 0.5 s, as migration.py polls it, and so is the plan.
            limit = downtime_limit(max_downtime_ms, 0) if planned else max_downtime_ms
            seen = {"disk_total": 0, "limit": limit}
            done = threading.Event()

            def poll():
                while not done.wait(0.1 if not seen["disk_total"] else 0.5):
                    try:
                        stats = dom.jobStats(0)
                        seen["disk_total"] = max(seen["disk_total"],
                                                 stats.get("disk_total", 0))
                        raised = downtime_limit(max_downtime_ms,
                                                stats.get("memory_iteration", 0))
                        if planned and raised > seen["limit"]:
                            dom.migrateSetMaxDowntime(raised, 0)
                            seen["limit"] = raised
                    except libvirt.libvirtError:
                        continue
            poller = threading.Thread(target=poll, daemon=True)
            dom.migrateSetMaxDowntime(limit, 0)     # before the job, as peerctl
            poller.start()
            started = time.perf_counter()
            try:
                dom.migrateToURI3(self.remote_uris[dest_host], params, flags)
            finally:
                seconds = time.perf_counter() - started
                done.set()
                poller.join()
            there = dst.lookupByUUIDString(self.uuid)
            completed = there.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED
                                       | libvirt.VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED)
            # the source's volumes (libvirt undefined the domain, not its disks)
            for host, path in list(self.volumes):
                if host == self.at:
                    try:
                        src.storageVolLookupByPath(path).delete(0)
                        self.volumes.remove((host, path))
                    except libvirt.libvirtError:
                        pass
            self.at = dest_host
            memory = completed.get("memory_processed", 0)
            return {"seconds": seconds, "downtime_ms": completed.get("downtime"),
                    "bytes": memory + seen["disk_total"], "copy_seconds": seconds,
                    "incremental": incremental, "limit_ms": seen["limit"]}
        finally:
            src.close()
            dst.close()

    def destroy(self):
        libvirt = self.libvirt
        for host, uri in self.uris.items():
            try:
                conn = libvirt.open(uri)
            except libvirt.libvirtError:
                continue
            try:
                try:
                    dom = conn.lookupByUUIDString(self.uuid)
                    if dom.isActive():
                        dom.destroy()
                    if dom.isPersistent():
                        dom.undefine()
                except libvirt.libvirtError:
                    pass
                for vol_host, path in self.volumes:
                    if vol_host == host:
                        try:
                            conn.storageVolLookupByPath(path).delete(0)
                        except libvirt.libvirtError:
                            pass
            finally:
                conn.close()


# -- the hops ----------------------------------------------------------------

def bench_live(rounds: int, max_downtime_ms: int) -> dict:
    import libvirt
    from tests.support import qemu_guest
    from bench.qemu_hosts import two_qemu_hosts

    direct, peer_vm = None, None
    with two_qemu_hosts("peerctl-bmig-", "bmig") as hosts:
        store, uris, work = hosts.store, hosts.uris, hosts.work
        try:
            booted = hosts.cli_json("boot", "bench-mover", "--on", "host1", "--resources",
                                    QEMU_VM, "--image", f"file://{hosts.image}",
                                    "--network", "none")
            (peer_vm,) = booted["vms"]
            peer_vm = {**peer_vm, "host": "host1"}
            console = os.path.join(work, "state-host1", "console", f"{peer_vm['uuid']}.log")
            if not qemu_guest.wait_for_console(console, qemu_guest.READY_MARKER, 180):
                raise SystemExit(f"the peerctl guest did not come up (see {console})")
            conn = libvirt.open(uris["host1"])
            try:
                template = conn.lookupByUUIDString(peer_vm["uuid"]).XMLDesc(
                    libvirt.VIR_DOMAIN_XML_INACTIVE)
            finally:
                conn.close()
            direct = DirectGuest(libvirt, uris, hosts.remote_uris, work, template)
            if not qemu_guest.wait_for_console(direct.console("host1"), qemu_guest.READY_MARKER,
                                               180):
                raise SystemExit("the direct guest did not come up")
            print(f"both guests up (accel {qemu_guest.LINUX_ACCEL}); {rounds} hops each way",
                  flush=True)

            rows = {"peerctl": [], "direct": [], "ceiling": []}
            for i in range(2 * rounds):
                dest = HOSTS[(i + 1) % 2]
                elapsed, result, automation_id = run(store, "migrate", {
                    "vms": [{"name": "bench-mover", "uuid": peer_vm["uuid"],
                             "host": peer_vm["host"], "state": "running"}],
                    "to": dest, "parallel": 1, "max_downtime_ms": max_downtime_ms},
                    timeout=900)
                (vm,) = result["vms"]
                if vm.get("host") != dest or vm.get("mode") != "live" or vm.get("error"):
                    raise SystemExit(f"peerctl hop {i + 1} did not move live: {vm}")
                step = _migrate_step(store, automation_id)
                rows["peerctl"].append({"seconds": elapsed, "downtime_ms": vm["downtime_ms"],
                                        "bytes": vm["bytes"],
                                        "copy_seconds": step.get("seconds") or elapsed})
                peer_vm["host"] = dest
                # The direct guest goes there and back: planned, then with
                # the ceiling alone (swapped each round, for direction).
                for planned in ((True, False) if i % 2 == 0 else (False, True)):
                    there = HOSTS[(HOSTS.index(direct.at) + 1) % 2]
                    rows["direct" if planned else "ceiling"].append(
                        direct.hop(there, max_downtime_ms, planned))
                p, d, c = rows["peerctl"][-1], rows["direct"][-1], rows["ceiling"][-1]
                print(f"hop {i + 1} -> {dest}: peerctl {p['seconds']:.2f}s "
                      f"(copy {p['copy_seconds']:.2f}s) {p['downtime_ms']} ms down, "
                      f"{(p['bytes'] or 0) / MB:.0f} MB | direct {d['seconds']:.2f}s "
                      f"{d['downtime_ms']} ms down, {d['bytes'] / MB:.0f} MB"
                      f"{' (incremental)' if d['incremental'] else ''} | direct at the "
                      f"ceiling {c['downtime_ms']} ms down", flush=True)
            return rows
        finally:
            if direct is not None:
                direct.destroy()


# -- report ------------------------------------------------------------------

def median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def downtime_ms(text: str) -> int:
    """--max-downtime: as ``peerctl migrate --max-downtime`` takes it."""
    from engine.errors import UsageError
    try:
        return max_downtime(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def report(live: dict, rounds: int, max_downtime_ms: int) -> None:
    p, d = live["peerctl"], live["direct"]
    for rows in (p, d):
        for r in rows:
            r["rate"] = (r["bytes"] or 0) / MB / r["copy_seconds"] if r["copy_seconds"] else None
    print(f"\nlive migration, 256 MiB RAM + 1 GiB disk, idle guest, {len(p)} hops "
          f"({rounds} each way), medians; max downtime on both sides: planned at "
          f"{downtime_limit(max_downtime_ms, 0)} ms, doubled per pass that does not "
          f"converge, at most {max_downtime_ms} ms\n")
    print(f"{'metric':<24} | {'peerctl':>10} | {'direct libvirt':>14} | {'ratio':>6}")
    print("-" * 64)
    for label, key, scale, fmt in (("total time (s)", "seconds", 1, ".2f"),
                                   ("copy time (s)", "copy_seconds", 1, ".2f"),
                                   ("downtime (ms)", "downtime_ms", 1, ".0f"),
                                   ("data moved (MB)", "bytes", 1 / MB, ".0f"),
                                   ("copy rate (MB/s)", "rate", 1, ".0f")):
        a, b = median(p, key), median(d, key)
        ratio = f"{a / b:6.2f}" if a is not None and b else "   n/a"
        show = (lambda v: f"{v * scale:{fmt}}" if v is not None else "n/a")
        print(f"{label:<24} | {show(a):>10} | {show(b):>14} | {ratio}")
    print("\n(peerctl total: start_automation to terminal state, every step; its copy "
          "time is move_migrate's own; direct: migrateToURI3 alone; downtime: libvirt's, "
          "from the destination's completed job statistics, both sides)")

    print("\ntargets")
    a, b = median(p, "seconds"), median(d, "seconds")
    print(f"  total time: peerctl {a:.2f} s vs direct libvirt {b:.2f} s = x{a / b:.2f} "
          f"(target <= x{TARGET_RATIO}): {'PASS' if a <= TARGET_RATIO * b else 'MISS'}")
    down, down_d = median(p, "downtime_ms"), median(d, "downtime_ms")
    print(f"  downtime: peerctl {down:.0f} ms with --max-downtime {max_downtime_ms} "
          f"(QEMU's default ceiling {QEMU_DEFAULT_MS} ms, Proxmox starts at {PROXMOX_MS} ms) "
          f"(target <= {TARGET_DOWNTIME_MS} ms): "
          f"{'PASS' if down <= TARGET_DOWNTIME_MS else 'MISS'}")
    print(f"  downtime against direct: peerctl {down:.0f} ms vs direct libvirt {down_d:.0f} ms, "
          f"same run, same max downtime (target <= direct + {TARGET_OVER_DIRECT_MS} ms): "
          f"{'PASS' if down <= down_d + TARGET_OVER_DIRECT_MS else 'MISS'}")
    print(f"  (reference: direct libvirt with {max_downtime_ms} ms as QEMU's only limit from "
          f"the start, no plan: {median(live['ceiling'], 'downtime_ms'):.0f} ms, same run)")


def main() -> int:
    parser = BadInput(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive, default=3, help="hops each way")
    parser.add_argument("--max-downtime", type=downtime_ms, default=DEFAULT_MAX_DOWNTIME_MS,
                        metavar="MS", help="passed to both sides, as migrate --max-downtime "
                        f"(default {DEFAULT_MAX_DOWNTIME_MS}, peerctl's)")
    parser.add_argument("--smoke", action="store_true", help="one hop each way: every path")
    options = parser.parse_args()
    rounds = 1 if options.smoke else options.rounds
    why = cannot_run()
    if why:
        raise SystemExit(f"bench/migrate.py cannot run here: {why}")
    # SIGTERM ends the run as Ctrl-C does: through the cleanup.
    signal.signal(signal.SIGTERM, lambda _signo, _frame: sys.exit(
        "bench/migrate.py: terminated (everything it started is gone)"))
    load = os.getloadavg()
    try:
        live = bench_live(rounds, options.max_downtime)
    except KeyboardInterrupt:
        raise SystemExit("bench/migrate.py: interrupted (everything it started is gone)") \
            from None
    report(live, rounds, options.max_downtime)
    print(f"\nload average before {' '.join(f'{x:.2f}' for x in load)}, after "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
