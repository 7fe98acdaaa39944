#!/bin/sh
# Prepare this machine for peerctl's real-QEMU tier, without systemd:
#   1. install libvirtd, QEMU, qemu-img, a static busybox and the tools that
#      make a bootable FAT disk image (syslinux, mtools, dosfstools), and
#      dnsmasq-base (DHCP on the guests' libvirt networks);
#   2. unpack a Debian cloud kernel and the modules the test guest needs
#      ($GUEST_MODULES: ACPI power button, evdev, a virtio NIC, the IDE CD-ROM
#      and ISO 9660, each with what it depends on) into $PEERCTL_GUEST_DIR,
#      with the kernel's modules.builtin, without installing the kernel
#      package (its hooks want a real /boot and an initramfs tool); a guest
#      directory that lacks a module gets it from the package of its kernel;
#   3. start virtlogd and libvirtd as daemons unless their PID files name a
#      live process, and wait for libvirtd's socket.
# Idempotent: every step is skipped when its result is already there.
# Prints the guest directory on its last line.
set -eu

GUEST_DIR=${PEERCTL_GUEST_DIR:-/var/cache/peerctl/guest}
export DEBIAN_FRONTEND=noninteractive

need=""
for pkg in libvirt-daemon-system qemu-system-x86 qemu-utils busybox-static \
           syslinux syslinux-common mtools dosfstools dnsmasq-base; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || need="$need $pkg"
done
if [ -n "$need" ]; then
    echo "installing:$need" >&2
    apt-get install -y --no-install-recommends $need >&2 \
        || { apt-get update >&2 && apt-get install -y --no-install-recommends $need >&2; }
fi

# The modules tests/support/qemu_guest.py loads (their dependencies come too).
GUEST_MODULES="button evdev virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev
    virtio_pci failover net_failover virtio_net virtio_blk scsi_common scsi_mod libata ata_piix
    cdrom sr_mod isofs"

work=""
cleanup() { if [ -n "$work" ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

fetch_kernel() {   # fetch_kernel PACKAGE: unpack that .deb into $work/root
    cleanup
    work=$(mktemp -d)
    chmod 755 "$work"   # apt-get download drops to the _apt user
    (cd "$work" && apt-get download "$1" 1>&2) \
        || { apt-get update >&2 && (cd "$work" && apt-get download "$1" 1>&2); } \
        || return 1
    dpkg-deb -x "$work"/"$1"_*.deb "$work/root"
}

copy_modules() {   # copy_modules DEST: $GUEST_MODULES and their deps, from $work/root
    dest=$1
    tree=$(echo "$work"/root/lib/modules/*)
    cp "$tree/modules.builtin" "$dest/modules.builtin"
    want=$GUEST_MODULES
    seen=" "
    while [ -n "$(echo $want)" ]; do
        next=""
        for mod in $want; do
            case "$seen" in *" $mod "*) continue ;; esac
            seen="$seen$mod "
            alt=$(echo "$mod" | tr _ -)
            file=$(find "$tree/kernel" \( -name "$mod.ko" -o -name "$alt.ko" \) | head -n 1)
            if [ -z "$file" ]; then
                grep -Eq "/($mod|$alt)\.ko\$" "$tree/modules.builtin" \
                    || echo "warning: no module $mod in the kernel package" >&2
                continue
            fi
            cp "$file" "$dest/$mod.ko"
            # modinfo's depends=, read without kmod or binutils
            next="$next $(tr '\0' '\n' < "$file" | sed -n 's/^depends=//p' | tr ',' ' ')"
        done
        want=$next
    done
}

missing_modules() {   # prints the wanted modules neither in $GUEST_DIR nor built in
    for mod in $GUEST_MODULES; do
        [ -e "$GUEST_DIR/$mod.ko" ] && continue
        [ -e "$GUEST_DIR/modules.builtin" ] \
            && grep -Eq "/($mod|$(echo "$mod" | tr _ -))\.ko\$" "$GUEST_DIR/modules.builtin" \
            && continue
        echo "$mod"
    done
}

if ls "$GUEST_DIR"/vmlinuz-* >/dev/null 2>&1 && [ -n "$(missing_modules)" ]; then
    # A guest directory from before a module was wanted: the modules must
    # come from the very package of its kernel.  When the apt lists no
    # longer have it, the directory is made anew from the current kernel.
    kver=$(basename "$(ls "$GUEST_DIR"/vmlinuz-* | tail -n 1)")
    kver=${kver#vmlinuz-}
    echo "adding modules to $GUEST_DIR:" $(missing_modules) >&2
    if fetch_kernel "linux-image-$kver" && [ -d "$work/root/lib/modules/$kver" ]; then
        rm -rf "$GUEST_DIR.add" && mkdir -p "$GUEST_DIR.add"
        copy_modules "$GUEST_DIR.add"
        chmod -R a+rX "$GUEST_DIR.add"
        for f in "$GUEST_DIR.add"/*; do
            mv -f "$f" "$GUEST_DIR/"
        done
        rmdir "$GUEST_DIR.add"
    else
        echo "no package linux-image-$kver: making $GUEST_DIR anew" >&2
        rm -f "$GUEST_DIR"/vmlinuz-*
    fi
fi

if ! ls "$GUEST_DIR"/vmlinuz-* >/dev/null 2>&1; then
    # The metapackage names the current kernel package; fetch that one .deb.
    kpkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
    [ -n "$kpkg" ] || { echo "no linux-image-cloud-amd64 in the apt lists" >&2; exit 1; }
    fetch_kernel "$kpkg"
    rm -rf "$GUEST_DIR.new" && mkdir -p "$GUEST_DIR.new"
    cp "$work"/root/boot/vmlinuz-* "$GUEST_DIR.new/"
    copy_modules "$GUEST_DIR.new"
    chmod -R a+rX "$GUEST_DIR.new"
    mkdir -p "$(dirname "$GUEST_DIR")"
    rm -rf "$GUEST_DIR" && mv "$GUEST_DIR.new" "$GUEST_DIR"
fi
[ -z "$(missing_modules)" ] || { echo "modules missing from $GUEST_DIR:" $(missing_modules) >&2; exit 1; }

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
