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
BUSYBOX = "/bin/busybox"
CMDLINE = "console=ttyS0 loglevel=4 panic=-1"
LINUX_ACCEL = os.environ.get("PEERCTL_TEST_LINUX_ACCEL", "tcg")

__all__ = ["QEMU_URI", "GUEST_DIR", "READY_MARKER", "skip_reason", "guest_dir",
           "build_initramfs", "guest_args", "build_disk_image", "world_readable_tmpdir",
           "wait_for_console", "CMDLINE", "LINUX_ACCEL"]

_INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
insmod /lib/modules/button.ko
insmod /lib/modules/evdev.ko
acpid
echo "{READY_MARKER} $(uname -r)"
while true; do sleep 3600; done
"""

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
                      "lib", "lib/modules", "tmp", "var", "var/run", "var/log"):
        archive.directory(directory)
    archive.chardev("dev/console", 5, 1)
    with open(BUSYBOX, "rb") as f:
        archive.file("bin/busybox", f.read())
    archive.symlink("bin/sh", "busybox")
    archive.file("init", _INIT.encode())
    # busybox acpid runs /etc/acpi/PWRF/00000080 on the power button.
    archive.file("etc/acpi/PWRF/00000080", _POWER_BUTTON.encode())
    for module in ("button.ko", "evdev.ko"):
        with open(os.path.join(guest_dir, module), "rb") as f:
            archive.file(f"lib/modules/{module}", f.read(), 0o644)
    with open(path, "wb") as f:
        f.write(gzip.compress(archive.finish(), 6))
    os.chmod(path, 0o644)
    return path


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
