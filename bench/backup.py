"""Backup benchmark: full and incremental backups of a real QEMU guest's disk.

    python bench/backup.py [--rounds 3] [--disk-gb 1] [--smoke]

Two private libvirtd daemons (engine.hypervisor.local.daemons.PrivateLibvirtd)
with a peerctl peer on each (host1, host2), the tier's busybox guest booted
on host1 (256 MiB of RAM, a ``--disk-gb`` disk), as bench/migrate.py sets
them up.  The guest first fills a quarter of its disk with random data
(``dd if=/dev/urandom``, past the boot filesystem; 32 MiB with --smoke), so
that a full backup moves real data.  Then, ``--rounds`` times:

1. a full backup (peerctl's ``backup`` automation with ``full``, timed from
   start_automation to its terminal state: the point in time (a pull-mode
   job), host2 reading its NBD export into its backup pool, checksumming
   on the way, the record, the job's end)
   AGAINST ``qemu-img convert -U -O qcow2`` of the same disk (the VM's pool
   volume, read while the VM runs) into a file in the same backup pool
   directory on host2.  The two alternate which goes first, round by round.
   Both rates are the disk's data (the data extents of the volume and its
   backing chain, ``qemu-img map``) over the seconds each took; the bytes
   each wrote are printed beside.  Target: peerctl >= 0.8x qemu-img's rate.
2. the guest changes 1 % of its disk (random data at an offset inside the
   filled part, flushed to the disk), and an incremental backup follows,
   timed the same way.  Target: <= 10 % of that round's full backup time.

Then, once, the first backup after a live migration
(:func:`after_a_move`): 1 % of the disk changed and an incremental backup
(the reference, no move); 1 % changed again, the VM moved live to host2
and back (peerctl's ``migrate``: host2 keeps the backups, never of a VM
it runs), and the next backup, which must be incremental (the checkpoint
crossed with the VM, twice).  Target: its bytes <= 1.2x the
reference incremental's.

Then, ``--rounds`` times (:func:`restore_rounds`), a chain of a full
backup and 3 incrementals (1 % of the disk changed before each) is
restored onto host1 as a new VM (peerctl's ``restore``: host2 checks the
chain's four volumes against their records and serves the chain over NBD,
host1 copies it into the VM's disk) AGAINST ``qemu-img convert -O qcow2``
of the chain's full backup volume into host1's pool directory, alternating
which goes first.  The restore's figure is its data steps
(``restore_export`` + ``restore_disks`` + ``restore_unexport``: the check,
the copy, the export's end), the whole automation (plan, claim, build and
start of the VM too) printed beside; rates are each copy's data over its
seconds (the data each wrote: ``qemu-img map`` of the VM's new disk, of
the converted file).  Target: >= 0.7x qemu-img's rate.

Medians over the rounds; each figure is printed beside the reference it
chases, with PASS or MISS.  ``--smoke``: one round, 32 MiB of data, the
smallest run that still takes every path.

Needs root and the QEMU tier (``bash .ci/libvirtd.sh``: libvirtd, QEMU,
the guest kernel); exits saying why when this machine cannot run it.
Everything it starts (etcd, peers and their guards, daemons, guests,
volumes, tmp dirs) is removed at the end, on error too; the processes it
ends are its own, by PID.
"""
from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

from engine.core import api, keys  # noqa: E402

from bench.options import BadInput, positive  # noqa: E402
from bench.bulk import wait  # noqa: E402  (one polling loop for the benchmarks)
from bench.migrate import cannot_run, run  # noqa: E402
from bench.qemu_hosts import two_qemu_hosts  # noqa: E402

VM_NAME = "bench-backup"
MEMORY_MB = 256
FILL_AT_MIB = 64            # past the guest's 32 MiB boot filesystem
SMOKE_FILL_MIB = 32
TARGET_RATE = 0.8           # peerctl's full backup rate over qemu-img convert's, at least
TARGET_INCREMENTAL = 0.10   # an incremental's time over the full backup's, at most
TARGET_AFTER_MOVE = 1.2     # the first backup after a live move over an incremental's bytes
TARGET_RESTORE = 0.7        # a restore's rate (full + 3 incrementals) over qemu-img's of the full
CHAIN_INCREMENTALS = 3
RESTORE_STEPS = ("restore_export", "restore_disks", "restore_unexport")
MB, MiB = 1e6, 1 << 20
BOOT_TIMEOUT = 180.0


