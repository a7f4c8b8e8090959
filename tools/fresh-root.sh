#!/bin/bash
#
# Run a command of this repository in a pristine Debian 12 root, as a new
# user on a fresh machine would: what the README promises, checked.
#
# Usage: tools/fresh-root.sh [--keep] [--cold] [--add FILE]... [COMMAND [ARG...]]
#
# COMMAND runs as root in a fresh clone of this repository's HEAD (commit
# first: uncommitted changes are not in the clone), from the clone's top
# directory. It defaults to the README's demo command, tools/demo.sh.
#
# The root is `debootstrap --variant=minbase bookworm`, cached as a tarball
# in $VMAR_FRESH_ROOT_CACHE (default /var/cache/vmar-openstack/fresh-root)
# by the hash of debootstrap's version, suite, mirror and arch; nothing is
# ever written into the tarball. Each run unpacks it anew and adds only what
# every machine of this workplace has and the project does not install:
#   - apt's sources (Debian's own, /etc/apt/sources.list.d/debian.sources)
#     and apt.conf.d snippets, /etc/resolv.conf, /etc/hosts;
#   - the certificate authorities in /usr/local/share/ca-certificates and
#     /etc/pip.conf, so apt-get and pip reach the package registries.
# Download and build caches are shared with this machine (bind mounts):
# pip's wheel cache, debootstrap's .deb cache and the ccache of
# qemu/build.sh. The image library is read through an overlay: an image
# is rebuilt, in the root's upper layer only, unless its stamp matches the hash of
# the build script, its parameters and the root's tool versions, so a
# stale image is never reused. The root's tools are the mirror's newest
# and this machine's may be older, so the images a root builds are kept
# in $VMAR_FRESH_ROOT_CACHE/images, stamps and all, and linked into the
# next root over the machine's: a warm run builds an image again only
# when its script, parameters or the root's tools changed. Installed results are never shared: the
# packages, the virtualenv and the QEMU prefix are made in the root.
# --cold shares none of them: every download and build happens in the root,
# as on a new machine (how the README's timings are measured).
# --add FILE copies FILE into the root's /root (a package to install, as
# an operator would copy one in).
#
# The command runs in its own mount namespace with /proc, /sys (with its
# cgroups), /dev and a
# tmpfs on /run; the mounts vanish with it. If any process is still running
# in the root after the command returns, the run fails (the README commands
# must not leave anything running) and those processes are killed. The
# root is removed at the end unless --keep is given. The exit status is the
# command's (or 1 for leftovers).
#
# Environment: VMAR_FRESH_ROOT_CACHE, VMAR_DEBIAN_MIRROR (default: the first
# URI of debian.sources), TMPDIR (where the root is unpacked, /var/tmp).
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
CACHE=${VMAR_FRESH_ROOT_CACHE:-/var/cache/vmar-openstack/fresh-root}
SUITE=bookworm
CLONE=/root/vmar-openstack
# Download and build caches shared with the root, at the same paths.
QEMU_CACHE=/var/cache/vmar-openstack
# Not the QEMU build tree: its configuration records what the machine had
# (valgrind's headers, for one), so the root configures its own and
# compiles through the shared ccache.
SHARED_CACHES=(/root/.cache/pip /var/cache/vmar-openstack/debootstrap
    "$QEMU_CACHE/ccache")
# The image library is not shared but read through an overlay: the root
# reuses an image whose stamp matches what its own tools would build, and
# rebuilds the others into the overlay's upper layer (a build renames a new
# file into place), never into the machine's library, which tests may be
# reading. Not hard links: a link made or removed changes the image's
# ctime, and a test hashing it at that moment sees it "changed while it
# was being read" (the cold CI run of b257fdc).
LIBRARY=/var/cache/vmar-openstack/images
# the images earlier roots built (their stamps name the roots' tools)
ROOT_LIBRARY=$CACHE/images

