#!/bin/bash
# The user's path through an all-in-one cloud, with the openstack CLI.
#
# Starts the cloud of tools/cloud.sh (or reuses the running one), then runs
# tools/cloud_scenario.py against it: three images uploaded (two with
# --file, one with --import) and their maps published by vmar-agent; a vmar
# flavor and a plain one (vmar:bogus=1 refused); two vmar servers and a
# plain one booted to the VMAR-BOOTED marker; the host page cache of the
# two vmar bases; every lifecycle operation on a vmar server; nova-compute
# restarted under Nova's image cache manager; the export daemon killed;
# an image other maps point into deleted; everything deleted again.
# Each step prints what it saw; the last lines are the figures (JSON).
#
# The cloud keeps running afterwards (tools/cloud.sh down stops it;
# --down does it here). The scenario needs an empty cloud: it uses fixed
# names. State: $VMAR_CLOUD_STATE (default /var/lib/vmar-cloud). About
# 25 minutes on two cores under TCG (doc/source/install/cloud.rst).
set -euo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
cd "$TOP"
down=0
for arg in "$@"; do
    case $arg in
        --down) down=1 ;;
        *) echo "usage: $0 [--down]" >&2; exit 2 ;;
    esac
done

# Nova's image cache manager every 10 s, so the scenario sees it run
export VMAR_CLOUD_IMAGE_CACHE_INTERVAL=${VMAR_CLOUD_IMAGE_CACHE_INTERVAL:-10}
openrc=$(tools/cloud.sh up | tail -n 1)
echo "== the cloud is up; its admin credentials: $openrc"
status=0
.venv/bin/python -m tools.cloud_scenario --openrc "$openrc" || status=$?
if [ "$down" = 1 ]; then
    tools/cloud.sh down
else
    echo "== the cloud keeps running: . $openrc; tools/cloud.sh down stops it"
fi
exit "$status"