def changed_mib(disk_gb: int) -> int:
    """1 % of the disk, at least, in whole MiB."""
    return math.ceil(disk_gb * 1024 / 100)


# -- the guest and its disk ----------------------------------------------------

class GuestShell:
    """Commands typed into the guest's shell on its serial console (the test
    guest respawns ``sh`` there), read back from the console log up to an end
    marker the typed line does not contain (as tests/support/kvm.py's
    ``shell``)."""

    def __init__(self, uri: str, uuid: str, console: str):
        self.uri, self.uuid, self.console, self.typed = uri, uuid, console, 0

    def __call__(self, command: str, timeout: float = 600.0) -> str:
        import libvirt
        self.typed += 1
        start = os.path.getsize(self.console) if os.path.exists(self.console) else 0
        end = f"BENCH-DONE-{self.typed}"

        def printed():
            with open(self.console, errors="replace") as f:
                f.seek(start)
                text = f.read()
            return text if end in text else None
        conn = libvirt.open(self.uri)
        try:
            stream = conn.newStream(0)
            conn.lookupByUUIDString(self.uuid).openConsole(None, stream,
                                                           libvirt.VIR_DOMAIN_CONSOLE_FORCE)
            stream.send(f"{command}; echo BENCH-DONE-$(({self.typed}))\n".encode())
            try:
                text = wait(printed, timeout=timeout, interval=0.2)
            except TimeoutError:
                raise SystemExit(f"the guest did not finish {command!r} in {timeout:.0f} s "
                                 f"(see {self.console})") from None
            stream.abort()
        finally:
            conn.close()
        return text[:text.rindex(end)]

    def write_random(self, at_mib: int, mib: int) -> float:
        """``mib`` MiB of random data at ``at_mib`` MiB into /dev/vda, synced;
        the seconds it took.  ``conv=fsync`` flushes the disk, so that QEMU
        writes its qcow2 metadata too: ``sync`` alone leaves the new clusters
        unmapped for a reader of the file (``qemu-img -U``) until QEMU flushes."""
        started = time.perf_counter()
        self(f"dd if=/dev/urandom of=/dev/vda bs=1M seek={at_mib} count={mib} conv=fsync "
             "2>/dev/null; sync")
        return time.perf_counter() - started


def disk_path(uri: str, uuid: str) -> str:
    """The VM's one disk: its volume's file in host1's pool."""
    import libvirt
    conn = libvirt.open(uri)
    try:
        root = ET.fromstring(conn.lookupByUUIDString(uuid).XMLDesc(0))
    finally:
        conn.close()
    files = [d.find("source").get("file") for d in root.findall("./devices/disk")
             if d.get("device", "disk") == "disk" and d.find("source") is not None]
    if len(files) != 1 or not files[0]:
        raise SystemExit(f"the guest should have one file disk, it has {files}")
    return files[0]


def data_bytes(path: str) -> int:
    """The bytes of data a reader of the disk meets: its data extents, through
    the backing chain (``qemu-img map``; zeroes and holes are not data)."""
    done = subprocess.run(["qemu-img", "map", "-U", "--output=json", path],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"qemu-img map {path} failed: {done.stderr.strip()}")
    return sum(extent["length"] for extent in json.loads(done.stdout) if extent.get("data"))


def pool_directory(uri: str, pool: str) -> str:
    import libvirt
    conn = libvirt.open(uri)
    try:
        return ET.fromstring(conn.storagePoolLookupByName(pool).XMLDesc(0)).findtext(
            "./target/path")
    finally:
        conn.close()


