#!/usr/bin/env python3
"""Where a mirror checks fetched blocks: the thread pool or the AioContext.

vmar-mirror hashes every fetched run (SHA-256 per block) before it writes
or serves it. With ``verify-in-threads=on`` (the default) the hashing goes
to QEMU's thread pool and the AioContext only waits; with ``off`` it runs
in the coroutine, on the AioContext's thread, as it did before. In the same
run, for each way, one patched ``qemu-storage-daemon`` serves a mirror of a
random base whose fetch child reads the base from nbdkit throttled to
``--rate`` (default 800M bits/s = 100 MB/s, nbdkit's ``rate`` filter):

1. cold fetch: 8 fio readers (nbd engine) read their own eighth of the cold
   part of the base at once, 1 MiB requests; the figure is the bytes
   fetched over the time until the last one ends;
2. meanwhile one more reader reads 4 KiB at random, queue depth 1, from a
   part of the mirror filled (and in the page cache) before: its latency
   p50 and p99 is what a guest whose blocks are there sees while others
   miss.

Also the daemon's CPU seconds per run. Rounds alternate the two ways; the
figures are medians. On this machine (2 cores) the store is the bottleneck
at 100 MB/s; ``--rate 0`` takes the throttle away and shows what hashing
costs when the store is not.

Usage: bench_verify.py --qemu-prefix DIR [--size-mib N] [--rounds N]
       [--rate BITS] [--json OUT]
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                '..'))

from vmar_openstack import fingerprint  # noqa: E402
from vmar_openstack.mapformat import mirror  # noqa: E402

READERS = 8
HOT_MIB = 64


def wait_for(path, proc, what):
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError('%s did not start' % what)
        time.sleep(0.02)


def cpu_seconds(pid):
    with open('/proc/%d/stat' % pid) as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def fio_json(out):
    # the nbd engine prints a line before the JSON document
    return json.loads(out[out.index('{'):])


class Store:
    """nbdkit serving the base, throttled (``rate`` 0: not at all)."""

    def __init__(self, work, base, rate):
        self.socket = os.path.join(work, 'store.sock')
        cmd = ['nbdkit', '-f', '-r', '-U', self.socket]
        if rate != '0':
            cmd += ['--filter=rate']
        cmd += ['file', base]
        if rate != '0':
            cmd += ['rate=%s' % rate]
        self.proc = subprocess.Popen(cmd)
        wait_for(self.socket, self.proc, 'nbdkit')

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def one_round(args, work, base, digests, hdr, size, threads, store):
    data = os.path.join(work, 'mirror')
    present = data + '.present'
    if os.path.exists(present):
        os.unlink(present)
    with open(data, 'wb') as f:
        f.truncate(size)
    mirror.create_present(present, hdr)
    sock = os.path.join(work, 'nbd.sock')
    node = {'driver': 'vmar-mirror', 'node-name': 'm', 'digests': digests,
            'present': present, 'verify-in-threads': threads,
            'file': {'driver': 'file', 'filename': data, 'aio': 'io_uring'},
            'fetch': {'driver': 'nbd', 'read-only': True,
                      'server': {'type': 'unix', 'path': store.socket}}}
    cmd = [os.path.join(args.qemu_prefix, 'bin', 'qemu-storage-daemon'),
           '--blockdev', json.dumps(node),
           '--nbd-server', 'addr.type=unix,addr.path=%s' % sock,
           '--export', 'type=nbd,id=m,node-name=m,name=m,writable=off']
    proc = subprocess.Popen(cmd)
    try:
        wait_for(sock, proc, 'qemu-storage-daemon')
        uri = 'nbd+unix:///m?socket=%s' % sock
        hot = HOT_MIB << 20
        # fill the hot part first (the page cache keeps it)
        subprocess.run(['fio', '--name=fill', '--ioengine=nbd',
                        '--uri=%s' % uri, '--rw=read', '--bs=1M',
                        '--size=%d' % hot, '--output-format=json'],
                       check=True, capture_output=True)
        cold = size - hot
        part = cold // READERS // (1 << 20) << 20
        cpu0 = cpu_seconds(proc.pid)
        t0 = time.monotonic()
        readers = subprocess.Popen(
            ['fio', '--name=cold', '--ioengine=nbd', '--uri=%s' % uri,
             '--rw=read', '--bs=1M', '--iodepth=1',
             '--numjobs=%d' % READERS, '--size=%d' % part,
             '--offset=%d' % hot, '--offset_increment=%d' % part,
             '--group_reporting', '--output-format=json'],
            stdout=subprocess.PIPE, text=True)
        # the hot reader runs while the cold ones miss
        hot_run = subprocess.run(
            ['fio', '--name=hot', '--ioengine=nbd', '--uri=%s' % uri,
             '--rw=randread', '--bs=4k', '--iodepth=1', '--size=%d' % hot,
             '--time_based', '--runtime=%d' % args.hot_seconds,
             '--randrepeat=1', '--norandommap', '--output-format=json'],
            check=True, capture_output=True, text=True)
        out, _ = readers.communicate()
        elapsed = time.monotonic() - t0
        if readers.returncode:
            raise RuntimeError('the cold readers failed')
        cpu = cpu_seconds(proc.pid) - cpu0
        cold_read = fio_json(out)['jobs'][0]['read']['io_bytes']
        lat = fio_json(hot_run.stdout)['jobs'][0]['read']['clat_ns'][
            'percentile']
    finally:
        proc.terminate()
        proc.wait(30)
    return {'fetch_MB_s': cold_read / elapsed / 1e6,
            'hot_p50_us': lat['50.000000'] / 1e3,
            'hot_p99_us': lat['99.000000'] / 1e3,
            'daemon_cpu_s': cpu, 'cold_bytes': cold_read,
            'seconds': elapsed}


def run(args, work):
    size = args.size_mib << 20
    base = os.path.join(work, 'base.raw')
    with open(base, 'wb') as f:
        for _ in range(args.size_mib):
            f.write(os.urandom(1 << 20))
    image_id = str(uuid.uuid4())
    digests = os.path.join(work, 'digests')
    with open(digests, 'wb') as f:
        f.write(mirror.digests_bytes(image_id,
                                     fingerprint.hash_file(base, size)))
    hdr, _rows = mirror.read_digests(digests)
    store = Store(work, base, args.rate)
    ways = {'threads': True, 'aiocontext': False}
    res = {w: [] for w in ways}
    try:
        for _ in range(args.rounds):
            for w, threads in ways.items():
                res[w].append(one_round(args, work, base, digests, hdr,
                                        size, threads, store))
    finally:
        store.stop()
    med = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for w, rs in res.items()}
    print('base %d MiB, store rate %s bits/s, %d cold readers, %d rounds; '
          'medians; %d cores' % (args.size_mib, args.rate, READERS,
                                 args.rounds, os.cpu_count()))
    print('%-34s %12s %12s %8s' % ('', 'thread pool', 'AioContext',
                                   'ratio'))
    for key, label in (('fetch_MB_s', 'cold fetch (MB/s)'),
                       ('hot_p50_us', 'hot 4 KiB read p50 (us)'),
                       ('hot_p99_us', 'hot 4 KiB read p99 (us)'),
                       ('daemon_cpu_s', 'daemon CPU (s)')):
        t, a = med['threads'][key], med['aiocontext'][key]
        print('%-34s %12.1f %12.1f %8.3f' % (label, t, a, t / a))
    return {'size_mib': args.size_mib, 'rate': args.rate,
            'readers': READERS, 'rounds': res, 'medians': med}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--size-mib', type=int, default=1024)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--rate', default='800M',
                   help="nbdkit rate= (bits/s); 0: no throttle")
    p.add_argument('--hot-seconds', type=int, default=3)
    p.add_argument('--json')
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix='vmar-benchverify-', dir='/var/tmp')
    try:
        res = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(res, f, indent=1)


if __name__ == '__main__':
    main()
