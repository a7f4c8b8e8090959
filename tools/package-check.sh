#!/bin/bash
# In a pristine Debian 12 root (tools/fresh-root.sh --add DEB...): install
# the packages of the vmar QEMU tools that qemu/build.sh --deb made, with
# apt alone and side by side, then run vmar-export serve from each.
#
# Usage (inside the root): tools/package-check.sh DEB...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 DEB..." >&2; exit 2; }
say() {
    echo "package-check: $*" >&2
}

say "installing $* into a root that has nothing else"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends "$@" >/dev/null
BINS=()
for deb in "$@"; do
    pkg=$(dpkg-deb -f "$deb" Package)
    bin=$(dpkg -L "$pkg" | grep '/bin/qemu-storage-daemon$' | xargs dirname)
    if ldd "$bin"/* | grep 'not found'; then
        say "$pkg does not bring every library its tools load"
        exit 1
    fi
    say "$pkg: $("$bin/qemu-storage-daemon" --version | head -n 1)"
    if ! "$bin/qemu-img" --help | grep -qw vmar-mirror; then
        say "$bin/qemu-img has no vmar-mirror driver"
        exit 1
    fi
    BINS+=("$bin")
done

# Debian's own qemu-utils comes with the product's dependencies: beside
# the packages, not instead of them
say "installing vmar-openstack (tools/install-deps.sh) beside them"
VENV=$(tools/install-deps.sh | tail -n 1)
mkdir -p /etc/vmar
SERVE=
stop() {
    [ -z "$SERVE" ] && return 0
    kill "$SERVE" 2>/dev/null || true
    wait "$SERVE" 2>/dev/null || true
    SERVE=
    rm -f /run/vmar/api.sock
}
trap stop EXIT
for bin in "${BINS[@]}"; do
    printf '[vmar_host]\nqemu_storage_daemon = %s\n' \
        "$bin/qemu-storage-daemon" >/etc/vmar/vmar-export.conf
    say "vmar-export serve with $bin/qemu-storage-daemon"
    "$VENV/bin/vmar-export" --config-file /etc/vmar/vmar-export.conf \
        serve >/tmp/serve.log 2>&1 &
    SERVE=$!
    for _ in $(seq 300); do
        [ -S /run/vmar/api.sock ] && break
        if ! kill -0 "$SERVE" 2>/dev/null; then
            cat /tmp/serve.log >&2
            say "vmar-export serve exited"
            exit 1
        fi
        sleep 0.1
    done
    # the host API answers before the supervisor has started the daemon
    for _ in $(seq 300); do
        [ -s /var/lib/vmar/host/qsd.pid ] && break
        sleep 0.1
    done
    "$VENV/bin/vmar-export" --config-file /etc/vmar/vmar-export.conf status
    grep -q "$bin/qemu-storage-daemon" \
        "/proc/$(cat /var/lib/vmar/host/qsd.pid)/cmdline"
    stop
done
trap - EXIT
say "ok: the packages install alone, side by side, and vmar-export" \
    "serve runs from each"
