"""The real-QEMU tier's guest and hypervisor, made from Debian packages only.

The tier runs where ``.ci/libvirtd.sh`` has run (it installs libvirtd, QEMU,
qemu-img, busybox-static and the disk tools, unpacks a Debian cloud kernel
into :data:`GUEST_DIR` and starts virtlogd and libvirtd without systemd;
``.ci/run`` runs it before the tests).  The tests start nothing themselves:

- :func:`skip_reason` says why this machine cannot run the tier (no libvirtd
  answering at :data:`QEMU_URI`, no guest kernel, a missing tool), or None;
  the ``guest_dir`` fixture skips with that reason, or gives
  :data:`GUEST_DIR`.
- :func:`build_initramfs` writes a gzip'd newc cpio holding a static busybox
  and an ``/init`` that prints :data:`READY_MARKER` on the serial console and
  powers off on the ACPI power button (so ``stop`` is a real ACPI shutdown).
  The guest also has, from the modules of :data:`GUEST_MODULES` it finds in
  the guest directory (loaded in dependency order, missing ones skipped):

  * a virtio NIC: ``lo`` and ``eth0`` up, busybox ``udhcpc`` on ``eth0`` in
    the background, retrying forever; on each new lease the console gets
    ``PEERCTL-GUEST-IP <addr>`` (:data:`IP_MARKER`), and the guest pings its
    router (else the DHCP server) every 2 s, forever, so the host's ARP
    table (libvirt's ARP address source) keeps knowing it;
  * a NoCloud seed CD-ROM (IDE, ``/dev/sr0`` or the ``cidata`` label),
    mounted read-only at ``/seed``: the console gets
    ``PEERCTL-SEED instance-id=<id> hostname=<name>`` (:data:`SEED_MARKER`),
    then ``PEERCTL-SSH-KEY sha256-hex=<hex>`` (:data:`SSH_KEY_MARKER`, the
    SHA-256 of the decoded key blob, as ``seed.fingerprint_hex``) for each of
    ``public-keys``; the hostname is set, and a ``user-data`` starting with
    ``#!`` is run by ``sh``, its output on the console.  No CD-ROM: nothing
    printed, nothing fails;
  * after :data:`READY_MARKER`, an interactive busybox shell on the serial
    console (respawned): a line typed there is echoed and run.
- :func:`guest_args` gives the ``kernel``/``initrd``/``cmdline`` keys of a
  ``build`` request booting that guest directly;
- :func:`build_disk_image` puts the same kernel and initramfs on a raw,
  BIOS-bootable FAT disk (syslinux), so ``boot --image file:///...`` works
  through the image cache like any other image.

The guest's Linux needs TCG on hosts whose nested KVM runs firmware but
crawls through the kernel's early boot (this project's CI machines): pass
``accel="tcg"`` (build argument) or ``PEERCTL_QEMU_ACCEL=tcg`` (peer
environment); :data:`LINUX_ACCEL` says which this tier uses.
"""
from __future__ import annotations

import functools
import glob
import gzip
import io
import os
import shutil
import stat
import subprocess
import tempfile
import time

import pytest

# Where .ci/libvirtd.sh puts the guest kernel and modules (its default).
GUEST_DIR = os.environ.get("PEERCTL_GUEST_DIR", "/var/cache/peerctl/guest")
# The hypervisor of the tier; another URI points the tier elsewhere.
QEMU_URI = os.environ.get("PEERCTL_TEST_QEMU_URI", "qemu:///system")
READY_MARKER = "PEERCTL-GUEST-UP"
IP_MARKER = "PEERCTL-GUEST-IP"          # + " <addr>", once per new DHCP lease
SEED_MARKER = "PEERCTL-SEED"            # + " instance-id=<id> hostname=<name>"
SSH_KEY_MARKER = "PEERCTL-SSH-KEY"      # + " sha256-hex=<hex of the key blob's SHA-256>"
# What .ci/libvirtd.sh puts in the guest directory, in an order that loads:
# build_initramfs takes those present and orders them by their depends= anyway.
GUEST_MODULES = ("button", "evdev",
                 "virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev",
                 "virtio_pci", "failover", "net_failover", "virtio_net", "virtio_blk",
                 "scsi_common", "scsi_mod", "libata", "ata_piix", "cdrom", "sr_mod", "isofs")
