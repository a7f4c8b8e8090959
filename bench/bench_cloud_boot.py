#!/usr/bin/env python3
"""Server create to VMAR-BOOTED: a vmar flavor against a plain one.

On a running ``tools/cloud.sh`` cloud, with the ``openstack`` CLI: one image
of the bootable library (minbase by default) is uploaded, then each round
boots one server of a vmar flavor and one of a plain flavor from it, one
after the other (in alternating order), each timed from ``openstack server
create`` to the ``VMAR-BOOTED`` line on its console, and deleted. The plain
server is the baseline: stock Nova's qcow2 on ``_base``. Printed: each
time, the medians, and the ratio vmar / plain (below 1: the vmar server is
up sooner).

The first server of each kind also pays its host's one-time work (the
plain one fills ``_base`` from Glance, the vmar one fetches the map and
base and starts the export); later rounds reuse it. Round 1 is reported
apart for that reason.

Usage: bench_cloud_boot.py [--state-dir DIR] [--image minbase] [--rounds 3]
       [--json OUT]
"""

import argparse
import json
import os
import statistics
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOP)

from tools.cloud import config  # noqa: E402
from tools import cloud_scenario  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--state-dir')
    parser.add_argument('--image', default='minbase')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--json')
    args = parser.parse_args()
    cloud = config.Cloud(args.state_dir)
    path = cloud_scenario.UserPath(
        cloud.state_dir, cloud.path('openrc'), qemu_env.image_library(),
        echo=lambda text: print(text, flush=True))
    image = 'bench-' + args.image
    cli = path.os
    cli.run('image', 'create', '--disk-format', 'raw', '--container-format',
            'bare', '--file', path.images[args.image], image)
    path.ids[image] = cli.value('image', 'show', '-c', 'id', image)
    path.wait_map(image)
    flavors = {'vmar': 'bench.vmar', 'plain': 'bench.plain'}
    for kind, flavor in flavors.items():
        extra = (['--property', 'vmar:enabled=true'] if kind == 'vmar'
                 else [])
        cli.run('flavor', 'create', '--vcpus', '1', '--ram', '512',
                '--disk', '2', *extra, flavor)
    times = {'vmar': [], 'plain': []}
    try:
        for r in range(args.rounds):
            order = ('vmar', 'plain') if r % 2 == 0 else ('plain', 'vmar')
            for kind in order:
                name = 'bench-%s-%d' % (kind, r)
                t0 = path.create(name, flavors[kind], image)
                path.wait_status(name, 'ACTIVE')
                path.wait_booted(name, args.image)
                took = time.monotonic() - t0
                times[kind].append(took)
                print('round %d %-5s create -> VMAR-BOOTED %6.1f s'
                      % (r + 1, kind, took), flush=True)
                cli.run('server', 'delete', '--wait', name)
    finally:
        for flavor in flavors.values():
            cli.run('flavor', 'delete', flavor, check_rc=False)
        cli.run('image', 'delete', image, check_rc=False)
    first = times['vmar'][0] / times['plain'][0]
    print('round 1 (cold host): vmar %.1f s, plain %.1f s, ratio %.2f'
          % (times['vmar'][0], times['plain'][0], first))
    record = {'times': times, 'first_ratio': first}
    if args.rounds > 1:
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        record['median_warm'] = med
        record['ratio_warm'] = med['vmar'] / med['plain']
        print('rounds 2-%d (warm host), medians: vmar %.1f s, plain %.1f s,'
              ' ratio vmar/plain %.2f' % (args.rounds, med['vmar'],
                                          med['plain'],
                                          record['ratio_warm']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
