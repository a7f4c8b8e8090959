#!/bin/bash
# Generate the configuration samples (etc/vmar, etc/glance) with
# oslo-config-generator; with --check, fail if a committed one is stale.
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
status=0
for gen in etc/vmar/vmar-config-generator.conf \
        etc/vmar/vmar-export-generator.conf \
        etc/vmar/nova-vmar-generator.conf \
        etc/vmar/vmar-agent-generator.conf \
        etc/vmar/nova-scheduler-vmar-generator.conf \
        etc/glance/glance-api-generator.conf \
        etc/glance/glance-image-import-generator.conf; do
    sample=$(sed -n 's/^output_file = //p' "$gen")
    if [ "${1:-}" = "--check" ]; then
        tmp=$(mktemp)
        oslo-config-generator --config-file "$gen" --output-file "$tmp"
        if ! diff -u "$sample" "$tmp"; then
            echo "$sample is stale: run tools/gen-config.sh" >&2
            status=1
        fi
        rm -f "$tmp"
    else
        oslo-config-generator --config-file "$gen"
    fi
done
exit "$status"
