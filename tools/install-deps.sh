#!/bin/bash
# Install what vmar-openstack needs on a fresh Debian 12 machine (as root):
# Debian packages, then a virtualenv in .venv with the project installed.
#
# Usage: tools/install-deps.sh [--test]
#   --test  also install what the test suite needs (databases, linters).
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VMAR_VENV:-$TOP/.venv}
PYTHON=${VMAR_PYTHON:-python3}
WITH_TESTS=0
[ "${1:-}" = "--test" ] && WITH_TESTS=1

# gcc, python3-dev and libssl-dev build the native block hasher
# (vmar_openstack/fingerprint/_blockhash.c).
PACKAGES=(qemu-utils util-linux e2fsprogs debootstrap openssl ca-certificates
    gcc python3-dev libssl-dev)
if [ "$WITH_TESTS" = 1 ]; then
    PACKAGES+=(mariadb-server mariadb-client postgresql shellcheck
        gcc zlib1g-dev clang libclang-rt-14-dev fio
        libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-system-data
        seabios ipxe-qemu busybox-static cpio libvirt-dev pkg-config
        rabbitmq-server)
fi

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' \
        || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtualenv $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.vmar-reqs"
want=$(cat "$TOP/requirements.txt" "$TOP/test-requirements.txt" \
    "$TOP/setup.cfg" "$TOP/setup.py" \
    "$TOP/vmar_openstack/fingerprint/_blockhash.c" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$VENV/bin/pip" install -q --upgrade pip >&2
    "$VENV/bin/pip" install -q -r "$TOP/requirements.txt" \
        -r "$TOP/test-requirements.txt" >&2
    "$VENV/bin/pip" install -q -e "$TOP" >&2
    echo "$want" > "$stamp"
fi
echo "$VENV"
