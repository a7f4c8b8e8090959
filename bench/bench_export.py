#!/usr/bin/env python3
"""Read performance of the VMAR driver and its NBD export, same-run ratios.

Needs the patched QEMU (qemu/build.sh), fio (Debian's, with its nbd engine)
and root (to drop the page cache). Images: two similar raw images, e.g. the
Debian library's minbase and python3.

Reports:

1. hot cache, NBD export of the VMAR view against a raw export of the same
   data from the same qemu-storage-daemon: sequential 1 MiB reads and random
   4 KiB reads (fio, nbd engine, queue depth 16). Goal >= 0.95 each.
2. in process, ``qemu-img bench`` on the vmar node against the raw file, to
   separate driver cost from NBD cost.
3. cold cache, reading image 2 after image 1: bytes the daemon read from
   storage through VMAR against raw (from /proc/<pid>/io), next to image 2's
   unique-block fraction.
4. mean lookup probes for the sequential and the random pattern, from the
   driver's counters (its image information, query-named-block-nodes).

Hot figures are medians of --rounds alternating rounds of --runtime
seconds each; a sequential round reads the image over and over (one pass
of a 1 GiB image takes about 0.2 s here, too short to measure alone).
Read-ahead on the base files decides much of the cold figure, so the
disk's read-ahead is set
to --readahead-kb (default 128, the kernel's default) for the run and put
back afterwards; the machine's own setting is reported.

Usage: bench_export.py --qemu-prefix DIR [--json OUT] [--aio A]
       [--gather-gap N] FIRST.raw SECOND.raw
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from oslo_config import cfg

from vmar_openstack import conf as vmar_conf
from vmar_openstack.db import migration
from vmar_openstack.host.cache import pagecache
from vmar_openstack.host import service as host_service
from vmar_openstack.host import supervisor
from vmar_openstack import ingest


def make_conf(state, prefix, sock):
    conf = cfg.ConfigOpts()
    vmar_conf.register_opts(conf)
    conf([], project='vmar', default_config_files=[])
    conf.set_override('state_dir', state, group='vmar')
    # the bench's own host, reading its own library
    conf.set_override('host_dir', os.path.join(state, 'host'),
                      group='vmar_host')
    conf.set_override('map_source_dir', state, group='vmar_host')
    conf.set_override('export_socket', sock, group='vmar_host')
    conf.set_override('qemu_storage_daemon',
                      os.path.join(prefix, 'bin', 'qemu-storage-daemon'),
                      group='vmar_host')
    conf.set_override('connection', 'sqlite:///%s/vmar.sqlite' % state,
                      group='vmar_database')
    # the driver against whole local bases: no mirrors, nothing fetched or
    # recorded (bench_coldhost.py measures those)
    conf.set_override('base_fetch', 'full', group='vmar_host')
    conf.set_override('prefetch', False, group='vmar_host')
    conf.set_override('bootset_record_window', 0, group='vmar_host')
    # and no background fill: a bench measures what its reads fetch
    conf.set_override('fill', False, group='vmar_host')
    migration.upgrade('head', conf=conf)
    return conf


def fio(uri, rw, bs, size=None, runtime=None, iodepth=16):
    cmd = ['fio', '--name=b', '--ioengine=nbd', '--uri=%s' % uri,
           '--rw=%s' % rw, '--bs=%s' % bs, '--iodepth=%d' % iodepth,
           '--output-format=json', '--randrepeat=1', '--norandommap']
    if runtime:
        cmd += ['--time_based', '--runtime=%d' % runtime]
    if size:
        cmd += ['--size=%d' % size]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    # the nbd engine prints a line before the JSON document
    job = json.loads(out.stdout[out.stdout.index('{'):])['jobs'][0]['read']
    return {'MB_s': job['bw_bytes'] / 1e6, 'iops': job['iops'],
            'bytes': job['io_bytes']}


def qemu_img_bench(prefix, spec, size, fmt=None, count=None):
    count = count or size // (1 << 20)
    cmd = [os.path.join(prefix, 'bin', 'qemu-img'), 'bench', '-c',
           str(count), '-s', '1M', '-S', '1M', '-d', '16']
    if fmt:
        cmd += ['-f', fmt]
    t = time.perf_counter()
    subprocess.run(cmd + [spec], check=True, capture_output=True)
    return count * (1 << 20) / (time.perf_counter() - t) / 1e6


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far."""
    with open('/proc/%d/stat' % pid) as f:
        fields = f.read().rpartition(')')[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def read_bytes(pid):
    with open('/proc/%d/io' % pid) as f:
        return int(re.search(r'^read_bytes: (\d+)', f.read(), re.M)[1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--json')
    p.add_argument('--runtime', type=int, default=10)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--aio', default='io_uring')
    p.add_argument('--gather-gap', type=int, default=0)
    p.add_argument('--readahead-kb', type=int, default=128)
    p.add_argument('first')
    p.add_argument('second')
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix='vmar-bench-export-')
    sock = os.path.join(work, 'nbd.sock')
    conf = make_conf(os.path.join(work, 'state'), args.qemu_prefix, sock)
    conf.set_override('base_aio', args.aio, group='vmar_host')
    conf.set_override('read_gather_gap', args.gather_gap, group='vmar_host')
    knob = pagecache.readahead_knob(work)
    with pagecache.readahead(knob, args.readahead_kb) as machine_ra:
        return run(args, work, conf, sock, machine_ra)


def map_counters(svc, image_id):
    """The counters of the vmar node that reads @image_id's map."""
    with svc.monitor() as mon:
        for n in mon.execute('query-named-block-nodes', {'flat': True}):
            if n['drv'] == 'vmar' and image_id in n['file']:
                return n['image']['format-specific']['data']
    raise RuntimeError('no vmar node reads the map of %s' % image_id)


def run(args, work, conf, sock, machine_ra):
    lib = ingest.Library(conf)
    ids = []
    for path in (args.first, args.second):
        image_id = str(uuid.uuid4())
        lib.add(image_id, path, visibility='public')
        ids.append(image_id)
    first, second = ids
    svc = host_service.ExportService(conf)
    sup = supervisor.Supervisor(svc)
    proc = sup.start_daemon()
    res = {'readahead_kb': args.readahead_kb, 'machine_readahead_kb':
           machine_ra, 'aio': args.aio, 'gather_gap': args.gather_gap}
    try:
        svc.restore()
        uri_1, uri_v = (svc.uri(svc.add(i)) for i in ids)
        # a raw export of image 2's base file, from the same daemon
        mon = svc.monitor()
        mon.execute('blockdev-add', {
            'driver': 'file', 'node-name': 'rawbench', 'read-only': True,
            'filename': svc.base_file(second), 'aio': svc.aio('base')})
        mon.execute('block-export-add', {
            'type': 'nbd', 'id': 'rawbench', 'node-name': 'rawbench',
            'name': 'raw', 'writable': False})
        mon.close()
        size = os.path.getsize(svc.base_file(second))
        uri_r = 'nbd+unix:///raw?socket=%s' % sock

        # 1. hot cache: warm both, then alternate
        for uri in (uri_v, uri_r):
            fio(uri, 'read', '1M', size=size)
        seq_v, seq_r, rnd_v, rnd_r = [], [], [], []
        # the daemon's CPU seconds per GB read sequentially: steadier than
        # throughput on a machine whose other tenants come and go
        cpu_v, cpu_r = [], []

        def seq(uri, cpu):
            t = cpu_seconds(proc.pid)
            r = fio(uri, 'read', '1M', size=size, runtime=args.runtime)
            cpu.append((cpu_seconds(proc.pid) - t) / (r['bytes'] / 1e9))
            return r['MB_s']
        for _ in range(args.rounds):
            seq_v.append(seq(uri_v, cpu_v))
            seq_r.append(seq(uri_r, cpu_r))
            rnd_v.append(fio(uri_v, 'randread', '4k',
                             runtime=args.runtime)['iops'])
            rnd_r.append(fio(uri_r, 'randread', '4k',
                             runtime=args.runtime)['iops'])
        med = statistics.median
        res['hot'] = {
            'seq_1M_vmar_MB_s': med(seq_v), 'seq_1M_raw_MB_s': med(seq_r),
            'seq_ratio': med(seq_v) / med(seq_r),
            'rand_4k_vmar_iops': med(rnd_v), 'rand_4k_raw_iops': med(rnd_r),
            'rand_ratio': med(rnd_v) / med(rnd_r),
            'seq_cpu_s_per_GB_vmar': med(cpu_v),
            'seq_cpu_s_per_GB_raw': med(cpu_r),
            'seq_round_ratios_median': med(
                v / r for v, r in zip(seq_v, seq_r)),
            'rounds': {'seq_vmar': seq_v, 'seq_raw': seq_r,
                       'rand_vmar': rnd_v, 'rand_raw': rnd_r,
                       'seq_cpu_vmar': cpu_v, 'seq_cpu_raw': cpu_r}}

        # 4. probes: counters of a fresh node per pattern
        svc.remove(second)
        mine = []
        # a new holder of an export gets a new key: a new URI each time
        fio(svc.uri(svc.add(second)), 'read', '1M', size=size)
        mine.append(map_counters(svc, second))
        svc.remove(second)
        fio(svc.uri(svc.add(second)), 'randread', '4k',
            runtime=max(3, args.runtime // 2))
        mine.append(map_counters(svc, second))
        svc.remove(second)
        res['probes'] = {
            'sequential': mine[0]['probes'] / max(1, mine[0]['lookups']),
            'random': mine[1]['probes'] / max(1, mine[1]['lookups']),
            'lookups': [x['lookups'] for x in mine[:2]]}
        uri_v = svc.uri(svc.add(second))

        # 3. cold cache: image 1 then image 2, VMAR vs raw
        pid = proc.pid
        pagecache.drop_all()
        fio(uri_1, 'read', '1M', size=size)
        before = read_bytes(pid)
        fio(uri_v, 'read', '1M', size=size)
        vmar_bytes = read_bytes(pid) - before
        pagecache.drop_all()
        with open(svc.base_file(first), 'rb') as f:
            while f.read(8 << 20):
                pass
        before = read_bytes(pid)
        fio(uri_r, 'read', '1M', size=size)
        raw_bytes = read_bytes(pid) - before
        st = [i for i in ingest_stats(conf) if i['image_id'] == second][0]
        res['cold'] = {
            'vmar_bytes_read': vmar_bytes, 'raw_bytes_read': raw_bytes,
            'ratio': vmar_bytes / raw_bytes if raw_bytes else None,
            'unique_fraction': st['unique_blocks'] / st['data_blocks'],
            'not_redirected_fraction':
                1 - st['redirected_fraction']}
    finally:
        sup.quit(proc)
    # 2. in process
    map_path = svc.map_file(second, 1)
    spec = json.dumps({'driver': 'vmar', 'file': {
        'driver': 'file', 'filename': map_path},
        'base-dir': os.path.join(conf.vmar_host.host_dir, 'bases')})
    for _ in range(2):
        inproc_v = qemu_img_bench(args.qemu_prefix, 'json:' + spec, size)
        inproc_r = qemu_img_bench(args.qemu_prefix, svc.base_file(second),
                                  size, fmt='raw')
    res['in_process'] = {'seq_1M_vmar_MB_s': inproc_v,
                         'seq_1M_raw_MB_s': inproc_r,
                         'ratio': inproc_v / inproc_r}
    shutil.rmtree(work, ignore_errors=True)

    print('aio %s, gather-gap %d, read-ahead %d KiB (machine: %d KiB)'
          % (args.aio, args.gather_gap, args.readahead_kb, machine_ra))
    h = res['hot']
    print('hot  seq 1 MiB : vmar %7.0f MB/s  raw %7.0f MB/s  ratio %.2f '
          '(goal >= 0.95)' % (h['seq_1M_vmar_MB_s'], h['seq_1M_raw_MB_s'],
                              h['seq_ratio']))
    print('     seq, median of round ratios %.2f; daemon CPU per GB: vmar '
          '%.3f s  raw %.3f s  ratio %.2f' % (
              h['seq_round_ratios_median'], h['seq_cpu_s_per_GB_vmar'],
              h['seq_cpu_s_per_GB_raw'],
              h['seq_cpu_s_per_GB_vmar'] / h['seq_cpu_s_per_GB_raw']))
    print('hot  rand 4 KiB: vmar %7.0f IOPS  raw %7.0f IOPS  ratio %.2f '
          '(goal >= 0.95)' % (h['rand_4k_vmar_iops'], h['rand_4k_raw_iops'],
                              h['rand_ratio']))
    ip = res['in_process']
    print('in-process qemu-img bench 1 MiB: vmar %7.0f MB/s  raw %7.0f MB/s'
          '  ratio %.2f' % (ip['seq_1M_vmar_MB_s'], ip['seq_1M_raw_MB_s'],
                            ip['ratio']))
    c = res['cold']
    print('cold, image 2 after image 1: vmar read %d bytes, raw %d bytes, '
          'ratio %.3f; image 2 unique-block fraction %.3f (not redirected '
          '%.3f)' % (c['vmar_bytes_read'], c['raw_bytes_read'], c['ratio'],
                     c['unique_fraction'], c['not_redirected_fraction']))
    print('mean probes per lookup: sequential %.3f, random %.3f (paper 0.2)'
          % (res['probes']['sequential'], res['probes']['random']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(res, f, indent=2)
    return 0


def ingest_stats(conf):
    from vmar_openstack.cmd import manage
    return manage.collect_stats(conf)['images']


if __name__ == '__main__':
    sys.exit(main())
