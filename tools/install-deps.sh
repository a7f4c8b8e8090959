#!/bin/bash
# Install what vmar-openstack needs on a fresh Debian 12 machine (as root):
# Debian packages, then a virtualenv in .venv with the project installed.
#
# Usage: tools/install-deps.sh [--debs-only] [PURPOSE...]
#
# PURPOSE is one of cloud, demo, qemu, test, nova33 (the unit tests against
# the Nova release before the newest, in a virtualenv of their own: set
# VMAR_VENV). Each purpose has its Debian packages
# in bindep.txt (profile PURPOSE) and, where it needs Python packages, a
# PURPOSE-requirements.txt next to requirements.txt. What every purpose
# needs (no profile in bindep.txt, requirements.txt) is always installed.
# --debs-only installs the Debian packages and leaves the project's pip
# requirements alone (qemu/build.sh uses it).
#
# The last line on stdout is the virtualenv's path; progress goes to stderr.
# Environment: VMAR_VENV (default .venv in the tree), VMAR_PYTHON (default
# python3).
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VMAR_VENV:-$TOP/.venv}
PYTHON=${VMAR_PYTHON:-python3}
# bindep reads bindep.txt; it runs from the virtualenv, so the two packages
# the virtualenv needs come first, by name.
BOOTSTRAP=(python3 python3-venv)
BINDEP_REQ='bindep>=2.11.0'

debs_only=0
purposes=()
for arg in "$@"; do
    case $arg in
        --debs-only) debs_only=1 ;;
        cloud | demo | qemu | test | nova33) purposes+=("$arg") ;;
        *)
            echo "usage: $0 [--debs-only] [cloud|demo|qemu|test|nova33]..." >&2
            exit 2
            ;;
    esac
done

APT_LOG=/var/log/vmar-openstack-install.log
apt_updated=0
apt_install() {
    [ "$#" -gt 0 ] || return 0
    echo "installing Debian packages (log: $APT_LOG): $*" >&2
    export DEBIAN_FRONTEND=noninteractive
    {
        [ "$apt_updated" = 1 ] || apt-get update -q
        apt_updated=1
        apt-get install -y -q --no-install-recommends "$@"
    } >>"$APT_LOG" 2>&1 || {
        tail -n 30 "$APT_LOG" >&2
        echo "apt-get failed; see $APT_LOG" >&2
        return 1
    }
}

missing=()
for p in "${BOOTSTRAP[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' \
        || missing+=("$p")
done
apt_install "${missing[@]}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtualenv $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
if [ ! -x "$VENV/bin/bindep" ]; then
    "$VENV/bin/pip" install -q --upgrade pip >&2
    "$VENV/bin/pip" install -q "$BINDEP_REQ" >&2
fi

# bindep exits 1 when something is missing and prints one package a line.
mapfile -t missing < <("$VENV/bin/bindep" -b -f "$TOP/bindep.txt" \
    "${purposes[@]}" || true)
apt_install "${missing[@]}"
if "$VENV/bin/bindep" -b -f "$TOP/bindep.txt" "${purposes[@]}" >/dev/null
then :; else
    echo "still missing after apt-get install:" \
        "$("$VENV/bin/bindep" -b -f "$TOP/bindep.txt" "${purposes[@]}")" >&2
    exit 1
fi

# pip: requirements.txt with the project itself, then each purpose's file;
# each set is installed again only when its inputs change.
pip_install() {
    local name=$1 stamp want
    shift
    stamp="$VENV/.vmar-reqs-$name"
    want=$(cat "$@" | sha256sum | cut -d' ' -f1)
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
    if [ "$name" = base ]; then
        "$VENV/bin/pip" install -q -r "$TOP/requirements.txt" >&2
        "$VENV/bin/pip" install -q -e "$TOP" >&2
    else
        "$VENV/bin/pip" install -q -r "$TOP/$name-requirements.txt" >&2
    fi
    echo "$want" > "$stamp"
}
if [ "$debs_only" = 0 ]; then
    pip_install base "$TOP/requirements.txt" "$TOP/setup.cfg" \
        "$TOP/setup.py" "$TOP/vmar_openstack/fingerprint/_blockhash.c"
    for purpose in "${purposes[@]}"; do
        [ -f "$TOP/$purpose-requirements.txt" ] || continue
        # a purpose's file may include others (-r): hash them all
        pip_install "$purpose" "$TOP"/*requirements.txt \
            "$TOP/doc/requirements.txt"
    done
fi
echo "$VENV"
