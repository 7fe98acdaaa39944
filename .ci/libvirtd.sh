#!/bin/sh
# Prepare this machine for peerctl's real-QEMU tier, without systemd:
#   1. install libvirtd, QEMU, qemu-img, a static busybox and the tools that
#      make a bootable FAT disk image (syslinux, mtools, dosfstools);
#   2. unpack a Debian cloud kernel and the two modules the test guest needs
#      (ACPI power button, evdev) into $PEERCTL_GUEST_DIR, without installing
#      the kernel package (its hooks want a real /boot and an initramfs tool);
#   3. start virtlogd and libvirtd as daemons unless their PID files name a
#      live process, and wait for libvirtd's socket.
# Idempotent: every step is skipped when its result is already there.
# Prints the guest directory on its last line.
set -eu

GUEST_DIR=${PEERCTL_GUEST_DIR:-/var/cache/peerctl/guest}
export DEBIAN_FRONTEND=noninteractive

need=""
for pkg in libvirt-daemon-system qemu-system-x86 qemu-utils busybox-static \
           syslinux syslinux-common mtools dosfstools; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || need="$need $pkg"
done
if [ -n "$need" ]; then
    echo "installing:$need" >&2
    apt-get install -y --no-install-recommends $need >&2 \
        || { apt-get update >&2 && apt-get install -y --no-install-recommends $need >&2; }
fi

if ! ls "$GUEST_DIR"/vmlinuz-* >/dev/null 2>&1; then
    # The metapackage names the current kernel package; fetch that one .deb.
    kpkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
    [ -n "$kpkg" ] || { echo "no linux-image-cloud-amd64 in the apt lists" >&2; exit 1; }
    work=$(mktemp -d)
    chmod 755 "$work"   # apt-get download drops to the _apt user
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && apt-get download "$kpkg" 1>&2)
    dpkg-deb -x "$work"/"$kpkg"_*.deb "$work/root"
    mkdir -p "$GUEST_DIR.new"
    cp "$work"/root/boot/vmlinuz-* "$GUEST_DIR.new/"
    for mod in button.ko evdev.ko; do
        find "$work/root/lib/modules" -name "$mod" -exec cp {} "$GUEST_DIR.new/" \;
    done
    chmod -R a+rX "$GUEST_DIR.new"
    mkdir -p "$(dirname "$GUEST_DIR")"
    rm -rf "$GUEST_DIR" && mv "$GUEST_DIR.new" "$GUEST_DIR"
fi

# Without udev nothing applies Debian's rule for /dev/kvm (group kvm, mode
# 0660), and QEMU, running as libvirt-qemu, cannot open it.
if [ -c /dev/kvm ] && getent group kvm >/dev/null; then
    chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
fi

alive() {   # alive PIDFILE: the PID file names a running process
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}
mkdir -p /run/libvirt
alive /run/virtlogd.pid || virtlogd -d
alive /run/libvirtd.pid || libvirtd -d
i=0
until [ -S /run/libvirt/libvirt-sock ]; do
    i=$((i + 1))
    [ $i -le 100 ] || { echo "libvirtd did not open its socket" >&2; exit 1; }
    sleep 0.1
done
echo "$GUEST_DIR"