say() {
    printf '%s fresh-root: %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

die() {
    say "ERROR: $*"
    exit 1
}

mirror() {
    local uri
    uri=$(awk '/^URIs:/ { print $2; exit }' \
        /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    printf '%s\n' "${VMAR_DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

# The pristine tarball, built once per debootstrap version and mirror.
tarball() {
    local mirror=$1 key tar tmp
    key=$(printf '%s\n' "$SUITE" "$mirror" "$(dpkg --print-architecture)" \
        "$(dpkg-query -W -f='${Version}' debootstrap)" minbase |
        sha256sum | cut -c1-16)
    tar=$CACHE/$SUITE-minbase-$key.tar
    if [ ! -f "$tar" ]; then
        mkdir -p "$CACHE"
        tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/vmar-debootstrap.XXXXXX")
        say "debootstrap --variant=minbase $SUITE ($mirror)"
        if ! debootstrap --variant=minbase "$SUITE" "$tmp/root" "$mirror" \
            >"$tmp/log" 2>&1; then
            tail -n 20 "$tmp/log" >&2
            rm -rf --one-file-system "$tmp"
            die "debootstrap failed"
        fi
        tar -C "$tmp/root" --numeric-owner -cf "$tar.tmp" .
        mv "$tar.tmp" "$tar"
        rm -rf --one-file-system "$tmp"
    fi
    printf '%s\n' "$tar"
}

# What this workplace's machines have before the project touches them.
add_workplace_config() {
    local root=$1 f
    cp /etc/resolv.conf /etc/hosts "$root/etc/"
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        rm -f "$root/etc/apt/sources.list"
        cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
    fi
    for f in /etc/apt/apt.conf.d/*; do
        [ -f "$f" ] && cp "$f" "$root/etc/apt/apt.conf.d/"
    done
    mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
    for f in /usr/local/share/ca-certificates/*; do
        [ -f "$f" ] && cp "$f" "$root/usr/local/share/ca-certificates/"
    done
    # pip and apt (https) work before ca-certificates is installed; its
    # postinst then rebuilds this bundle from the files above.
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    [ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/"
    return 0
}

# Inside a private mount namespace: mount, chroot, run.
inside() {
    local root=$1 cold=$2 d
    shift 2
    mount --make-rprivate /
    mount -t proc proc "$root/proc"
    # /sys as the machine has it, with its cgroup hierarchies (libvirt
    # puts guests into cgroups, as on any machine whose init mounted them)
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/run"
    if [ "$cold" = 0 ]; then
        for d in "${SHARED_CACHES[@]}"; do
            mkdir -p "$d" "$root$d"
            mount --bind "$d" "$root$d"
        done
        library "$root"
    fi
    # shellcheck disable=SC2016  # expanded by the inner shell
    exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        PIP_DISABLE_PIP_VERSION_CHECK=1 "CI=${CI:-}" \
        /bin/bash -c 'cd "$0" && exec "$@"' "$CLONE" "$@"
}

# The machine's image library under the images of earlier roots, read-only,
# with the root's own builds in an upper layer beside the root
# (keep_images reads it once the command is through).
library() {
    local root=$1 lower="" d work=${1%/root}
    for d in "$ROOT_LIBRARY" "$LIBRARY"; do
        [ -d "$d" ] && lower=${lower:+$lower:}$d
    done
    [ -n "$lower" ] || return 0
    mkdir -p "$root$LIBRARY" "$work/library-upper" "$work/library-work"
    mount -t overlay overlay -o "lowerdir=$lower" \
        -o "upperdir=$work/library-upper,workdir=$work/library-work" \
        "$root$LIBRARY" ||
        say "image library not mounted in; the root builds every image"
}

leftovers() {
    local root=$1 p
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] &&
            printf '%s %s\n' "${p#/proc/}" "$(tr '\0' ' ' <"$p/cmdline")"
    done
    return 0
}

# The images the root built (the regular files of the overlay's upper
# layer: whiteouts are device nodes), kept for the next root with their
# stamps.
keep_images() {
    local upper=${1%/root}/library-upper stamp name
    for stamp in "$upper"/*.raw.stamp; do
        [ -f "$stamp" ] || continue
        name=${stamp##*/}
        name=${name%.stamp}
        [ -f "$upper/$name" ] || continue
        mkdir -p "$ROOT_LIBRARY"
        rm -f "$ROOT_LIBRARY/$name.stamp"
        if ln -f "$upper/$name" "$ROOT_LIBRARY/$name" &&
            ln -f "$stamp" "$ROOT_LIBRARY/$name.stamp"; then
            say "kept $name, built in the root, for the next root"
        else
            rm -f "$ROOT_LIBRARY/$name" "$ROOT_LIBRARY/$name.stamp"
        fi
    done
}

main() {
    local keep=0 cold=0 root work tar rc start left f
    local add=()
    if [ "${1:-}" = --inside ]; then
        shift
        inside "$@"
    fi
    while [ $# -gt 0 ]; do
        case $1 in
            --keep) keep=1 ;;
            --cold) cold=1 ;;
            --add)
                [ -f "${2:-}" ] || die "--add needs a file"
                add+=("$2")
                shift
                ;;
            *) break ;;
        esac
        shift
    done
    [ $# -gt 0 ] || set -- tools/demo.sh
    [ "$(id -u)" -eq 0 ] || die "must run as root"
    command -v debootstrap >/dev/null ||
        die "debootstrap is missing (tools/install-deps.sh test)"

    start=$SECONDS
    tar=$(tarball "$(mirror)")
    work=$(mktemp -d "${TMPDIR:-/var/tmp}/vmar-fresh-root.XXXXXX")
    root=$work/root
    mkdir "$root"
    say "unpacking $tar into $root"
    tar -C "$root" --numeric-owner -xf "$tar"
    add_workplace_config "$root"
    git clone -q --no-local "$TOP" "$root$CLONE"
    for f in "${add[@]}"; do
        cp "$f" "$root/root/"
    done
    say "clone of $(git -C "$TOP" rev-parse --short HEAD) in $CLONE;" \
        "running: $*"

    rc=0
    unshare --mount -- "$SCRIPT" --inside "$root" "$cold" "$@" || rc=$?
    say "command exited with $rc after $((SECONDS - start)) s"

    [ "$cold" = 1 ] || keep_images "$root"
    left=$(leftovers "$root")
    if [ -n "$left" ]; then
        say "processes left running in the root (killed now):"
        printf '%s\n' "$left" >&2
        awk '{ print $1 }' <<<"$left" | xargs -r kill -9 2>/dev/null || true
        [ "$rc" -ne 0 ] || rc=1
    fi
    if [ "$keep" = 1 ]; then
        say "root kept in $root"
    else
        # mounts lived in the command's namespace; nothing is mounted here
        if awk -v d="$root/" 'index($2, d) == 1 { f = 1 } END { exit !f }' \
            /proc/mounts; then
            die "mounts left below $root; not removing it"
        fi
        rm -rf --one-file-system "$work"
    fi
    return "$rc"
}

main "$@"
