#!/bin/bash
# In a pristine Debian 12 root (tools/fresh-root.sh --add DEB): install the
# package of the vmar QEMU tools that qemu/build.sh --deb made, with apt
# alone, then run vmar-export serve from it.
#
# Usage (inside the root): tools/package-check.sh /root/vmar-qemu-tools-*.deb
set -euo pipefail
DEB=${1:?usage: $0 DEB}
say() {
    echo "package-check: $*" >&2
}

say "installing $DEB into a root that has nothing else"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends "$DEB" >/dev/null
PKG=$(dpkg-deb -f "$DEB" Package)
BIN=$(dpkg -L "$PKG" | grep '/bin/qemu-storage-daemon$' | xargs dirname)
if ldd "$BIN"/* | grep 'not found'; then
    say "the package does not bring every library its tools load"
    exit 1
fi
"$BIN/qemu-storage-daemon" --version | head -n 1
"$BIN/qemu-img" --help | grep -qw vmar-mirror ||
    { say "$BIN/qemu-img has no vmar-mirror driver"; exit 1; }

say "installing vmar-openstack (tools/install-deps.sh) beside it"
VENV=$(tools/install-deps.sh | tail -n 1)
mkdir -p /etc/vmar
cat >/etc/vmar/vmar-export.conf <<CONF
[vmar_host]
qemu_storage_daemon = $BIN/qemu-storage-daemon
CONF
say "vmar-export serve with $BIN/qemu-storage-daemon"
"$VENV/bin/vmar-export" --config-file /etc/vmar/vmar-export.conf serve \
    >/tmp/serve.log 2>&1 &
SERVE=$!
stop() {
    kill "$SERVE" 2>/dev/null || true
    wait "$SERVE" 2>/dev/null || true
}
trap stop EXIT
for _ in $(seq 300); do
    [ -S /run/vmar/api.sock ] && break
    if ! kill -0 "$SERVE" 2>/dev/null; then
        cat /tmp/serve.log >&2
        say "vmar-export serve exited"
        exit 1
    fi
    sleep 0.1
done
"$VENV/bin/vmar-export" --config-file /etc/vmar/vmar-export.conf status
grep -q qemu-storage-daemon "/proc/$(cat /var/lib/vmar/host/qsd.pid)/cmdline"
stop
trap - EXIT
say "ok: $PKG installs alone and vmar-export serve runs from it"
