#!/bin/bash
# Package the vmar QEMU tools of a prefix that qemu/build.sh made.
#
#   qemu/mkdeb.sh PREFIX
#
# Writes PREFIX/vmar-qemu-tools-<version>_<source version>+vmar<hash>_<arch>.deb
# and prints its path. The package installs the tools under
# /usr/lib/vmar-qemu/<version>/bin, beside Debian's own qemu packages and
# beside the packages of the other versions: nothing in it conflicts with
# any of them. Its dependencies are the shared libraries the tools load,
# as dpkg-shlibdeps finds them on the machine that built them (so a
# package built on Debian 12 is for Debian 12).
set -euo pipefail

PREFIX=${1:?usage: $0 PREFIX}
info() {
    sed -n "s/^$1 //p" "$PREFIX/BUILDINFO"
}
VERSION=$(info qemu-version)
SOURCE=$(info debian-qemu-source)
if [ -z "$VERSION" ] || [ -z "$SOURCE" ]; then
    echo "mkdeb.sh: $PREFIX/BUILDINFO names no version" >&2
    exit 1
fi
HASH=${PREFIX##*-}
PKG=vmar-qemu-tools-$VERSION
DEBVER=$SOURCE+vmar${HASH:0:8}
ARCH=$(dpkg --print-architecture)
DEST=/usr/lib/vmar-qemu/$VERSION

WORK=$(mktemp -d /tmp/vmar-mkdeb.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/root
install -d "$ROOT$DEST/bin" "$ROOT/usr/share/doc/$PKG" "$ROOT/DEBIAN"
install -m 0755 "$PREFIX"/bin/* "$ROOT$DEST/bin/"
install -m 0644 "$PREFIX/BUILDINFO" "$ROOT/usr/share/doc/$PKG/BUILDINFO"
cat >"$ROOT/usr/share/doc/$PKG/copyright" <<EOF
QEMU $SOURCE with the vmar block drivers of vmar-openstack
(qemu/patches/$VERSION in vmar-openstack).

License: GPL-2.0-or-later (QEMU and the vmar drivers); see
/usr/share/common-licenses/GPL-2.
EOF

# dpkg-shlibdeps reads debian/control of the directory it runs in
mkdir -p "$WORK/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$PKG" "$PKG" \
    >"$WORK/debian/control"
DEPENDS=$(cd "$WORK" && dpkg-shlibdeps -O "$ROOT$DEST"/bin/* 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')
if [ -z "$DEPENDS" ]; then
    echo "mkdeb.sh: dpkg-shlibdeps found nothing" >&2
    exit 1
fi

cat >"$ROOT/DEBIAN/control" <<EOF
Package: $PKG
Version: $DEBVER
Architecture: $ARCH
Maintainer: vmar-openstack developers <vmar-openstack@lists.invalid>
Depends: $DEPENDS
Section: misc
Priority: optional
Description: QEMU $VERSION tools with the vmar block drivers
 qemu-img, qemu-io, qemu-nbd and qemu-storage-daemon of QEMU $VERSION
 ($SOURCE) with the vmar and vmar-mirror block drivers of vmar-openstack,
 in $DEST/bin. Point vmar-export's [vmar_host] qemu_storage_daemon at
 $DEST/bin/qemu-storage-daemon. Debian's own qemu packages are not
 touched.
EOF
OUT=$PREFIX/${PKG}_${DEBVER}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$OUT.tmp" >/dev/null
mv "$OUT.tmp" "$OUT"
echo "$OUT"