BUSYBOX = "/bin/busybox"
CMDLINE = "console=ttyS0 loglevel=4 panic=-1"
LINUX_ACCEL = os.environ.get("PEERCTL_TEST_LINUX_ACCEL", "tcg")

__all__ = ["QEMU_URI", "GUEST_DIR", "READY_MARKER", "skip_reason", "guest_dir",
           "build_initramfs", "guest_args", "build_disk_image", "world_readable_tmpdir",
           "wait_for_console", "CMDLINE", "LINUX_ACCEL", "IP_MARKER", "SEED_MARKER",
           "SSH_KEY_MARKER", "GUEST_MODULES", "guest_modules", "remove_leftovers"]

_INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for mod in $(cat /lib/modules/order); do
    insmod "/lib/modules/$mod.ko" || echo "init: insmod $mod failed"
done
acpid
ip link set lo up

# DHCP on eth0, in the background, forever (udhcpc -A: retry after failing;
# the loop: eth0 may come later, udhcpc may die).  /etc/udhcpc.script
# configures the address and prints @IP@ on each new lease.
(
    while true; do
        if [ -e /sys/class/net/eth0 ]; then
            ip link set eth0 up
            udhcpc -f -i eth0 -s /etc/udhcpc.script -t 3 -T 2 -A 2 >/dev/null 2>&1
        fi
        sleep 2
    done
) &
# Keep the host's ARP table fresh: ping what the lease named, every 2 s.
(
    while true; do
        target=$(cat /run/peerctl-ping 2>/dev/null)
        [ -n "$target" ] && ping -c1 -W1 "$target" >/dev/null 2>&1
        sleep 2
    done
) &

# The NoCloud seed, when a CD-ROM holds one (peerctl-seed prints it again
# when typed on the console).
peerctl-seed --boot

echo "@READY@ $(uname -r)"
# An interactive shell on the serial console (cttyhack: the real tty behind
# /dev/console, as controlling terminal), respawned when it exits.
while true; do
    setsid cttyhack sh -i
    sleep 1
done
""".replace("@READY@", READY_MARKER).replace("@IP@", IP_MARKER) \
    .replace("@SEED@", SEED_MARKER).replace("@KEY@", SSH_KEY_MARKER)

# /bin/peerctl-seed: mount the NoCloud seed (once), print what it holds, and
# run a #! user-data; with --boot, also set the hostname.
_SEED_SCRIPT = r"""#!/bin/sh
seed_dev=""
[ -b /dev/sr0 ] && seed_dev=/dev/sr0
[ -n "$seed_dev" ] || seed_dev=$(findfs LABEL=cidata 2>/dev/null)
grep -q " /seed " /proc/mounts || { [ -n "$seed_dev" ] && mkdir -p /seed \
        && mount -t iso9660 -o ro "$seed_dev" /seed 2>/dev/null; }
if grep -q " /seed " /proc/mounts; then
    if [ -f /seed/meta-data ]; then
        field() { sed -n 's/^ *"'"$1"'": *"\([^"]*\)".*/\1/p' /seed/meta-data | head -n 1; }
        iid=$(field instance-id)
        name=$(field local-hostname)
        echo "@SEED@ instance-id=$iid hostname=$name"
        if [ "$1" = --boot ] && [ -n "$name" ]; then
            hostname "$name"
            echo "$name" > /etc/hostname
        fi
        awk '/"public-keys"/ { if ($0 !~ /\]/) keys = 1; next }
             keys && /^ *\]/ { keys = 0 }
             keys { sub(/^[ \t]*"/, ""); sub(/",?[ \t]*$/, ""); print }' /seed/meta-data |
        while read -r kind blob rest; do
            hex=$(printf '%s' "$blob" | base64 -d 2>/dev/null | sha256sum | cut -d' ' -f1)
            echo "@KEY@ sha256-hex=$hex"
        done
    fi
    if [ "$(head -c 2 /seed/user-data 2>/dev/null)" = "#!" ]; then
        sh /seed/user-data
    fi
fi

""".replace("@SEED@", SEED_MARKER).replace("@KEY@", SSH_KEY_MARKER)

# busybox udhcpc runs this with deconfig, bound, renew, leasefail or nak; its
# variables: interface, ip, subnet, mask (prefix length), router, serverid.
_UDHCPC_SCRIPT = r"""#!/bin/sh
lease=/run/peerctl-lease
case "$1" in
deconfig)
    ip addr flush dev "$interface" 2>/dev/null
    ip link set "$interface" up
    rm -f "$lease"
    ;;
