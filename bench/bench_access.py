#!/usr/bin/env python3
"""The cost of per-holder exports on the read path, same-run ratios.

Every holder (instance) reads its image through an NBD export of its own,
named with the holder's key (doc/source/admin/export.rst, "Who can open an
export"). This measures what that costs against the shared export name
every instance used before, on one vmar node of one qemu-storage-daemon:

1. hot cache, fio (nbd engine, queue depth 16): sequential 1 MiB and random
   4 KiB reads through a holder's keyed export, while --holders other
   holders' exports exist, against a shared export of the same node;
2. opening an export: wall time of a qemu-io (system QEMU, as a guest's)
   that connects and reads 4 KiB, keyed against shared, medians of
   --opens runs.

Needs the patched QEMU (qemu/build.sh) and fio. Usage:
    bench_access.py --qemu-prefix DIR [--holders N] [--json OUT] IMAGE.raw
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_export  # noqa: E402

from vmar_openstack.host.exports import graph  # noqa: E402
from vmar_openstack.host import service as host_service  # noqa: E402
from vmar_openstack.host import supervisor  # noqa: E402
from vmar_openstack import ingest  # noqa: E402
from vmar_openstack import names  # noqa: E402

SYSTEM_QEMU_IO = '/usr/bin/qemu-io'


def open_and_read(uri):
    t = time.perf_counter()
    subprocess.run([SYSTEM_QEMU_IO, '-r', '-f', 'raw', '-c', 'read 0 4k',
                    uri], check=True, capture_output=True)
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--holders', type=int, default=200)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--runtime', type=int, default=10)
    p.add_argument('--opens', type=int, default=15)
    p.add_argument('--json')
    p.add_argument('image')
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix='vmar-bench-access-')
    sock = os.path.join(work, 'nbd.sock')
    conf = bench_export.make_conf(os.path.join(work, 'state'),
                                  args.qemu_prefix, sock)
    image_id = str(uuid.uuid4())
    ingest.Library(conf).add(image_id, args.image, visibility='public')
    svc = host_service.ExportService(conf)
    proc = supervisor.Supervisor(svc).start_daemon()
    try:
        svc.restore()
        exp = svc.add(image_id, holder='bench')
        for i in range(args.holders):
            svc.add(image_id, holder='other-%d' % i)
        keyed = svc.uri(exp, 'bench')
        # the shared name of before: one more export of the same node
        with svc.monitor() as mon:
            mon.execute('block-export-add', {
                'type': 'nbd', 'id': 'shared',
                'node-name': graph.vmar_node(image_id, exp.map_version),
                'name': 'shared', 'writable': False})
        shared = names.nbd_uri('shared', sock)
        size = os.path.getsize(svc.base_file(image_id))
        fio = bench_export.fio
        for uri in (keyed, shared):
            fio(uri, 'read', '1M', size=size)
        rounds = {k: [] for k in ('seq_keyed', 'seq_shared', 'rand_keyed',
                                  'rand_shared', 'open_keyed',
                                  'open_shared')}
        for _ in range(args.rounds):
            for kind, uri in (('keyed', keyed), ('shared', shared)):
                rounds['seq_' + kind].append(
                    fio(uri, 'read', '1M', size=size)['MB_s'])
                rounds['rand_' + kind].append(
                    fio(uri, 'randread', '4k', runtime=args.runtime)['iops'])
        for _ in range(args.opens):
            for kind, uri in (('keyed', keyed), ('shared', shared)):
                rounds['open_' + kind].append(open_and_read(uri))
        med = {k: statistics.median(v) for k, v in rounds.items()}
        res = {
            'holders': args.holders + 1,
            'seq_1M_keyed_MB_s': med['seq_keyed'],
            'seq_1M_shared_MB_s': med['seq_shared'],
            'seq_ratio': med['seq_keyed'] / med['seq_shared'],
            'rand_4k_keyed_iops': med['rand_keyed'],
            'rand_4k_shared_iops': med['rand_shared'],
            'rand_ratio': med['rand_keyed'] / med['rand_shared'],
            'open_keyed_s': med['open_keyed'],
            'open_shared_s': med['open_shared'],
            'open_ratio': med['open_keyed'] / med['open_shared'],
            'rounds': rounds}
    finally:
        proc.kill()
        proc.wait()
    print('holders with their own export: %d' % res['holders'])
    print('sequential 1 MiB: keyed %.0f MB/s, shared %.0f MB/s, ratio %.3f'
          % (res['seq_1M_keyed_MB_s'], res['seq_1M_shared_MB_s'],
             res['seq_ratio']))
    print('random 4 KiB:     keyed %.0f IOPS, shared %.0f IOPS, ratio %.3f'
          % (res['rand_4k_keyed_iops'], res['rand_4k_shared_iops'],
             res['rand_ratio']))
    print('open + 4 KiB read: keyed %.1f ms, shared %.1f ms, ratio %.3f'
          % (1e3 * res['open_keyed_s'], 1e3 * res['open_shared_s'],
             res['open_ratio']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
