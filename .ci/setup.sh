#!/bin/bash
# Set up a fresh Debian machine for peerctl: etcd, libvirt headers, tmux (for
# the terminal test), then the Python requirements.  Idempotent: apt runs only
# when a package is missing, pip only installs what is not there yet.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_ROOT_USER_ACTION=ignore

packages="etcd-server etcd-client libvirt-dev pkg-config tmux"
missing=""
for pkg in $packages; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "setup: installing$missing" >&2
    $sudo apt-get update -q >&2
    $sudo apt-get install -y -q $missing >&2
fi

python=${PYTHON:-python3}
command -v "$python" >/dev/null || python=python
requirements="-r requirements.txt"
[ -f requirements-placement.txt ] && requirements="$requirements -r requirements-placement.txt"
# shellcheck disable=SC2086
"$python" -m pip install -q --disable-pip-version-check $requirements >&2
echo "setup: done" >&2