bound|renew)
    prefix=$mask
    [ -n "$prefix" ] || prefix=$(ipcalc -s -p "$ip" "$subnet" | sed 's/.*=//')
    old=$(cat "$lease" 2>/dev/null)
    if [ "$1" = bound ] || [ "$old" != "$ip/$prefix" ]; then
        ip addr flush dev "$interface"
        ip addr add "$ip/$prefix" broadcast + dev "$interface"
        echo "$ip/$prefix" > "$lease"
        new=yes
    fi
    gateway=${router%% *}
    [ -z "$gateway" ] || ip route replace default via "$gateway" dev "$interface"
    echo "${gateway:-$serverid}" > /run/peerctl-ping
    # On a line of its own, even after the shell's prompt.
    [ -z "$new" ] || printf '\n%s\n' "@IP@ $ip" > /dev/console
    ;;
esac
exit 0
""".replace("@IP@", IP_MARKER)

_POWER_BUTTON = "#!/bin/sh\necho 'power button: powering off' > /dev/console\npoweroff -f\n"


@functools.cache
def skip_reason() -> str | None:
    """Why the real-QEMU tier cannot run here, or None when it can."""
    setup = "bash .ci/libvirtd.sh sets this machine up"
    missing = [tool for tool in ("qemu-system-x86_64", "mkfs.vfat", "mcopy", "syslinux")
               if not shutil.which(tool)]
    if not os.path.exists(BUSYBOX):
        missing.append(BUSYBOX)
    if missing:
        return f"no {', '.join(missing)} ({setup})"
    if not glob.glob(os.path.join(GUEST_DIR, "vmlinuz-*")):
        return f"no guest kernel in {GUEST_DIR} ({setup})"
    import libvirt
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)   # no stray stderr lines
    try:
        libvirt.open(QEMU_URI).close()
    except libvirt.libvirtError as exc:
        return f"no libvirtd answers at {QEMU_URI} ({setup}): {exc}"
    return None


@pytest.fixture(scope="module")
def guest_dir() -> str:
    """The guest kernel's directory; skips the test, saying why, where the
    tier cannot run."""
    why = skip_reason()
    if why is not None:
        pytest.skip(why)
    return GUEST_DIR


class _Cpio:
    """A newc cpio archive, the format the kernel unpacks as initramfs."""

    def __init__(self):
        self.out = io.BytesIO()
        self.inode = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev=(0, 0)):
        encoded = name.encode() + b"\0"
        fields = [self.inode, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1],
                  len(encoded), 0]
        self.inode += 1
        self.out.write(b"070701" + b"".join(b"%08X" % f for f in fields))
        self.out.write(encoded)
        self._pad()
        self.out.write(data)
        self._pad()

    def _pad(self):
        self.out.write(b"\0" * (-self.out.tell() % 4))

    def directory(self, name):
        self._entry(name, stat.S_IFDIR | 0o755)

    def file(self, name, data: bytes, mode=0o755):
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name, target: str):
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name, major, minor):
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return self.out.getvalue()


def build_initramfs(path: str, guest_dir: str) -> str:
    """Write the test guest's initramfs to ``path`` (world-readable)."""
    archive = _Cpio()
    for directory in ("bin", "dev", "proc", "sys", "etc", "etc/acpi", "etc/acpi/PWRF",
                      "lib", "lib/modules", "tmp", "run", "var", "var/run", "var/log",
                      "seed"):
        archive.directory(directory)
    archive.chardev("dev/console", 5, 1)
    with open(BUSYBOX, "rb") as f:
        archive.file("bin/busybox", f.read())
    archive.symlink("bin/sh", "busybox")
    archive.file("init", _INIT.encode())
    archive.file("etc/udhcpc.script", _UDHCPC_SCRIPT.encode())
    archive.file("bin/peerctl-seed", _SEED_SCRIPT.encode())
    # busybox acpid runs /etc/acpi/PWRF/00000080 on the power button.
    archive.file("etc/acpi/PWRF/00000080", _POWER_BUTTON.encode())
    modules = guest_modules(guest_dir)
    for module in modules:
        with open(os.path.join(guest_dir, f"{module}.ko"), "rb") as f:
            archive.file(f"lib/modules/{module}.ko", f.read(), 0o644)
    archive.file("lib/modules/order", "".join(f"{m}\n" for m in modules).encode(), 0o644)
    with open(path, "wb") as f:
        f.write(gzip.compress(archive.finish(), 6))
    os.chmod(path, 0o644)
    return path


