#!/bin/bash
# Build Debian's QEMU 7.2 tools with the vmar block driver added.
#
# The result is installed into a private prefix
#   /var/cache/vmar-openstack/qemu-<hash>
# where <hash> is a sha256 over the driver sources, this script and the
# Debian qemu source version.  Nothing is ever installed into /usr and the
# system QEMU is left alone.  If the prefix already holds the binaries the
# script does nothing.  The last line on stdout is the prefix path; progress
# goes to stderr and the noisy output to $VMAR_QEMU_CACHE/qemu-build/build.log.
#
# Environment:
#   VMAR_QEMU_CACHE  cache root (default /var/cache/vmar-openstack)
#   VMAR_QEMU_JOBS   ninja -j value (default 2)

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${VMAR_QEMU_CACHE:-/var/cache/vmar-openstack}"
WORK="${CACHE}/qemu-build"
SRCROOT="${WORK}/src"
LOG="${WORK}/build.log"
JOBS="${VMAR_QEMU_JOBS:-2}"
DRIVER_FILES=(block-vmar.c block-vmar-mirror.c vmar-map.c vmar-map.h)
# Everything that goes into the build, hashed into the prefix name.
HASH_FILES=("${DRIVER_FILES[@]}" srcedit.py qapi-vmar.py nbd-private.py
    build.sh)
TOOLS=(qemu-img qemu-io qemu-nbd qemu-storage-daemon)
# Ninja targets (paths inside the build directory), same order as TOOLS.
TARGETS=(qemu-img qemu-io qemu-nbd storage-daemon/qemu-storage-daemon)
# Build dependencies: bindep.txt, profile "qemu" (tools/install-deps.sh).
INSTALL_DEPS="${HERE}/../tools/install-deps.sh"
SOURCES_DIR=/etc/apt/sources.list.d
DEBSRC_FILE="${SOURCES_DIR}/vmar-openstack-deb-src.sources"
DEBSRC_LIST="${SOURCES_DIR}/vmar-openstack-deb-src.list"

say() {
    echo "build.sh: $*" >&2
}

die() {
    say "error: $*"
    if [[ -f "${LOG}" ]]; then
        say "last lines of ${LOG}:"
        tail -n 30 "${LOG}" >&2
    fi
    exit 1
}

run() {
    # Run a command with its output going to the log only.
    echo "+ $*" >>"${LOG}"
    "$@" >>"${LOG}" 2>&1
}

have_debsrc() {
    grep -rqsE '^[[:space:]]*(Types:.*deb-src|deb-src[[:space:]])' \
        /etc/apt/sources.list "${SOURCES_DIR}"
}

ensure_debsrc() {
    local updated=0
    if ! have_debsrc; then
        local src="${SOURCES_DIR}/debian.sources"
        if [[ -f "${src}" ]]; then
            say "adding deb-src entries in ${DEBSRC_FILE}"
            # Copy every deb stanza of debian.sources as a deb-src stanza.
            awk 'BEGIN { RS = ""; ORS = "\n\n" }
                /(^|\n)Types:[^\n]*deb/ {
                    sub(/Types:[^\n]*/, "Types: deb-src"); print
                }' "${src}" >"${DEBSRC_FILE}.tmp"
            grep -q '^Types: deb-src' "${DEBSRC_FILE}.tmp" ||
                die "no deb stanza found in ${src}"
            mv "${DEBSRC_FILE}.tmp" "${DEBSRC_FILE}"
        else
            # A machine installed by debian-installer or debootstrap lists
            # its mirrors one per line in sources.list.
            src=/etc/apt/sources.list
            say "adding deb-src lines in ${DEBSRC_LIST}"
            sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "${src}" \
                >"${DEBSRC_LIST}.tmp" 2>/dev/null || true
            [[ -s "${DEBSRC_LIST}.tmp" ]] ||
                die "no deb line found in ${src} or ${SOURCES_DIR}"
            mv "${DEBSRC_LIST}.tmp" "${DEBSRC_LIST}"
        fi
        run apt-get update || die "apt-get update failed"
        updated=1
    fi
    if ! apt-cache showsrc qemu 2>/dev/null | grep -q '^Version:'; then
        if [[ "${updated}" == 0 ]]; then
            run apt-get update || die "apt-get update failed"
        fi
    fi
}

ensure_build_deps() {
    # Also on a cached build: the packages bring the shared libraries the
    # tools load.
    "${INSTALL_DEPS}" --debs-only qemu >>"${LOG}" 2>&1 ||
        die "installing the build dependencies failed"
}

# Source package version that "apt-get source qemu" would fetch, taken from
# the .dsc file name (epoch-less, e.g. 7.2+dfsg-7+deb12u18).
qemu_source_version() {
    apt-get source --print-uris qemu 2>/dev/null |
        sed -n "s/^'[^']*' qemu_\\([^ ]*\\)\\.dsc .*/\\1/p" | head -n 1
}

compute_hash() {
    local version="$1" f
    {
        for f in "${HASH_FILES[@]}"; do
            printf '%s\n' "${f}"
            sha256sum <"${HERE}/${f}"
        done
        printf 'debian-qemu-source %s\n' "${version}"
    } | sha256sum | cut -c1-16
}

prefix_complete() {
    local prefix="$1" t
    for t in "${TOOLS[@]}"; do
        [[ -x "${prefix}/bin/${t}" ]] || return 1
    done
    return 0
}

