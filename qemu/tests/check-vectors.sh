#!/bin/bash
# Check the C map reader and the QEMU vmar driver against the test vectors.
#
# Usage: check-vectors.sh [--no-qemu] [--prefix QEMU_PREFIX] [VECTORS_DIR]
#
# For every NAME.vmap in VECTORS_DIR (default: tests/vectors of the repo):
#  * the standalone parser (tests/vmar-check.c + vmar-map.c, built here with
#    ASan/UBSan) must accept it iff NAME.json says "valid": true;
#  * for a valid vector, the standalone reader must rebuild NAME.expected,
#    and so must "qemu-img convert" through the vmar driver, with the
#    targets given by base-dir;
#  * for an invalid vector, qemu-img must refuse to open it.
# Targets are looked up in the directory named by the JSON's "base_dir"
# (relative to VECTORS_DIR), files named <uuid>; without "base_dir", in a
# scratch directory of <uuid> symlinks to VECTORS_DIR's <uuid>.img files.
#
# QEMU_PREFIX defaults to the one build.sh prints (build.sh is run, and does
# nothing if the build is up to date).  The last line is "N passed, N failed".

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
QEMU_DIR="$(dirname "${HERE}")"
REPO="$(dirname "${QEMU_DIR}")"
USE_QEMU=1
PREFIX=""
VECTORS="${REPO}/tests/vectors"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-qemu) USE_QEMU=0 ;;
        --prefix)
            PREFIX="$2"
            shift
            ;;
        -h | --help)
            sed -n '2,18p' "$0"
            exit 0
            ;;
        *) VECTORS="$1" ;;
    esac
    shift
done

[[ -d "${VECTORS}" ]] || {
    echo "check-vectors: no vectors directory ${VECTORS}" >&2
    exit 2
}

TMP="$(mktemp -d /tmp/vmar-check-vectors.XXXXXX)"
trap 'rm -rf "${TMP}"' EXIT

CC="${CC:-gcc}"
"${CC}" -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined \
    -fno-sanitize-recover=all -I"${QEMU_DIR}" -o "${TMP}/vmar-check" \
    "${HERE}/vmar-check.c" "${QEMU_DIR}/vmar-map.c" -lz

if [[ "${USE_QEMU}" == 1 && -z "${PREFIX}" ]]; then
    PREFIX="$("${QEMU_DIR}/build.sh" | tail -n 1)"
fi
QEMU_IMG="${PREFIX}/bin/qemu-img"
if [[ "${USE_QEMU}" == 1 && ! -x "${QEMU_IMG}" ]]; then
    echo "check-vectors: ${QEMU_IMG} not found" >&2
    exit 2
fi

# base-dir: <uuid> symlinks to the vectors' <uuid>.img (or <uuid>) files
BASE="${TMP}/base"
mkdir -p "${BASE}"
uuid_re='^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
for f in "${VECTORS}"/*; do
    name="$(basename "${f}")"
    if [[ "${name}" =~ ${uuid_re}(\.img)?$ ]]; then
        ln -sf "$(realpath "${f}")" "${BASE}/${name%.img}"
    fi
done

# JSON and image comparisons live in vectorutil.py
util() {
    python3 "${HERE}/vectorutil.py" "$@"
}

passed=0
failed=0
pass() {
    passed=$((passed + 1))
    echo "ok   $1"
}
fail() {
    failed=$((failed + 1))
    echo "FAIL $1: $2"
}

shopt -s nullglob
maps=("${VECTORS}"/*.vmap)
if [[ ${#maps[@]} -eq 0 ]]; then
    echo "check-vectors: no .vmap files in ${VECTORS}" >&2
    exit 2
fi

for map in "${maps[@]}"; do
    name="$(basename "${map}" .vmap)"
    json="${VECTORS}/${name}.json"
    if [[ ! -f "${json}" ]]; then
        fail "${name}" "missing ${name}.json"
        continue
    fi
    want="$(util valid "${json}")"
    rc=0
    msg="$("${TMP}/vmar-check" "${map}" 2>&1)" || rc=$?
    if [[ "${rc}" -gt 1 ]]; then
        fail "${name}" "parser error: ${msg}"
        continue
    fi
    if [[ "${want}" == true && "${rc}" != 0 ]]; then
        fail "${name}" "parser rejected a valid map: ${msg}"
        continue
    fi
    if [[ "${want}" == false && "${rc}" == 0 ]]; then
        fail "${name}" "parser accepted an invalid map"
        continue
    fi
    pass "${name} parser (${msg})"
    base="$(util base-dir "${json}" "${VECTORS}" "${BASE}")"

    if [[ "${want}" == true ]]; then
        rc=0
        msg="$("${TMP}/vmar-check" --dump "${map}" |
            util matches-dump "${json}" 2>&1)" || rc=$?
        if [[ "${rc}" != 0 ]]; then
            fail "${name}" "parsed map differs from ${name}.json: ${msg}"
        else
            pass "${name} matches ${name}.json"
        fi
        expected="${VECTORS}/${name}.expected"
        if [[ ! -f "${expected}" ]]; then
            fail "${name}" "missing ${name}.expected"
            continue
        fi
        rc=0
        msg="$("${TMP}/vmar-check" --read "${base}" "" "${TMP}/c.raw" \
            "${map}" 2>&1)" || rc=$?
        if [[ "${rc}" != 0 ]]; then
            fail "${name}" "standalone read failed: ${msg}"
        elif ! cmp -s "${TMP}/c.raw" "${expected}"; then
            fail "${name}" "standalone read differs from ${name}.expected"
        else
            pass "${name} standalone read (${msg})"
        fi
        rm -f "${TMP}/c.raw"
    fi

    [[ "${USE_QEMU}" == 1 ]] || continue
    spec="$(util vmar-json "$(realpath "${map}")" "$(realpath "${base}")")"
    if [[ "${want}" == true ]]; then
        rc=0
        msg="$("${QEMU_IMG}" convert -O raw "${spec}" "${TMP}/q.raw" 2>&1)" ||
            rc=$?
        if [[ "${rc}" != 0 ]]; then
            fail "${name}" "qemu-img convert failed: ${msg}"
        elif ! util same-image "${TMP}/q.raw" "${expected}"; then
            fail "${name}" "qemu-img convert output differs from expected"
        else
            pass "${name} qemu-img convert"
        fi
        rm -f "${TMP}/q.raw"
    else
        rc=0
        msg="$("${QEMU_IMG}" info "${spec}" 2>&1)" || rc=$?
        if [[ "${rc}" == 0 ]]; then
            fail "${name}" "qemu-img opened an invalid map"
        elif [[ "${msg}" != *"vmar map"* ]]; then
            fail "${name}" "unexpected qemu-img error: ${msg}"
        else
            pass "${name} qemu-img refuses (${msg##*: })"
        fi
    fi
done

echo "${passed} passed, ${failed} failed"
[[ "${failed}" == 0 ]]
