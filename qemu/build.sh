#!/bin/bash
# Build the QEMU tools with the vmar drivers, for one QEMU version.
#
#   qemu/build.sh [--qemu VERSION] [--deb]
#   qemu/build.sh [--qemu VERSION] --series
#
# VERSION is one of (default 7.2, Debian 12's own):
#   7.2    Debian 12's source package (bookworm, with Debian's patches)
#   10.0   Debian 13's source package (trixie, with Debian's patches)
#   10.2   the newest upstream release whose source Debian carries
#          (sid's orig tarball: upstream less non-free blobs, no Debian
#          patch)
#
# Sources come through a private apt state under the cache
# ($VMAR_QEMU_CACHE/apt/<version>): the machine's apt sources are not
# touched.  Every build starts from a fresh extraction of the source, in a
# directory of its own version, applies the series qemu/patches/<version>/
# (qemu/series.py makes it), checks that the series carries the drivers of
# this tree, configures, and builds qemu-img, qemu-io, qemu-nbd and
# qemu-storage-daemon with ccache.  The result goes into
#   $VMAR_QEMU_CACHE/qemu-<version>-<hash>
# where <hash> covers the series, this script and the source version.  If
# the prefix already holds the tools nothing is built.  The last line on
# stdout is the prefix; progress goes to stderr and the noise to
# $VMAR_QEMU_CACHE/qemu-build/<version>/build.log.
#
# --series makes the series again (qemu/series.py) from a pristine tree
# of the version's source, after a change of the drivers in qemu/.
#
# --deb also writes a Debian package of the tools (qemu/mkdeb.sh),
# vmar-qemu-tools-<version>_<source version>+vmar<hash>_<arch>.deb, into
# the prefix: it installs under /usr/lib/vmar-qemu/<version>, beside
# Debian's qemu and the other versions' packages.
#
# Environment:
#   VMAR_QEMU_CACHE  cache root (default /var/cache/vmar-openstack)
#   VMAR_QEMU_JOBS   ninja -j value (default 2)

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${VMAR_QEMU_CACHE:-/var/cache/vmar-openstack}"
JOBS="${VMAR_QEMU_JOBS:-2}"
TOOLS=(qemu-img qemu-io qemu-nbd qemu-storage-daemon)
# Ninja targets (paths inside the build directory), same order as TOOLS.
TARGETS=(qemu-img qemu-io qemu-nbd storage-daemon/qemu-storage-daemon)
# Build dependencies: bindep.txt, profile "qemu" (tools/install-deps.sh).
INSTALL_DEPS="${HERE}/../tools/install-deps.sh"
# Python packages QEMU >= 8's configure needs (their wheels are not in
# Debian's +ds tarballs): installed into a venv of the build
BUILD_PYTHON_REQS=(meson==1.9.0 pycotap==1.3.1)

VERSION=7.2
DEB=0
SERIES=0

say() {
    echo "build.sh: $*" >&2
}

die() {
    say "error: $*"
    if [[ -n "${LOG:-}" && -f "${LOG}" ]]; then
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

# The suites each version's source comes from, the package version to
# take (empty: the newest there), and whether Debian's patches apply.
version_table() {
    case "$1" in
        7.2)
            SUITES="bookworm bookworm-updates"
            SEC_SUITES="bookworm-security"
            PIN=""
            DEBIAN_PATCHES=1
            ;;
        10.0)
            SUITES="trixie trixie-updates"
            SEC_SUITES="trixie-security"
            PIN=""
            DEBIAN_PATCHES=1
            ;;
        10.2)
            SUITES="sid"
            SEC_SUITES=""
            PIN="1:10.2.2+ds-1"
            DEBIAN_PATCHES=0
            ;;
        *)
            die "unknown QEMU version '$1' (7.2, 10.0 or 10.2)"
            ;;
    esac
}

# The Debian mirror of this machine (its first deb source), and its
# security mirror.
mirror_uri() {
    local want="$1" f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "${f}" ]] || continue
        uri=$(awk -v want="${want}" 'BEGIN { RS = "" }
            /(^|\n)Types:[^\n]*deb/ {
                u = ""; s = ""
                n = split($0, l, "\n")
                for (i = 1; i <= n; i++) {
                    if (l[i] ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", l[i]); split(l[i], a, " "); u = a[1] }
                    if (l[i] ~ /^Suites:/) { s = l[i] }
                }
                if ((want == "security") == (s ~ /-security/)) { print u; exit }
            }' "${f}")
        if [[ -n "${uri}" ]]; then
            echo "${uri}"
            return 0
        fi
    done
    awk -v want="${want}" '$1 == "deb" {
            sec = ($3 ~ /-security/)
            if ((want == "security") == sec) { print $2; exit }
        }' /etc/apt/sources.list 2>/dev/null
}

# apt-get/apt-cache on the private state of this version
papt() {
    local tool="$1"
    shift
    "${tool}" -o Dir::Etc::SourceList="${APTDIR}/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="${APTDIR}/lists" \
        -o Dir::Cache="${APTDIR}/cache" "$@"
}