def _depends(path: str) -> list[str]:
    """The ``depends=`` of a kernel module file (what ``modinfo -F depends``
    prints), without kmod."""
    with open(path, "rb") as f:
        for field in f.read().split(b"\0"):
            if field.startswith(b"depends="):
                return [d for d in field[len(b"depends="):].decode().split(",") if d]
    return []


def guest_modules(guest_dir: str) -> list[str]:
    """The modules of :data:`GUEST_MODULES` found in ``guest_dir`` (as
    ``NAME.ko``), each after those it depends on; missing ones are left out
    (built into the kernel, or a guest directory older than the module)."""
    present = {m for m in GUEST_MODULES if os.path.exists(os.path.join(guest_dir, f"{m}.ko"))}
    order: list[str] = []

    def visit(module: str, path: tuple) -> None:
        if module in order or module not in present or module in path:
            return
        for dep in _depends(os.path.join(guest_dir, f"{module}.ko")):
            visit(dep.replace("-", "_"), path + (module,))
        order.append(module)

    for module in GUEST_MODULES:
        visit(module, ())
    return order


def guest_args(guest_dir: str, workdir: str) -> dict:
    """``kernel``, ``initrd`` and ``cmdline`` for a ``build`` request."""
    kernels = sorted(glob.glob(os.path.join(guest_dir, "vmlinuz-*")))
    if not kernels:
        raise RuntimeError(f"no vmlinuz-* in {guest_dir}: run .ci/libvirtd.sh")
    initrd = build_initramfs(os.path.join(workdir, "initrd.gz"), guest_dir)
    return {"kernel": kernels[-1], "initrd": initrd, "cmdline": CMDLINE}


_SYSLINUX_CFG = f"""SERIAL 0 115200
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL /vmlinuz
  INITRD /initrd.gz
  APPEND {CMDLINE}
"""


def build_disk_image(path: str, guest_dir: str, workdir: str, size_mb: int = 32) -> str:
    """A raw disk, FAT without partition table, that SeaBIOS boots through
    syslinux into the test guest.  Made with mkfs.vfat, mcopy and syslinux's
    mtools installer: no loop device, no mount."""
    args = guest_args(guest_dir, workdir)
    config = os.path.join(workdir, "syslinux.cfg")
    with open(config, "w") as f:
        f.write(_SYSLINUX_CFG)
    if os.path.exists(path):
        os.unlink(path)
    for command in (["mkfs.vfat", "-C", path, str(size_mb * 1024)],
                    ["mcopy", "-i", path, args["kernel"], "::vmlinuz"],
                    ["mcopy", "-i", path, args["initrd"], "::initrd.gz"],
                    ["mcopy", "-i", path, config, "::syslinux.cfg"],
                    ["syslinux", "--install", path]):
        subprocess.run(command, check=True, capture_output=True)
    os.chmod(path, 0o644)
    return path


def wait_for_console(path: str, text: str, timeout: float) -> bool:
    """True once the console log at ``path`` contains ``text``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path, errors="replace") as f:
                if text in f.read():
                    return True
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    return False


def world_readable_tmpdir(prefix: str = "peerctl-qemu-") -> str:
    """A directory QEMU's user can reach (pytest's tmp_path sits under a 0700
    directory, and libvirt relabels files, not their parents)."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
    os.chmod(path, 0o755)
    return path


def remove_leftovers(conn, hosts, name) -> None:
    """Whatever a run left in the shared libvirtd: the domain ``name``, the
    pools of ``hosts`` (their image pool and their backup pool).

    By name, since a boot that timed out never told us its uuid."""
    import libvirt
    for dom in conn.listAllDomains(0):
        if dom.name() != name:
            continue
        try:
            if dom.isActive():
                dom.destroy()
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        except libvirt.libvirtError:
            pass
    for pool_name in [f"peerctl{kind}-{host}" for host in hosts for kind in ("", "-backup")]:
        try:
            pool = conn.storagePoolLookupByName(pool_name)
        except libvirt.libvirtError:
            continue
        try:
            for vol in pool.listAllVolumes(0):
                vol.delete(0)
            if pool.isActive():
                pool.destroy()
            pool.undefine()
        except libvirt.libvirtError:
            pass
