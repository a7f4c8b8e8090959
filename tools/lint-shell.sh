#!/bin/bash
# Lint every shell script of the project with shellcheck and bashate.
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
mapfile -t scripts < <(git ls-files '*.sh' .ci/run tools/test-guest-init \
    devstack/plugin.sh devstack/settings devstack/lib/vmar 2>/dev/null | sort -u | while read -r f; do
        [ -f "$f" ] && echo "$f"; done)
[ "${#scripts[@]}" -gt 0 ] || exit 0
shellcheck -x "${scripts[@]}"
bashate -i E006 "${scripts[@]}"
