#!/bin/bash
# Build the tiny test guest: a Debian cloud kernel and a busybox initramfs.
#
# The guest reads its whole virtio disk (/dev/vda), prints
#   VMAR-SHA256 <sha256 of the disk>
# on the serial console, and powers off. With vmar.write=<offset> on the
# kernel command line it first writes the 4 KiB marker block
# "vmar-marker-<offset>" (zero padded) at that byte offset and reads it back,
# printing VMAR-WROTE <ok|bad>. With vmar.readback=<offset> it prints
# VMAR-READBACK <ok|bad> for a marker written by an earlier boot.
# With vmar.loop=1 it keeps re-reading the disk, printing each checksum,
# and with vmar.pause=<seconds> it idles that long after each one.
#
# Usage: tools/build-test-guest.sh [OUTDIR]
# Prints the output directory (holding vmlinuz and initramfs) last.
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${VMAR_CACHE:-/var/cache/vmar-openstack}
KPKG=${VMAR_GUEST_KERNEL_PKG:-}

need=()
command -v busybox >/dev/null || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
if [ "${#need[@]}" -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${need[@]}" >&2
fi
if [ -z "$KPKG" ]; then
    KPKG=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null \
        | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$KPKG" ] || { echo "no Debian cloud kernel package found" >&2; exit 1; }

hash=$(cat "$0" "$TOP/tools/test-guest-init" <(echo "$KPKG") | sha256sum | cut -c1-16)
OUT=${1:-$CACHE/guest-$hash}
# two chains asking at once: one builds, the other waits and finds it
mkdir -p "$(dirname "$OUT")"
exec {lock}>"$OUT.lock"
flock "$lock"
if [ -f "$OUT/vmlinuz" ] && [ -f "$OUT/initramfs" ]; then
    echo "$OUT"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "$KPKG" >&2)
dpkg-deb -x "$work"/*.deb "$work/k"
kver=$(basename "$(ls -d "$work"/k/lib/modules/*)")
mods="$work/k/lib/modules/$kver/kernel"

root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,mod,tmp}
cp "$(command -v busybox)" "$root/bin/busybox"
for m in drivers/virtio/virtio.ko drivers/virtio/virtio_ring.ko \
    drivers/virtio/virtio_pci_modern_dev.ko \
    drivers/virtio/virtio_pci_legacy_dev.ko drivers/virtio/virtio_pci.ko \
    drivers/block/virtio_blk.ko; do
    cp "$mods/$m" "$root/mod/"
done
cp "$TOP/tools/test-guest-init" "$root/init"
chmod +x "$root/init"
mkdir -p "$OUT.tmp"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -9) \
    > "$OUT.tmp/initramfs"
cp "$work/k/boot/vmlinuz-$kver" "$OUT.tmp/vmlinuz"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "built test guest with kernel $kver (project $TOP)" >&2
echo "$OUT"
