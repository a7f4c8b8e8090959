#!/bin/bash
# Build and run the libFuzzer harness over the VMAR map parser.
#
# Usage: run.sh [SECONDS | -runs=N] [extra libFuzzer flags...]
#   (default: 60 seconds)
#
# Builds fuzz-vmar-map.c + ../vmar-map.c with clang
# -fsanitize=fuzzer,address,undefined into $VMAR_FUZZ_DIR (default
# /var/cache/vmar-openstack/fuzz), runs it over a working corpus there,
# seeded from seeds/ beside this script, and writes the outcome (executions,
# time, crash or not) to RESULT.txt beside this script.  Crash inputs are
# kept in $VMAR_FUZZ_DIR/artifacts.  Exit status is libFuzzer's.

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
QEMU_DIR="$(dirname "${HERE}")"
WORK="${VMAR_FUZZ_DIR:-/var/cache/vmar-openstack/fuzz}"
# where the summary goes (CI points it away from the clone)
RESULT="${VMAR_FUZZ_RESULT:-${HERE}/RESULT.txt}"
CLANG="${CLANG:-clang}"
BIN="${WORK}/fuzz-vmar-map"
LOG="${WORK}/fuzz.log"

limit=(-max_total_time=60)
if [[ $# -gt 0 ]]; then
    case "$1" in
        -runs=*) limit=("$1") ;;
        *[!0-9]*)
            echo "usage: run.sh [SECONDS | -runs=N] [libFuzzer flags]" >&2
            exit 2
            ;;
        *) limit=(-max_total_time="$1") ;;
    esac
    shift
fi

if ! command -v "${CLANG}" >/dev/null; then
    echo "run.sh: ${CLANG} not found (apt-get install clang)" >&2
    exit 2
fi

mkdir -p "${WORK}/corpus" "${WORK}/artifacts"
"${CLANG}" -g -O1 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I"${QEMU_DIR}" \
    -o "${BIN}" "${HERE}/fuzz-vmar-map.c" "${QEMU_DIR}/vmar-map.c" -lz

rc=0
"${BIN}" "${limit[@]}" -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="${WORK}/artifacts/" "$@" \
    "${WORK}/corpus" "${HERE}/seeds" >"${LOG}" 2>&1 || rc=$?

runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "${LOG}" | tail -n 1)"
secs="$(sed -n 's/^stat::average_exec_per_sec: *//p' "${LOG}" | tail -n 1)"
done_line="$(grep -E '^Done [0-9]+ runs' "${LOG}" | tail -n 1 || true)"
cov="$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "${LOG}" | tail -n 1 || true)"
if [[ "${rc}" == 0 ]]; then
    result="no crash, no sanitizer report"
else
    result="FAILED (exit ${rc}); see ${LOG} and ${WORK}/artifacts"
fi

{
    printf '%s%s\n' "VMAR map parser fuzzing (libFuzzer; clang " \
        "-fsanitize=fuzzer,address,undefined)"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "command: fuzz/run.sh ${limit[*]} $*"
    echo "clang: $("${CLANG}" --version | head -n 1)"
    echo "parser sha256: $(sha256sum <"${QEMU_DIR}/vmar-map.c" | cut -c1-16)"
    echo "executions: ${runs:-unknown}"
    echo "exec/s: ${secs:-unknown}"
    echo "libFuzzer: ${done_line:-no Done line}"
    echo "coverage: ${cov:-unknown}"
    echo "corpus: $(find "${WORK}/corpus" -type f | wc -l) files"
    echo "result: ${result}"
} >"${RESULT}"
cat "${RESULT}"
exit "${rc}"