fetch_source() {
    local version="$1"
    local stamp="${SRCROOT}/.debian-version"
    if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${version}" ]]; then
        return 0
    fi
    say "fetching qemu source ${version} into ${SRCROOT}"
    rm -rf "${SRCROOT}"
    mkdir -p "${SRCROOT}"
    (cd "${SRCROOT}" && run apt-get source qemu) ||
        die "apt-get source qemu failed"
    echo "${version}" >"${stamp}"
}

source_dir() {
    local d
    for d in "${SRCROOT}"/qemu-*/; do
        if [[ -f "${d}/block/meson.build" ]]; then
            echo "${d%/}"
            return 0
        fi
    done
    return 1
}

install_driver() {
    local src="$1"
    # Copy only what changed so ninja rebuilds the minimum.
    local f dst
    for f in "${DRIVER_FILES[@]}"; do
        dst="${src}/block/${f#block-}"
        if ! cmp -s "${HERE}/${f}" "${dst}"; then
            cp "${HERE}/${f}" "${dst}"
        fi
    done
    # Declare the driver in the QAPI schema (for blockdev-add).
    python3 "${HERE}/qapi-vmar.py" "${src}" >>"${LOG}" 2>&1 ||
        die "could not add vmar to qapi/block-core.json"
    # The NBD server lists no export (names carry their holder's key).
    python3 "${HERE}/nbd-private.py" "${src}" >>"${LOG}" 2>&1 ||
        die "could not make nbd/server.c list no export"
    if ! grep -q "'vmar.c'" "${src}/block/meson.build"; then
        printf '\n# vmar-openstack: read-only VMAR block map driver\n%s\n' \
            "block_ss.add(files('vmar.c', 'vmar-map.c'), zlib)" \
            >>"${src}/block/meson.build"
    fi
    if ! grep -q "'vmar-mirror.c'" "${src}/block/meson.build"; then
        printf '\n# vmar-openstack: on-demand verified base mirrors\n%s\n' \
            "block_ss.add(files('vmar-mirror.c'), dependency('libcrypto'))" \
            >>"${src}/block/meson.build"
    fi
}

configure_qemu() {
    local src="$1" build="$1/build"
    if [[ -f "${build}/build.ninja" ]]; then
        return 0
    fi
    say "configuring (log: ${LOG})"
    mkdir -p "${build}"
    # The prefix is a fixed staging path: binaries are copied into the
    # hashed prefix afterwards, so the build directory and its ccache
    # entries stay the same from one driver version to the next.
    (cd "${build}" && run ../configure \
        --prefix="${WORK}/stage" \
        --cc="ccache gcc" --cxx="ccache g++" \
        --without-default-features \
        --disable-system --disable-user \
        --enable-tools \
        --enable-linux-aio --enable-linux-io-uring \
        --enable-zstd --enable-attr --enable-cap-ng \
        --disable-docs --disable-werror \
        --disable-guest-agent --disable-install-blobs) ||
        die "configure failed"
}

build_qemu() {
    local src="$1" build="$1/build"
    say "building ${TOOLS[*]} with ninja -j${JOBS} (log: ${LOG})"
    export CCACHE_DIR="${CACHE}/ccache"
    export CCACHE_BASEDIR="${src}"
    mkdir -p "${CCACHE_DIR}"
    (cd "${build}" && run ninja -j"${JOBS}" "${TARGETS[@]}") ||
        die "ninja failed"
}

install_prefix() {
    local src="$1" prefix="$2" version="$3" tmp i
    tmp="$(mktemp -d "${prefix}.tmp.XXXXXX")"
    mkdir -p "${tmp}/bin"
    for i in "${!TOOLS[@]}"; do
        install -m 0755 "${src}/build/${TARGETS[i]}" \
            "${tmp}/bin/${TOOLS[i]}"
    done
    {
        echo "debian-qemu-source ${version}"
        echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        (cd "${HERE}" && sha256sum "${HASH_FILES[@]}")
    } >"${tmp}/BUILDINFO"
    chmod 0755 "${tmp}"
    rm -rf "${prefix}"
    mv "${tmp}" "${prefix}"
}

main() {
    mkdir -p "${WORK}"
    # One build at a time: the source tree and build directory are shared.
    exec 9>"${WORK}/lock"
    flock 9
    : >"${LOG}"
    local f
    for f in "${HASH_FILES[@]}"; do
        [[ -f "${HERE}/${f}" ]] || die "missing ${HERE}/${f}"
    done

    ensure_build_deps
    ensure_debsrc
    local version
    version="$(qemu_source_version)"
    [[ -n "${version}" ]] || die "cannot determine the qemu source version"

    local prefix
    prefix="${CACHE}/qemu-$(compute_hash "${version}")"
    case "${prefix}" in
        /usr | /usr/*) die "refusing to install into ${prefix}" ;;
    esac
    if prefix_complete "${prefix}"; then
        say "up to date"
        echo "${prefix}"
        return 0
    fi

    fetch_source "${version}"
    local src
    src="$(source_dir)" || die "no qemu source tree under ${SRCROOT}"
    install_driver "${src}"
    configure_qemu "${src}"
    build_qemu "${src}"
    install_prefix "${src}" "${prefix}" "${version}"
    say "installed into ${prefix}"
    echo "${prefix}"
}

main "$@"
