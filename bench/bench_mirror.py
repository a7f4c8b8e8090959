#!/usr/bin/env python3
"""Hot path of a base mirror: a filled mirror against the local base file.

One patched ``qemu-storage-daemon`` serves two NBD exports of the same base
image: its ``file`` node (what a host with whole bases reads) and a
``vmar-mirror`` node over a copy of it whose every block is present (what a
host with ``base_fetch = lazy`` reads once the blocks are there). fio (nbd
engine, queue depth 16) reads both with the page cache hot: sequential 1 MiB
and random 4 KiB, in alternating rounds. Goal: the mirror at >= 0.95 x the
file for both (issue 15, "hot path").

Usage: bench_mirror.py --qemu-prefix DIR [--rounds N] [--runtime S] IMAGE.raw
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

import bench_export  # noqa: E402

from vmar_openstack import fingerprint  # noqa: E402
from vmar_openstack.mapformat import mirror  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--runtime', type=int, default=10)
    p.add_argument('--json')
    p.add_argument('image')
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix='vmar-benchmirror-', dir='/var/tmp')
    try:
        res = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(res, f, indent=1)


def run(args, work):
    size = os.path.getsize(args.image)
    image_id = str(uuid.uuid4())
    digests = os.path.join(work, 'digests')
    with open(digests, 'wb') as f:
        f.write(mirror.digests_bytes(image_id,
                                     fingerprint.hash_file(args.image, size)))
    hdr, _rows = mirror.read_digests(digests)
    data = os.path.join(work, 'mirror')
    present = data + '.present'
    with open(data, 'wb') as f:
        f.truncate(size)
    mirror.create_present(present, hdr)
    sock = os.path.join(work, 'nbd.sock')
    nodes = {
        'file': {'driver': 'file', 'node-name': 'file',
                 'filename': args.image, 'read-only': True,
                 'aio': 'io_uring'},
        'mirror': {'driver': 'vmar-mirror', 'node-name': 'mirror',
                   'digests': digests, 'present': present,
                   'file': {'driver': 'file', 'filename': data,
                            'aio': 'io_uring'},
                   'fetch': {'driver': 'file', 'filename': args.image,
                             'read-only': True}}}
    cmd = [os.path.join(args.qemu_prefix, 'bin', 'qemu-storage-daemon'),
           '--nbd-server', 'addr.type=unix,addr.path=%s' % sock]
    for name, node in nodes.items():
        cmd += ['--blockdev', json.dumps(node),
                '--export', 'type=nbd,id=%s,node-name=%s,name=%s,'
                'writable=off' % (name, name, name)]
    proc = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('qemu-storage-daemon did not start')
            time.sleep(0.02)
        uris = {n: 'nbd+unix:///%s?socket=%s' % (n, sock) for n in nodes}
        # fill the mirror and warm the page cache for both
        for uri in uris.values():
            bench_export.fio(uri, 'read', '1M', size=size)
        seq = {n: [] for n in nodes}
        rnd = {n: [] for n in nodes}
        for _ in range(args.rounds):
            for n, uri in uris.items():
                seq[n].append(bench_export.fio(uri, 'read', '1M',
                                               size=size)['MB_s'])
                rnd[n].append(bench_export.fio(
                    uri, 'randread', '4k', runtime=args.runtime)['iops'])
    finally:
        proc.terminate()
        proc.wait(30)
    _hdr, bits = mirror.read_present(present)
    res = {'image': args.image, 'size': size, 'rounds': args.rounds,
           'present_blocks': int(bits.sum()), 'blocks': len(bits),
           'seq_MB_s': seq, 'rand_iops': rnd}
    med = {k: {n: statistics.median(v) for n, v in d.items()}
           for k, d in (('seq', seq), ('rnd', rnd))}
    print('image %s, %d bytes; %d of %d blocks recorded present; medians '
          'of %d rounds' % (args.image, size, bits.sum(), len(bits),
                            args.rounds))
    print('%-28s %10s %10s %7s' % ('', 'file', 'mirror', 'ratio'))
    print('%-28s %10.0f %10.0f %7.3f' % (
        'sequential 1 MiB (MB/s)', med['seq']['file'], med['seq']['mirror'],
        med['seq']['mirror'] / med['seq']['file']))
    print('%-28s %10.0f %10.0f %7.3f' % (
        'random 4 KiB (IOPS)', med['rnd']['file'], med['rnd']['mirror'],
        med['rnd']['mirror'] / med['rnd']['file']))
    return res


if __name__ == '__main__':
    main()
