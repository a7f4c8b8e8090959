#!/bin/bash
# The vmar-openstack demo on a fresh Debian 12 machine (as root).
#
# Builds (or reuses) a small, byte-reproducible Debian bookworm image
# library, ingests it into an embedded SQLite library with vmar-manage, and
# prints the dedup and map figures.
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
VENV=$(tools/install-deps.sh demo | tail -n 1)
export PATH="$VENV/bin:$PATH"

LIBRARY=${VMAR_IMAGE_LIBRARY:-/var/cache/vmar-openstack/images}
STATE=${VMAR_DEMO_STATE:-/var/tmp/vmar-demo}

echo "== building the Debian image library in $LIBRARY (cached)" >&2
mapfile -t images < <(tools/build-image-library.sh "$LIBRARY" | tail -n 4)

rm -rf "$STATE"
mkdir -p "$STATE"
cat > "$STATE/vmar.conf" <<CONF
[DEFAULT]
log_file = $STATE/vmar-manage.log

[vmar]
state_dir = $STATE
CONF
manage() { vmar-manage --config-file "$STATE/vmar.conf" "$@"; }

echo "== vmar-manage db sync"
manage db sync
for entry in "${images[@]}"; do
    name=${entry%% *}
    path=${entry#* }
    id=$(python3 -c "import uuid; print(uuid.uuid5(uuid.NAMESPACE_URL, \
'vmar-demo/$name'))")
    echo "== vmar-manage image add $name ($path)"
    manage image add --id "$id" --visibility public "$path"
done
echo "== vmar-manage image list"
manage image list
echo "== vmar-manage stats"
manage stats
echo "== vmar-manage check"
manage check
last_id=$(manage image list | awk 'NR > 1 {id = $2} END {print id}')
echo "== vmar-manage map verify $last_id"
manage map verify "$last_id"
echo "== map figures and lookup probes (bench/bench_library.py)"
args=()
for entry in "${images[@]}"; do
    args+=("${entry%% *}=${entry#* }")
done
python3 bench/bench_library.py "${args[@]}"