def qemu_img_convert(source: str, directory: str, round_no: int) -> dict:
    """The reference: the running VM's disk converted to a qcow2 file in
    ``directory``; ``{seconds, synced, bytes}`` (synced: with an fsync of
    the file after, for context; bytes: the file's data), the file removed
    once measured."""
    target = os.path.join(directory, f"bench-convert-{round_no}.qcow2")
    started = time.perf_counter()
    done = subprocess.run(["qemu-img", "convert", "-U", "-O", "qcow2", source, target],
                          capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - started
    try:
        if done.returncode != 0:
            raise SystemExit(f"qemu-img convert {source} failed: {done.stderr.strip()}")
        flushed = os.open(target, os.O_RDONLY)
        try:
            os.fsync(flushed)
        finally:
            os.close(flushed)
        return {"seconds": seconds, "synced": time.perf_counter() - started,
                "bytes": data_bytes(target)}
    finally:
        if os.path.exists(target):
            os.unlink(target)


# -- peerctl's backups -----------------------------------------------------------

def backup(store, vm: dict, full: bool) -> dict:
    """One backup of ``vm`` by the ``backup`` automation: ``{seconds, id,
    kind, bytes, reason, steps}``; any other outcome ends the benchmark."""
    seconds, result, automation_id = run(store, "backup", {"vms": [vm], "to": None,
                                                           "full": full}, timeout=1800)
    (row,) = result["vms"]
    wanted = "full" if full else "incremental"
    if row.get("error") or row.get("kind") != wanted or row.get("target") != "host2":
        raise SystemExit(f"the {wanted} backup came back otherwise: {json.dumps(row)}")
    return {"seconds": seconds, "id": row["backup"], "kind": row["kind"],
            "bytes": row["bytes"], "reason": row.get("reason"),
            "steps": step_seconds(store, automation_id)}


def backup_pool(store, uris: dict, taken: dict) -> str:
    """The directory of the pool ``taken`` was kept in, on its target."""
    from engine.core.values import readable
    import engine.backups.records  # noqa: F401  (declares backups/)
    record = readable(store.get(keys.backup(taken["id"])))
    if record is None:
        raise SystemExit(f"backup {taken['id']} has no readable record")
    return pool_directory(uris[record["target"]], record["pool"])


def step_seconds(store, automation_id: str) -> dict:
    """``{request: seconds}``: how long each step took, from its logging to
    its response (a request sent twice counts twice)."""
    record = api._record(store, automation_id)
    took: dict = {}
    for index, entry in record.entries.items():
        response = record.responses.get(index)
        if response is not None and entry.get("time") and response.value.get("time"):
            took[entry["request"]] = took.get(entry["request"], 0.0) + \
                response.value["time"] - entry["time"]
    return took


# -- the run ---------------------------------------------------------------------

def bench(rounds: int, disk_gb: int, fill_mib: int) -> tuple[list[dict], dict, list[dict]]:
    from tests.support import qemu_guest
    change_mib = changed_mib(disk_gb)
    with two_qemu_hosts("peerctl-bbak-", "bbak") as hosts:
        store, uris = hosts.store, hosts.uris
        done = hosts.cli_json("boot", VM_NAME, "--on", "host1", "--resources",
                              f"VCPU:1,MEMORY_MB:{MEMORY_MB},DISK_GB:{disk_gb}",
                              "--image", f"file://{hosts.image}", "--network", "none")
        (vm,) = done["vms"]
        vm = {"name": VM_NAME, "uuid": vm["uuid"], "host": "host1", "state": "running"}
        console = hosts.console("host1", vm["uuid"])
        if not qemu_guest.wait_for_console(console, qemu_guest.READY_MARKER, BOOT_TIMEOUT):
            raise SystemExit(f"the guest did not come up (see {console})")
        shell = GuestShell(uris["host1"], vm["uuid"], console)
        source = disk_path(uris["host1"], vm["uuid"])
        took = shell.write_random(FILL_AT_MIB, fill_mib)
        print(f"guest up (accel {qemu_guest.LINUX_ACCEL}), {disk_gb} GiB disk; it wrote "
              f"{fill_mib} MiB of random data in {took:.1f} s; {rounds} round(s), "
              f"{change_mib} MiB changed before each incremental", flush=True)

        rows = []
        for round_no in range(rounds):
            data = data_bytes(source)
            if round_no % 2 == 0:       # the pool exists once the first backup made it
                full = backup(store, vm, full=True)
                converted = qemu_img_convert(source, backup_pool(store, uris, full), round_no)
            else:
                converted = qemu_img_convert(source, backup_pool(store, uris, rows[0]["full"]),
                                             round_no)
                full = backup(store, vm, full=True)
            at = FILL_AT_MIB + (round_no * change_mib) % max(fill_mib - change_mib, 1)
            shell.write_random(at, change_mib)
            incremental = backup(store, vm, full=False)
            rows.append({"data": data, "full": full, "convert": converted,
                         "incremental": incremental})
            print(f"round {round_no + 1}: disk data {data / MB:.0f} MB | full backup "
                  f"{full['seconds']:.2f} s, {full['bytes'] / MB:.0f} MB moved | qemu-img "
                  f"convert {converted['seconds']:.2f} s, {converted['bytes'] / MB:.0f} MB "
                  f"written | incremental {incremental['seconds']:.2f} s, "
                  f"{incremental['bytes'] / MB:.1f} MB moved", flush=True)
        moved = after_a_move(store, vm, shell, change_mib, fill_mib)
        restores = restore_rounds(hosts, vm, shell, rounds, fill_mib, change_mib)
        return rows, moved, restores


def after_a_move(store, vm: dict, shell, change_mib: int, fill_mib: int) -> dict:
    """The first backup after live migrations beside an incremental without
    one, each after ``change_mib`` MiB written: ``{still, moved,
    move_seconds}`` (two :func:`backup` answers).  The VM goes to host2 and
    back: host2 keeps the backups, and a backup is never kept on the VM's
    own host (with a third host, one move would do)."""
    span = max(fill_mib - change_mib, 1)
    shell.write_random(FILL_AT_MIB + (span // 3), change_mib)
    still = backup(store, vm, full=False)
    shell.write_random(FILL_AT_MIB + (2 * span // 3), change_mib)
    there, _result, _id = run(store, "migrate", {"vms": [vm], "to": "host2"}, timeout=1800)
    back, _result, _id = run(store, "migrate", {"vms": [{**vm, "host": "host2"}],
                                                "to": "host1"}, timeout=1800)
    moved = backup(store, vm, full=False)
    print(f"after moves: incremental without a move {still['bytes'] / MB:.1f} MB | live "
          f"migrations {there:.2f} s and {back:.2f} s | the first backup after them "
          f"{moved['kind']} ({moved['reason'] or 'no reason'}), {moved['bytes'] / MB:.1f} MB",
          flush=True)
    return {"still": still, "moved": moved, "move_seconds": there + back}


def report_after_a_move(figure: dict, change_mib: int) -> None:
    still, moved = figure["still"]["bytes"], figure["moved"]["bytes"]
    share = moved / still if still else math.inf
    print(f"  first backup after a live migration (to host2 and back), {change_mib} MiB "
          "changed: "
          f"{moved / MB:.1f} MB vs an incremental's {still / MB:.1f} MB without the move = "
          f"x{share:.2f} (target <= x{TARGET_AFTER_MOVE}): "
          f"{'PASS' if share <= TARGET_AFTER_MOVE else 'MISS'}")


# -- restores ----------------------------------------------------------------------

def restore_rounds(hosts, vm: dict, shell, rounds: int, fill_mib: int,
                   change_mib: int) -> list[dict]:
    """Each round: a full backup and 3 incrementals, the newest restored
    onto host1 as a new VM beside ``qemu-img convert`` of the full backup's
    volume into host1's pool directory."""
    store, uris = hosts.store, hosts.uris
    restoring_pool = pool_directory(uris["host1"], "peerctl-host1")
    rows = []
    for round_no in range(rounds):
        chain = [backup(store, vm, full=True)]
        for step in range(CHAIN_INCREMENTALS):
            at = FILL_AT_MIB + ((round_no * CHAIN_INCREMENTALS + step) * change_mib) % \
                max(fill_mib - change_mib, 1)
            shell.write_random(at, change_mib)
            chain.append(backup(store, vm, full=False))
        full_volume = os.path.join(backup_pool(store, uris, chain[0]),
                                   _volume_of(store, chain[0]))
        if round_no % 2 == 0:
            restored = restore(hosts, chain[-1], round_no)
            converted = qemu_img_convert(full_volume, restoring_pool, round_no)
        else:
            converted = qemu_img_convert(full_volume, restoring_pool, round_no)
            restored = restore(hosts, chain[-1], round_no)
        rows.append({"restore": restored, "convert": converted,
                     "chain": sum(link["bytes"] for link in chain)})
        print(f"restore round {round_no + 1}: a full + {CHAIN_INCREMENTALS} incrementals "
              f"({rows[-1]['chain'] / MB:.0f} MB kept) | restore {restored['seconds']:.2f} s "
              f"(data steps {restored['data_seconds']:.2f} s), {restored['data'] / MB:.0f} MB "
              f"written | qemu-img convert of the full {converted['seconds']:.2f} s, "
              f"{converted['bytes'] / MB:.0f} MB written", flush=True)
    return rows


def _volume_of(store, taken: dict) -> str:
    from engine.core.values import readable
    (disk,) = readable(store.get(keys.backup(taken["id"])))["disks"]
    return disk["volume"]


def restore(hosts, newest: dict, round_no: int) -> dict:
    """``newest`` and its chain restored onto host1 as a new VM, which is
    destroyed once measured: ``{seconds, data_seconds, data, steps}``."""
    name = f"bench-restored-{round_no}"
    seconds, result, automation_id = run(hosts.store, "restore", {
        "backup": newest["id"], "name": name, "uuid": None, "on": "host1"}, timeout=1800)
    (vm,) = result["vms"]
    if vm.get("host") != "host1":
        raise SystemExit(f"the restore came back otherwise: {json.dumps(vm)}")
    steps = step_seconds(hosts.store, automation_id)
    missing = [name for name in RESTORE_STEPS if name not in steps]
    if missing:
        raise SystemExit(f"the restore took no {', '.join(missing)} step: {steps}")
    data = data_bytes(disk_path(hosts.uris["host1"], vm["uuid"]))
    hosts.cli_json("destroy", name, "--yes")
    return {"seconds": seconds, "data_seconds": sum(steps[name] for name in RESTORE_STEPS),
            "data": data, "steps": steps}


def report_restores(rows: list[dict]) -> None:
    def median(what, key):
        return statistics.median(row[what][key] for row in rows)
    data, whole = median("restore", "data"), median("restore", "seconds")
    steps = median("restore", "data_seconds")
    reference, converted = median("convert", "seconds"), median("convert", "bytes")
    rate, reference_rate = data / steps, converted / reference
    print(f"\nrestores of a full backup + {CHAIN_INCREMENTALS} incrementals, {len(rows)} "
          "round(s), medians\n")
    print(f"{'':<34} | {'seconds':>8} | {'MB of data':>10} | {'MB/s of data':>12}")
    print("-" * 74)
    print(f"{'peerctl restore, data steps':<34} | {steps:8.2f} | {data / MB:10.1f} | "
          f"{rate / MB:12.0f}")
    print(f"{'peerctl restore, whole':<34} | {whole:8.2f} | {data / MB:10.1f} | "
          f"{data / whole / MB:12.0f}   (context only)")
    print(f"{'qemu-img convert of the full':<34} | {reference:8.2f} | {converted / MB:10.1f} | "
          f"{reference_rate / MB:12.0f}")
    names = list(rows[0]["restore"]["steps"])
    print("restore's steps (s, medians): " + ", ".join(
        f"{name} {statistics.median(row['restore']['steps'].get(name, 0.0) for row in rows):.2f}"
        for name in names))
    print("(data steps: restore_export, the chain's four volumes checked against their "
          "records and served; restore_disks, the copy into the VM's disk; "
          "restore_unexport. Whole: start_automation to terminal state, the VM built and "
          "started too)")
    print("\ntarget")
    print(f"  restore of a full + {CHAIN_INCREMENTALS} incrementals: peerctl "
          f"{rate / MB:.0f} MB/s vs qemu-img convert of the full {reference_rate / MB:.0f} "
          f"MB/s, same run = x{rate / reference_rate:.2f} (target >= x{TARGET_RESTORE}): "
          f"{'PASS' if rate >= TARGET_RESTORE * reference_rate else 'MISS'}")


# -- report ------------------------------------------------------------------------

def report(rows: list[dict], disk_gb: int, fill_mib: int) -> None:
    def median(what, key):
        return statistics.median(row[what][key] for row in rows)
    data = statistics.median(row["data"] for row in rows)
    full, convert = median("full", "seconds"), median("convert", "seconds")
    incremental = median("incremental", "seconds")
    rate, reference = data / full, data / convert
    print(f"\nbackups of a {disk_gb} GiB disk holding {data / MB:.0f} MB of data "
          f"({fill_mib} MiB written by the guest), {len(rows)} round(s), medians\n")
    print(f"{'':<28} | {'seconds':>8} | {'MB moved':>9} | {'MB/s of data':>12}")
    print("-" * 66)
    for label, what in (("peerctl full backup", "full"), ("qemu-img convert", "convert"),
                        ("peerctl incremental", "incremental")):
        seconds, moved = median(what, "seconds"), median(what, "bytes")
        shown = f"{data / seconds / MB:12.0f}" if what != "incremental" else f"{'':>12}"
        print(f"{label:<28} | {seconds:8.2f} | {moved / MB:9.1f} | {shown}")
    print(f"{'qemu-img convert + fsync':<28} | {median('convert', 'synced'):8.2f} | "
          f"{'':>9} | {data / median('convert', 'synced') / MB:12.0f}   (context only)")
    print("\n(peerctl: start_automation to terminal state: the point in time, host2 "
          "pulling the NBD export into its pool and checksumming it, its writes flushed, "
          "the record, the job's end; qemu-img: the process alone, into host2's backup pool "
          "directory, its writes in the page cache)")
    for what in ("full", "incremental"):
        names = list(rows[0][what]["steps"])
        print(f"{what} backup's steps (s, medians): " + ", ".join(
            f"{name} {statistics.median(row[what]['steps'].get(name, 0.0) for row in rows):.2f}"
            for name in names))

    print("\ntargets")
    print(f"  full backup rate: peerctl {rate / MB:.0f} MB/s vs qemu-img convert "
          f"{reference / MB:.0f} MB/s of the same disk, same run = x{rate / reference:.2f} "
          f"(target >= x{TARGET_RATE}): {'PASS' if rate >= TARGET_RATE * reference else 'MISS'}")
    share = incremental / full
    print(f"  incremental after 1% of the disk changed: {incremental:.2f} s vs the full "
          f"backup's {full:.2f} s = {100 * share:.1f}% (target <= {100 * TARGET_INCREMENTAL:.0f}%)"
          f": {'PASS' if share <= TARGET_INCREMENTAL else 'MISS'}")


def main() -> int:
    parser = BadInput(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive, default=3,
                        help="full + convert + incremental rounds (medians over them)")
    parser.add_argument("--disk-gb", type=positive, default=1, help="the guest's disk size")
    parser.add_argument("--smoke", action="store_true",
                        help=f"one round, {SMOKE_FILL_MIB} MiB of data: every path, quickly")
    options = parser.parse_args()
    rounds = 1 if options.smoke else options.rounds
    fill_mib = (max(SMOKE_FILL_MIB, 2 * changed_mib(options.disk_gb)) if options.smoke
                else options.disk_gb * 1024 // 4)
    why = cannot_run()
    if why:
        raise SystemExit(f"bench/backup.py cannot run here: {why}")
    # SIGTERM ends the run as Ctrl-C does: through the cleanup.
    signal.signal(signal.SIGTERM, lambda _signo, _frame: sys.exit(
        "bench/backup.py: terminated (everything it started is gone)"))
    load = os.getloadavg()
    try:
        rows, moved, restores = bench(rounds, options.disk_gb, fill_mib)
    except KeyboardInterrupt:
        raise SystemExit("bench/backup.py: interrupted (everything it started is gone)") \
            from None
    report(rows, options.disk_gb, fill_mib)
    report_after_a_move(moved, changed_mib(options.disk_gb))
    report_restores(restores)
    print(f"\nload average before {' '.join(f'{x:.2f}' for x in load)}, after "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (figures from a loaded machine "
          "are not comparable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
