#!/bin/bash
# Run the qemu-iotests of the vmar drivers against a QEMU that
# qemu/build.sh built.
#
#   qemu/run-iotests.sh PREFIX [TEST...]
#
# PREFIX is the one build.sh printed: it holds the tools and a copy of
# the tree's tests/qemu-iotests (the vmar tests among them) and python/.
# The tests run with QEMU's own runner (check -raw -file), and compare
# their output with the reference output committed beside them.  The
# runner wants a system emulator even for tests that start none: Debian's
# qemu-system-x86_64 (QEMU_PROG overrides it).
set -euo pipefail
PREFIX=${1:?usage: $0 PREFIX [TEST...]}
shift
TESTS=("$@")
if [ "${#TESTS[@]}" = 0 ]; then
    TESTS=(vmar-read vmar-mirror)
fi
IOTESTS="$PREFIX/tests/qemu-iotests"
if [ ! -x "$IOTESTS/check" ]; then
    echo "run-iotests.sh: $PREFIX has no iotests: build it again with" \
        "qemu/build.sh" >&2
    exit 1
fi
export QEMU_IMG_PROG="$PREFIX/bin/qemu-img"
export QEMU_IO_PROG="$PREFIX/bin/qemu-io"
export QEMU_NBD_PROG="$PREFIX/bin/qemu-nbd"
export QSD_PROG="$PREFIX/bin/qemu-storage-daemon"
QEMU_PROG=${QEMU_PROG:-$(command -v qemu-system-x86_64 || true)}
if [ -z "$QEMU_PROG" ]; then
    echo "run-iotests.sh: no qemu-system-x86_64 (apt-get install" \
        "qemu-system-x86) and no QEMU_PROG" >&2
    exit 1
fi
export QEMU_PROG
WORK=$(mktemp -d /tmp/vmar-iotests.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "qemu-iotests of $(sed -n 's/^qemu-version //p' "$PREFIX/BUILDINFO")" \
    "($PREFIX): ${TESTS[*]}"
cd "$IOTESTS"
TEST_DIR="$WORK/scratch" SOCK_DIR="$WORK/sock" \
    python3 ./check -raw -file "${TESTS[@]}"
