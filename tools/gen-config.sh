#!/bin/bash
# Regenerate etc/vmar/vmar.conf.sample; with --check, fail if it is stale.
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
sample=etc/vmar/vmar.conf.sample
if [ "${1:-}" = "--check" ]; then
    tmp=$(mktemp)
    trap 'rm -f "$tmp"' EXIT
    oslo-config-generator --config-file etc/vmar/vmar-config-generator.conf \
        --output-file "$tmp"
    if ! diff -u "$sample" "$tmp"; then
        echo "$sample is stale: run tools/gen-config.sh" >&2
        exit 1
    fi
else
    oslo-config-generator --config-file etc/vmar/vmar-config-generator.conf
fi
