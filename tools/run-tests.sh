#!/bin/bash
# Run the whole vmar-openstack test suite on a fresh Debian 12 machine (as
# root): installs what it needs, then runs style checks, unit tests and the
# functional tests against real QEMU tools, SQLite, MariaDB and PostgreSQL.
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
VENV=$(tools/install-deps.sh --test | tail -n 1)
export PATH="$VENV/bin:$PATH"

echo "== style: flake8 (hacking), shellcheck, bashate"
flake8
tools/lint-shell.sh

echo "== release notes"
reno lint >/dev/null

echo "== config sample is up to date"
tools/gen-config.sh --check

echo "== unit tests"
stestr --test-path=./tests/unit run

echo "== patched QEMU (qemu/build.sh; cached by content hash)"
VMAR_QEMU_PREFIX=$(qemu/build.sh | tail -n 1)
export VMAR_QEMU_PREFIX
echo "$VMAR_QEMU_PREFIX"

echo "== Debian image library and test guest (cached)"
VMAR_IMAGE_LIBRARY=${VMAR_IMAGE_LIBRARY:-/var/cache/vmar-openstack/images}
export VMAR_IMAGE_LIBRARY
tools/build-image-library.sh "$VMAR_IMAGE_LIBRARY" | tail -n 4
tools/build-test-guest.sh | tail -n 1

echo "== functional tests (QEMU, libvirt, SQLite, MariaDB, PostgreSQL)"
mkdir -p bench/out
stestr --test-path=./tests/functional run --concurrency=1
