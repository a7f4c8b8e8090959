#!/bin/bash
# An all-in-one OpenStack on this machine, from the project's own files:
# MariaDB, RabbitMQ, Keystone, Placement, Glance (with the vmar_mapgen
# import plugin), Neutron (API only), Nova (api, conductor, scheduler,
# vmar-nova-compute with libvirt/TCG), vmar-agent and vmar-export.
#
# Usage: tools/cloud.sh up [--computes N]|down [--purge]|status
#                       [--state-dir DIR]
#
#   up      install what is missing (tools/install-deps.sh cloud, the
#           patched QEMU of qemu/build.sh), then start every service that
#           is not running; the last line on stdout is an admin openrc.
#           --computes N (N > 1, a new cloud only): N compute hosts, each
#           in mount, UTS and network namespaces of its own with its own
#           libvirtd, sshd, vmar-export and vmar-nova-compute
#   status  one line per service: state, pids, endpoint (exit 3 if any
#           service is down)
#   down    stop everything up started, destroy its libvirt domains;
#           --purge also removes the state directory
#
# State (configuration, databases, logs, images, instances):
# $VMAR_CLOUD_STATE, default /var/lib/vmar-cloud. VMAR_QEMU_PREFIX, if set,
# is the patched QEMU (else qemu/build.sh). See doc/source/install/cloud.rst.
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
case $cmd in
    up)
        venv=$("$TOP/tools/install-deps.sh" cloud | tail -n 1)
        qemu=${VMAR_QEMU_PREFIX:-$("$TOP/qemu/build.sh" | tail -n 1)}
        shift
        cd "$TOP"
        exec "$venv/bin/python" -m tools.cloud up --qemu-prefix "$qemu" "$@"
        ;;
    down | status)
        venv=${VMAR_VENV:-$TOP/.venv}
        if [ ! -x "$venv/bin/python" ]; then
            echo "no virtualenv at $venv: nothing was started" >&2
            [ "$cmd" = down ] && exit 0
            exit 3
        fi
        shift
        cd "$TOP"
        exec "$venv/bin/python" -m tools.cloud "$cmd" "$@"
        ;;
    *)
        echo "usage: $0 up [--computes N]|down [--purge]|status" \
            "[--state-dir DIR]" >&2
        exit 2
        ;;
esac
