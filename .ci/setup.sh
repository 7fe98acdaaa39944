#!/bin/bash
# Set up a fresh Debian (bookworm) machine for peerctl: etcd, the headers and
# compiler that libvirt-python builds with, a `python` command, then the
# Python requirements.  Idempotent: apt runs only when a package is missing,
# pip only installs what is not there yet.
#
# Python: the interpreter that `python` runs (what the README and .ci/run
# use), or $PYTHON.  Debian's own Python has no `python` command and no pip
# until python-is-python3 and python3-pip are installed, and it is
# EXTERNALLY-MANAGED (PEP 668): pip then needs --break-system-packages, which
# installs into /usr/local, beside (not over) Debian's packages.  A pyenv or
# venv Python is used as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_ROOT_USER_ACTION=ignore

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

apt_install() {
    local missing="" pkg
    for pkg in "$@"; do
        installed "$pkg" || missing="$missing $pkg"
    done
    [ -n "$missing" ] || return 0
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "setup: installing$missing" >&2
    if [ -z "${apt_updated:-}" ]; then
        $sudo apt-get update -q >&2
        apt_updated=1
    fi
    # shellcheck disable=SC2086
    $sudo apt-get install -y -q $missing >&2
}

# etcd (tests and `up` run Debian's binary); libvirt-python builds from source
apt_install etcd-server etcd-client libvirt-dev pkg-config gcc
# qemu-img and qemu-io: tests/test_blockmap.py builds and applies deltas of real images
apt_install qemu-utils
# the web page's tests drive Debian's chromium (browsers cannot be downloaded)
apt_install chromium

python=${PYTHON:-python}
if ! command -v "$python" >/dev/null; then
    if [ "$python" = python ] && [ "$(command -v python3)" = /usr/bin/python3 ]; then
        apt_install python-is-python3      # Debian's python3 as `python`
    fi
    command -v "$python" >/dev/null || { echo "setup: no $python command" >&2; exit 1; }
fi
system_python=$("$python" -c 'import sys; print(int(sys.prefix == sys.base_prefix
                and sys.prefix == "/usr"))')
if [ "$system_python" = 1 ]; then
    apt_install python3-dev                 # Python.h, for libvirt-python
fi
if ! "$python" -m pip --version >/dev/null 2>&1; then
    if [ "$system_python" = 1 ]; then
        apt_install python3-pip python3-dev python3-venv
    else
        "$python" -m ensurepip --upgrade >&2
    fi
fi

pip_args=(-q --disable-pip-version-check)
externally_managed=$("$python" -c 'import os, sys, sysconfig
print(int(sys.prefix == sys.base_prefix and os.path.exists(
    os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))')
if [ "$externally_managed" = 1 ]; then
    echo "setup: $python is EXTERNALLY-MANAGED: pip installs with --break-system-packages" >&2
    pip_args+=(--break-system-packages)
fi
requirements=(-r requirements.txt)
[ -f requirements-placement.txt ] && requirements+=(-r requirements-placement.txt)
"$python" -m pip install "${pip_args[@]}" "${requirements[@]}" >&2

# The .deb's test (tests/test_deb_systemd.py, QEMU tier) boots a fresh
# bookworm under systemd-nspawn: debootstrap it once into
# /var/cache/peerctl/nspawn/ (a no-op when there; ~1 minute, ~300 MB).
# Where this cannot be done (no root, no mirror) that test skips, saying why.
if [ "$(id -u)" = 0 ]; then
    apt_install debootstrap systemd-container
    "$python" -m tests.support.nspawn build >&2 \
        || echo "setup: no bookworm tree for the .deb's test; it will skip" >&2
fi
echo "setup: done ($("$python" -c 'import sys; print(sys.executable)'))" >&2