ensure_apt_state() {
    local main sec s
    main="$(mirror_uri main)"
    [[ -n "${main}" ]] || die "no Debian mirror in this machine's apt sources"
    sec="$(mirror_uri security)"
    mkdir -p "${APTDIR}/lists/partial" "${APTDIR}/cache/archives/partial"
    {
        for s in ${SUITES}; do
            echo "deb-src ${main} ${s} main"
        done
        if [[ -n "${sec}" ]]; then
            for s in ${SEC_SUITES}; do
                echo "deb-src ${sec} ${s} main"
            done
        fi
    } >"${APTDIR}/sources.list.new"
    # Refresh the lists once a day, or when the sources changed
    if ! cmp -s "${APTDIR}/sources.list.new" "${APTDIR}/sources.list" ||
        [[ -z "$(find "${APTDIR}/stamp" -mmin -1440 2>/dev/null)" ]]; then
        mv "${APTDIR}/sources.list.new" "${APTDIR}/sources.list"
        run papt apt-get update || die "apt-get update of ${APTDIR} failed"
        touch "${APTDIR}/stamp"
    else
        rm -f "${APTDIR}/sources.list.new"
    fi
}

# The source package version to build (epoch-less, e.g. 7.2+dfsg-7+deb12u18)
source_version() {
    local v="${PIN}"
    if [[ -z "${v}" ]]; then
        v=$(papt apt-cache showsrc qemu 2>/dev/null |
            sed -n 's/^Version: //p' | sort -V | tail -n 1)
    fi
    echo "${v#*:}"
}

ensure_build_deps() {
    # Also on a cached build: the packages bring the shared libraries the
    # tools load.
    "${INSTALL_DEPS}" --debs-only qemu >>"${LOG}" 2>&1 ||
        die "installing the build dependencies failed"
}

compute_hash() {
    local source="$1" f
    {
        for f in "${HERE}/patches/${VERSION}"/*.patch "${HERE}/build.sh"; do
            printf '%s\n' "${f##*/}"
            sha256sum <"${f}"
        done
        printf 'debian-qemu-source %s\n' "${source}"
    } | sha256sum | cut -c1-16
}

prefix_complete() {
    local prefix="$1" t
    for t in "${TOOLS[@]}"; do
        [[ -x "${prefix}/bin/${t}" ]] || return 1
    done
}

# With --deb, the package of the prefix (made once)
package() {
    local prefix="$1"
    [[ "${DEB}" == 1 ]] || return 0
    if ! compgen -G "${prefix}/*.deb" >/dev/null; then
        run "${HERE}/mkdeb.sh" "${prefix}" ||
            die "building the Debian package of ${prefix} failed"
    fi
    say "package: $(compgen -G "${prefix}/*.deb")"
}

# Download the source package once per version into $WORK/download
fetch_source() {
    local source="$1" dl="${WORK}/download"
    if [[ -f "${dl}/.version" && "$(cat "${dl}/.version")" == "${source}" ]]; then
        return 0
    fi
    say "fetching the qemu ${source} source package"
    rm -rf "${dl}"
    mkdir -p "${dl}"
    local want="qemu"
    [[ -z "${PIN}" ]] || want="qemu=${PIN}"
    (cd "${dl}" && run papt apt-get source --download-only "${want}") ||
        die "apt-get source ${want} failed"
    echo "${source}" >"${dl}/.version"
}

# A fresh, unpatched source tree in $1
extract_source() {
    local dl="${WORK}/download" src="$1"
    rm -rf "${src}"
    if [[ "${DEBIAN_PATCHES}" == 1 ]]; then
        run dpkg-source --no-check -x "${dl}"/qemu_*.dsc "${src}" ||
            die "dpkg-source -x failed"
    else
        mkdir -p "${src}"
        run tar --no-same-owner --strip-components=1 -xf \
            "${dl}"/qemu_*.orig.tar.* -C "${src}" ||
            die "extracting the orig tarball failed"
    fi
}

# A fresh source tree in $WORK/src, with the series applied
prepare_tree() {
    local src="${WORK}/src" p
    extract_source "${src}"

    for p in "${HERE}/patches/${VERSION}"/*.patch; do
        run git -C "${src}" apply --whitespace=nowarn "${p}" ||
            die "${p##*/} does not apply to ${VERSION}"
    done
    # The series follows this tree's own coding style
    for p in "${HERE}/patches/${VERSION}"/*.patch; do
        (cd "${src}" && run perl scripts/checkpatch.pl --no-tree "${p}") ||
            die "${p##*/}: checkpatch.pl of QEMU ${VERSION} fails"
    done
    python3 "${HERE}/series.py" check "${src}" >>"${LOG}" 2>&1 ||
        die "qemu/patches/${VERSION} does not carry the drivers of qemu/: run qemu/build.sh --qemu ${VERSION} --series"
}

