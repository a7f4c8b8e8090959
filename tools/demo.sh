#!/bin/bash
# The vmar-openstack demo on a fresh Debian 12 machine (as root).
#
# Builds (or reuses) a small, byte-reproducible Debian bookworm image
# library, ingests it into an embedded SQLite library with vmar-manage, and
# prints the dedup and map figures. Then the host side (tools/demo_host.py):
# vmar-export, on the patched QEMU (qemu/build.sh, cached), serves minbase
# and python3 over NBD; both are read in full through their exports and as
# plain raw files, and the host page cache each way is printed next to the
# unique-block limit. A PNG chart of the figures goes into the state dir
# ($VMAR_DEMO_STATE, default /var/tmp/vmar-demo); the last line names it.
# Nothing the demo starts is left running. VMAR_QEMU_PREFIX names an
# already built patched QEMU instead (as for the functional tests).
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
VENV=$(tools/install-deps.sh demo | tail -n 1)
export PATH="$VENV/bin:$PATH"

LIBRARY=${VMAR_IMAGE_LIBRARY:-/var/cache/vmar-openstack/images}
STATE=${VMAR_DEMO_STATE:-/var/tmp/vmar-demo}

# Whatever happens, stop what tools/demo_host.py started (it stops it itself
# unless it is killed hard); also what an earlier, killed run left.
stop_host() { python3 tools/demo_host.py stop --state "$STATE" || true; }
trap stop_host EXIT
stop_host

if [ -n "${VMAR_QEMU_PREFIX:-}" ]; then
    QEMU_PREFIX=$VMAR_QEMU_PREFIX
else
    echo "== building the patched QEMU (qemu/build.sh, cached)" >&2
    QEMU_PREFIX=$(qemu/build.sh | tail -n 1)
fi

echo "== building the Debian image library in $LIBRARY (cached)" >&2
# One "<name> <path>" line per image, however many the library has.
mapfile -t images < <(tools/build-image-library.sh "$LIBRARY" |
    awk 'NF == 2 && $2 ~ /^\//')
[ "${#images[@]}" -gt 0 ] || { echo "no image built" >&2; exit 1; }

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
host_args=()
for entry in "${images[@]}"; do
    name=${entry%% *}
    path=${entry#* }
    id=$(python3 -c "import uuid; print(uuid.uuid5(uuid.NAMESPACE_URL, \
'vmar-demo/$name'))")
    echo "== vmar-manage image add $name ($path)"
    manage image add --id "$id" --visibility public "$path"
    host_args+=(--image "$name" "$id" "$path")
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
echo "== the host side: vmar-export, page cache and chart (tools/demo_host.py)"
python3 tools/demo_host.py run --config-file "$STATE/vmar.conf" \
    --qemu-prefix "$QEMU_PREFIX" "${host_args[@]}" --pair minbase python3