configure_qemu() {
    local src="${WORK}/src" build="${WORK}/src/build" py=()
    say "configuring QEMU ${VERSION} (log: ${LOG})"
    if [[ "${VERSION}" != 7.2 ]]; then
        if [[ ! -x "${WORK}/pyvenv/bin/meson" ]]; then
            run python3 -m venv "${WORK}/pyvenv" ||
                die "cannot make the build venv"
            run "${WORK}/pyvenv/bin/pip" install -q \
                "${BUILD_PYTHON_REQS[@]}" ||
                die "cannot install ${BUILD_PYTHON_REQS[*]}"
        fi
        py=(--python="${WORK}/pyvenv/bin/python3")
    fi
    mkdir -p "${build}"
    # The prefix is a fixed staging path: the tools are copied into the
    # hashed prefix afterwards, so the build and its ccache entries stay
    # the same from one driver version to the next.
    (cd "${build}" && run ../configure "${py[@]}" \
        --prefix="${WORK}/stage" \
        --cc="ccache gcc" --cxx="ccache g++" \
        --without-default-features \
        --disable-system --disable-user \
        --enable-tools \
        --enable-linux-aio --enable-linux-io-uring \
        --enable-zstd --enable-attr --enable-cap-ng \
        --enable-gnutls \
        --disable-docs --disable-werror \
        --disable-guest-agent --disable-install-blobs) ||
        die "configure failed"
}

build_qemu() {
    local src="${WORK}/src"
    say "building ${TOOLS[*]} of QEMU ${VERSION} with ninja -j${JOBS}"
    export CCACHE_DIR="${CACHE}/ccache"
    export CCACHE_BASEDIR="${src}"
    mkdir -p "${CCACHE_DIR}"
    (cd "${src}/build" && run ninja -j"${JOBS}" "${TARGETS[@]}") ||
        die "ninja failed"
    if [[ "${VERSION}" != 7.2 ]] && command -v clang >/dev/null; then
        run python3 "${HERE}/tsa-check.py" "${src}/build" ||
            die "the graph-lock annotations of the vmar drivers are wrong (clang -Wthread-safety)"
    fi
}

install_prefix() {
    local prefix="$1" source="$2" tmp i
    tmp="$(mktemp -d "${prefix}.tmp.XXXXXX")"
    mkdir -p "${tmp}/bin"
    for i in "${!TOOLS[@]}"; do
        install -m 0755 "${WORK}/src/build/${TARGETS[i]}" \
            "${tmp}/bin/${TOOLS[i]}"
    done
    # The iotests of the drivers, with what runs them against this build
    # (qemu/run-iotests.sh; iotests.py finds ../../python)
    mkdir -p "${tmp}/tests"
    cp -a "${WORK}/src/tests/qemu-iotests" "${tmp}/tests/qemu-iotests"
    cp -a "${WORK}/src/python" "${tmp}/python"
    {
        echo "qemu-version ${VERSION}"
        echo "debian-qemu-source ${source}"
        echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        (cd "${HERE}" && sha256sum "patches/${VERSION}"/*.patch)
    } >"${tmp}/BUILDINFO"
    chmod 0755 "${tmp}"
    rm -rf "${prefix}"
    mv "${tmp}" "${prefix}"
}

main() {
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --qemu) VERSION="${2:?--qemu needs a version}"; shift 2 ;;
            --deb) DEB=1; shift ;;
            --series) SERIES=1; shift ;;
            -h | --help) sed -n '2,36p' "$0"; exit 0 ;;
            *) die "unknown argument '$1'" ;;
        esac
    done
    version_table "${VERSION}"
    WORK="${CACHE}/qemu-build/${VERSION}"
    APTDIR="${CACHE}/apt/${VERSION}"
    LOG="${WORK}/build.log"
    mkdir -p "${WORK}"
    # One build of a version at a time: its tree is rebuilt from scratch.
    exec 9>"${WORK}/lock"
    flock 9
    : >"${LOG}"

    ensure_build_deps
    ensure_apt_state
    local source
    source="$(source_version)"
    [[ -n "${source}" ]] || die "no qemu source package in ${SUITES}"
    if [[ "${SERIES}" == 1 ]]; then
        fetch_source "${source}"
        extract_source "${WORK}/pristine"
        python3 "${HERE}/series.py" make "${VERSION}" "${WORK}/pristine" ||
            die "making the series of ${VERSION} failed"
        rm -rf "${WORK}/pristine"
        return 0
    fi
    compgen -G "${HERE}/patches/${VERSION}/*.patch" >/dev/null ||
        die "no series in ${HERE}/patches/${VERSION}"

    local prefix
    prefix="${CACHE}/qemu-${VERSION}-$(compute_hash "${source}")"
    case "${prefix}" in
        /usr | /usr/*) die "refusing to install into ${prefix}" ;;
    esac
    if prefix_complete "${prefix}"; then
        say "QEMU ${VERSION} up to date"
        package "${prefix}"
        echo "${prefix}"
        return 0
    fi

    fetch_source "${source}"
    prepare_tree
    configure_qemu
    build_qemu
    install_prefix "${prefix}" "${source}"
    say "installed QEMU ${VERSION} (${source}) into ${prefix}"
    package "${prefix}"
    echo "${prefix}"
}

main "$@"
