#!/usr/bin/env python3
"""Cold-host boots: lazy base mirrors against whole-image copies.

A host that holds nothing boots every library image in turn (real TCG boots
of ``tools/build-image-library.sh``'s images, to their ``VMAR-BOOTED``
line, with ``tools/boot_image``). The store is remote and throttled:
nbdkit's ``file`` plugin serves the library's base files by name on a unix
socket behind its ``rate`` and ``delay`` filters (``--rate``, default 800M
bits/s = 100 MB/s; ``--delay``, default 2 ms per read), and its ``stats``
filter counts the bytes read from it (a cross-check: the figures use the
mirrors' exact counters, and every byte of every image for stock). The
store stands in for Glance's image store: same bytes, a well-kept
throttle.

Configurations, each from a cold host (empty host_dir, page cache dropped)
in the same run:

* ``stock``: what stock Nova does: copy each image whole from the store (the
  ``noextents`` filter makes the copy read every byte, as a Glance download
  streams every byte of a raw image), then boot the local copy;
* ``lazy-<R>``: ``vmar-export`` with ``base_fetch = lazy`` and
  ``mirror_readahead = R``; its mirrors fetch from the store. The host
  keeps its mirrors from one image to the next, as a real host does.

Figures: bytes read from the store, against stock's, and against the unique
blocks the boots read (``lazy-0`` fetches exactly the distinct blocks read,
so its bytes are that limit); seconds from the start (stock: the copy;
lazy: ``export add``) to ``VMAR-BOOTED``, against stock's.

* ``lazy-pf-<R>``: ``lazy-<R>`` with ``[vmar_host] prefetch`` on: when an
  image's export is added, the boot working set the library found in the
  image at ingest (introspected) is read into the mirrors in large sorted
  reads (a thread here does what ``vmar-export serve`` does), beside the
  boot;
* ``lazy-record-<R>``: ``lazy-<R>`` whose vmar nodes record the blocks
  each boot reads (``record-window``), read from the node when the boot
  is done and written into the library as each image's recorded set, as
  vmar-agent publishes the one a host reports; then ``lazy-pfrec-<R>``:
  a cold host prefetching those recorded sets;
* ``lazy-qcow2-<R>``: the same, with the store holding qcow2 copies of
  the bases (``qemu-img convert``), read through QEMU's qcow2 driver over
  NBD, as a host does for qcow2 images in Glance; its bytes are nbdkit's
  count (data and qcow2 metadata, 0.01 MiB resolution). Stock Nova would
  download the qcow2 files whole: their size is printed beside.
* ``stock-rbd``, ``lazy-rbd-<R>``, ``lazy-rbd-pfrec-<R>``: the bases in a
  single-node Ceph as Glance's RBD store keeps them (:class:`RbdStore`,
  not throttled): stock copies each whole (``rbd export``); the mirrors
  read the snapshots through the range server's RBD reader, without and
  with the prefetch of the recorded sets (``--rbd-readaheads``; pfrec
  needs ``--record-readaheads`` to have recorded them).

Usage: bench_coldhost.py --qemu-prefix DIR [--images a,b] [--readaheads
       0,65536,...] [--prefetch-readaheads 65536] [--record-readaheads
       65536] [--qcow2-readaheads 65536] [--rbd-readaheads 0] [--rate
       800M] [--delay 2ms] [--json OUT]
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from oslo_config import cfg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

import bench_export  # noqa: E402

from tools import boot_image  # noqa: E402
from tools.vmarenv import ceph_env  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402
from vmar_openstack import conf as vmar_conf  # noqa: E402
from vmar_openstack.host.cache import pagecache  # noqa: E402
from vmar_openstack.host.cache import prefetch as export_prefetch  # noqa: E402
from vmar_openstack.host.exports import graph  # noqa: E402
from vmar_openstack.host import service as host_service  # noqa: E402
from vmar_openstack.host import supervisor  # noqa: E402
from vmar_openstack import ingest  # noqa: E402
from vmar_openstack import mapformat  # noqa: E402
from vmar_openstack.mapformat import bootset  # noqa: E402
from vmar_openstack.mapsource import glance as gsource  # noqa: E402
from vmar_openstack.mapsource import local  # noqa: E402
from vmar_openstack.mapsource import rbd  # noqa: E402
from vmar_openstack.mapsource import readers  # noqa: E402
from vmar_openstack import names as vnames  # noqa: E402

IMAGES = ('minbase', 'python3', 'postgresql', 'nginx', 'apache2', 'mariadb')


class ThrottledStore(local.LocalDirSource):
    """The library's files, with missing blocks read from the NBD store.

    Bench harness: maps and digest lists come from the library directory
    as with ``map_source = dir``; base blocks come over NBD from the
    throttled nbdkit, export name = image id. ``fmt='qcow2'``: the store
    holds qcow2 files, read through QEMU's qcow2 driver as
    ``GlanceSource.base_reader`` does for qcow2 images in Glance.
    """

    def __init__(self, root, socket, fmt='raw',
                 export=lambda image_id, size: image_id):
        super().__init__(root)
        self.socket = socket
        self.fmt = fmt
        self.export = export

    def base_reader(self, image_id, size):
        node = readers.RangeExport(self.socket, self.export(image_id, size))
        return node if self.fmt == 'raw' else readers.Qcow2(node)


class Store:
    """nbdkit serving ``directory`` by file name, throttled and counted."""

    def __init__(self, work, directory, rate, delay, every_byte=False):
        self.socket = os.path.join(work, 'store.sock')
        self.stats = os.path.join(work, 'store.stats')
        filters = ['--filter=stats']
        if every_byte:
            filters.append('--filter=noextents')
        filters += ['--filter=delay', '--filter=rate']
        self.proc = subprocess.Popen(
            ['nbdkit', '-f', '-r', '-U', self.socket] + filters
            + ['file', 'dir=%s' % directory, 'rate=%s' % rate,
               'delay-read=%s' % delay, 'statsfile=%s' % self.stats],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('nbdkit did not start')
            time.sleep(0.02)

    def uri(self, name):
        return 'nbd+unix:///%s?socket=%s' % (name, self.socket)

    def stop(self):
        """Stop nbdkit; the bytes read from it."""
        self.proc.terminate()
        self.proc.wait(30)
        with open(self.stats) as f:
            for line in f:
                # "read: 123 ops, 0.000000 s, 45.67 MiB, ..."
                if line.strip().startswith('read:'):
                    return _stats_bytes(line)
        return 0


class RbdStore:
    """The library's bases in a single-node Ceph, as Glance's RBD store has.

    Each base is an RBD image named by its id with a protected snapshot
    ``snap`` (``rbd import``, ``snap create``, ``snap protect``: what
    glance_store does). Mirrors read the snapshots through the host's
    range server (nbdkit with ``nbdkit_glance.py``, started with the
    command ``vmar-export serve`` runs), as a host with ``[vmar_rbd]``
    does. No throttle: the cluster is on loopback (``tc netem`` on ``lo``
    would slow every other process of the run too).
    """

    def __init__(self, work, bases):
        self.ceph = ceph_env.Ceph(os.path.join(work, 'ceph'), block_gb=8)
        self.ceph.start()
        for image_id in sorted(os.listdir(bases)):
            spec = '%s/%s' % (ceph_env.POOL, image_id)
            self.ceph.run('rbd', 'import', os.path.join(bases, image_id),
                          spec, timeout=600)
            self.ceph.run('rbd', 'snap', 'create', spec + '@snap')
            self.ceph.run('rbd', 'snap', 'protect', spec + '@snap')
        self.conf_file = os.path.join(work, 'fetch.conf')
        with open(self.conf_file, 'w') as f:
            f.write('[vmar_rbd]\nceph_conf = %s\nuser = vmar\n'
                    % self.ceph.conf)

    def start_reader(self, host_dir):
        """The host's range server; (process, socket)."""
        pconf = cfg.ConfigOpts()
        vmar_conf.register_opts(pconf)
        pconf(['--config-file', self.conf_file], project='vmar')
        pconf.set_override('base_fetch', 'lazy', group='vmar_host')
        pconf.set_override('host_dir', host_dir, group='vmar_host')
        os.makedirs(host_dir, exist_ok=True)
        cmd, sock, env = gsource.GlanceSource(pconf).range_server_command()
        log = open(os.path.join(host_dir, 'fetch.log'), 'ab')
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('the range server did not start')
            time.sleep(0.02)
        return proc, sock

    @staticmethod
    def export(image_id, size):
        return rbd.fetch_export(rbd.Location(None, ceph_env.POOL, image_id,
                                             'snap'), size)

    def copy(self, image_id, dest):
        """Stock: the whole image, as a Glance download streams it."""
        self.ceph.run('rbd', 'export', '%s/%s@snap' % (ceph_env.POOL,
                                                       image_id), dest,
                      timeout=600)

    def cold(self):
        """Restart the OSD: its BlueStore cache starts empty."""
        self.ceph.kill_osd()
        self.ceph.start_osd()

    def stop(self):
        self.ceph.stop()


def _stats_bytes(line):
    value, unit = line.split(',')[2].split()
    scale = {'bytes': 1, 'KiB': 1 << 10, 'MiB': 1 << 20, 'GiB': 1 << 30}
    return int(float(value) * scale[unit])


def make_conf(state, prefix, sock, readahead):
    """bench_export's configuration, with lazy mirrors."""
    conf = bench_export.make_conf(state, prefix, sock)
    conf.set_override('base_fetch', 'lazy', group='vmar_host')
    conf.set_override('mirror_readahead', readahead, group='vmar_host')
    return conf


def run_stock(args, work, lib_root, ids, rbd_store=None):
    if rbd_store is None:
        store = Store(work, os.path.join(lib_root, 'bases'), args.rate,
                      args.delay, every_byte=True)

        def copy(image_id, dest):
            subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', 'raw',
                            store.uri(image_id), dest], check=True)
    else:
        store, copy = None, rbd_store.copy
    local_dir = os.path.join(work, 'nova-base')
    os.makedirs(local_dir)
    boots = []
    try:
        for name, image_id in ids:
            start = time.monotonic()
            dest = os.path.join(local_dir, image_id)
            copy(image_id, dest)
            copied = time.monotonic() - start
            b = boot_image.boot(dest, os.path.join(work, name + '.log'),
                                timeout=args.timeout)
            boots.append({'image': name, 'copy_s': copied,
                          'seconds': time.monotonic() - start,
                          'uptime': b['uptime']})
    finally:
        counted = store.stop() if store else None
        shutil.rmtree(local_dir, ignore_errors=True)
    # every byte of every image (nbdkit's stats round to 0.01 of a unit)
    return {'boots': boots, 'store_stats_bytes': counted,
            'bytes': sum(os.path.getsize(os.path.join(
                lib_root, 'bases', i)) for _n, i in ids)}


def _prefetching(svc, stop):
    """Poll the prefetch queue as ``vmar-export serve`` does."""
    pf = export_prefetch.Prefetcher(svc)
    while not stop.wait(0.1):
        pf.poll()


def save_recorded(svc, exp, lib_root):
    """The set ``exp``'s vmar node recorded, as the image's set."""
    with svc.monitor() as mon:
        for n in mon.execute('query-named-block-nodes', {'flat': True}):
            if n['node-name'] == graph.vmar_node(exp.image_id,
                                                 exp.map_version):
                bits = base64.b64decode(
                    n['image']['format-specific']['data']['touched'])
    bmap = mapformat.read(svc.map_file(exp.image_id, exp.map_version))
    blocks = [b for b in range(bmap.n_blocks) if bits[b // 8] >> (b % 8) & 1]
    data = bootset.encode(bootset.Bootset(
        exp.image_id, bmap.virtual_size, bmap.block_size, 'recorded',
        tuple(bootset.merge(blocks))))
    with open(os.path.join(lib_root, 'digests',
                           vnames.bootset_file(exp.image_id)), 'wb') as f:
        f.write(data)
    return len(blocks)


def run_lazy(args, work, lib_root, ids, readahead, fmt='raw',
             prefetch=False, record=False, rbd_store=None):
    host = os.path.join(work, 'host')
    sock = os.path.join(work, 'nbd.sock')
    conf = make_conf(host, args.qemu_prefix, sock, readahead)
    conf.set_override('map_source_dir', lib_root, group='vmar_host')
    conf.set_override('prefetch', prefetch, group='vmar_host')
    conf.set_override('bootset_record_window', 3600 if record else 0,
                      group='vmar_host')
    if args.prefetch_gap is not None:
        conf.set_override('prefetch_gap', args.prefetch_gap, group='vmar_host')
    if rbd_store is None:
        store_dir = os.path.join(lib_root, 'bases' if fmt == 'raw' else fmt)
        store = Store(work, store_dir, args.rate, args.delay)
        source = ThrottledStore(lib_root, store.socket, fmt)
    else:
        store, sock_r = rbd_store.start_reader(host)
        source = ThrottledStore(lib_root, sock_r, export=rbd_store.export)
    svc = host_service.ExportService(conf, source=source)
    sup = supervisor.Supervisor(svc)
    proc = sup.start_daemon()
    boots = []
    stop = threading.Event()
    poller = threading.Thread(target=_prefetching, args=(svc, stop),
                              daemon=True)
    poller.start()
    try:
        svc.restore()
        for name, image_id in ids:
            start = time.monotonic()
            exp = svc.add(image_id)
            b = boot_image.boot(svc.uri(exp), os.path.join(work,
                                                           name + '.log'),
                                timeout=args.timeout)
            boots.append({'image': name, 'seconds': time.monotonic() - start,
                          'uptime': b['uptime']})
            if record:
                boots[-1]['recorded_blocks'] = save_recorded(svc, exp,
                                                             lib_root)
        with svc.monitor() as mon:
            counters = [n['image']['format-specific']['data']
                        for n in mon.execute('query-named-block-nodes',
                                             {'flat': True})
                        if n.get('drv') == 'vmar-mirror']
    finally:
        stop.set()
        poller.join()
        sup.quit(proc)
        if rbd_store is None:
            counted = store.stop()
        else:
            store.terminate()
            store.wait(30)
            counted = None
    # the mirrors' own count, to the byte; a qcow2 store also serves
    # metadata (header, L1 and L2 tables), which only nbdkit counts
    fetched = sum(c['bytes-fetched'] for c in counters)
    return {'boots': boots, 'store_stats_bytes': counted,
            'bytes': counted if fmt == 'qcow2' else fetched,
            'disk_bytes': fetched,
            'fetches': sum(c['fetches'] for c in counters),
            'waits': sum(c['waits'] for c in counters)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--images', default=','.join(IMAGES))
    p.add_argument('--readaheads', default='0,65536,262144,1048576')
    p.add_argument('--rate', default='800M', help='nbdkit rate= (bits/s)')
    p.add_argument('--delay', default='2ms', help='nbdkit delay-read=')
    p.add_argument('--prefetch-readaheads', default='65536',
                   help='also lazy with prefetch, with these read-aheads '
                        '("" for none)')
    p.add_argument('--prefetch-gap', type=int,
                   help='[vmar_host] prefetch_gap of the prefetching configs '
                        '(default: the option\'s default)')
    p.add_argument('--record-readaheads', default='65536',
                   help='also record each boot\'s working set, then boot '
                        'a cold host prefetching it, with these '
                        'read-aheads ("" for none)')
    p.add_argument('--qcow2-readaheads', default='65536',
                   help='also mirror qcow2 copies of the bases with these '
                        'read-aheads ("" for none)')
    p.add_argument('--rbd-readaheads', default='',
                   help='also with the bases in a single-node Ceph '
                        '(unthrottled), read from RBD: stock-rbd copies '
                        'each whole, lazy-rbd-R and lazy-rbd-pfrec-R '
                        '(needs --record-readaheads R) read through '
                        'mirrors ("" for none)')
    p.add_argument('--timeout', type=int, default=600)
    p.add_argument('--json')
    args = p.parse_args()
    library = qemu_env.image_library()
    names = args.images.split(',')
    work = tempfile.mkdtemp(prefix='vmar-coldhost-', dir='/var/tmp')
    try:
        lib_root = os.path.join(work, 'library')
        lconf = make_conf(lib_root, args.qemu_prefix, '/nonexistent', 0)
        lib = ingest.Library(lconf)
        ids = []
        for name in IMAGES:       # the whole library, whatever is booted
            image_id = str(uuid.uuid5(uuid.NAMESPACE_URL, 'coldhost/'
                                      + name))
            lib.add(image_id, library[name], visibility='public')
            if name in names:
                ids.append((name, image_id))
        results = {'rate': args.rate, 'delay': args.delay,
                   'images': names, 'prefetch_gap': args.prefetch_gap,
                   'configs': {}}
        configs = [('stock', None, 'raw')] + [
            ('lazy-%s' % r, int(r), 'raw')
            for r in args.readaheads.split(',')] + [
            ('lazy-pf-%s' % r, int(r), 'raw')
            for r in args.prefetch_readaheads.split(',') if r] + [
            (label % r, int(r), 'raw')
            for r in args.record_readaheads.split(',') if r
            for label in ('lazy-record-%s', 'lazy-pfrec-%s')] + [
            ('lazy-qcow2-%s' % r, int(r), 'qcow2')
            for r in args.qcow2_readaheads.split(',') if r]
        rbds = [r for r in args.rbd_readaheads.split(',') if r]
        if rbds:
            configs += [('stock-rbd', None, 'rbd')] + [
                (label % r, int(r), 'rbd') for r in rbds
                for label in ('lazy-rbd-%s', 'lazy-rbd-pfrec-%s')]
        rbd_store = None
        if any(fmt == 'qcow2' for _l, _r, fmt in configs):
            results['qcow2_bytes'] = to_qcow2(lib_root, ids, args.qemu_prefix)
        for label, ra, fmt in configs:
            cwork = os.path.join(work, label)
            os.makedirs(cwork)
            if fmt == 'rbd' and rbd_store is None:
                rbd_store = RbdStore(work, os.path.join(lib_root, 'bases'))
            elif fmt == 'rbd':
                rbd_store.cold()
            pagecache.drop_all()     # the host starts cold
            print('== %s' % label, flush=True)
            if ra is None:
                res = run_stock(args, cwork, lib_root, ids, rbd_store
                                if fmt == 'rbd' else None)
            else:
                res = run_lazy(args, cwork, lib_root, ids, ra, fmt,
                               prefetch='-pf' in label,
                               record=label.startswith('lazy-record-'),
                               rbd_store=rbd_store if fmt == 'rbd'
                               else None)
            results['configs'][label] = res
            for b in res['boots']:
                print('  %-11s %7.1f s' % (b['image'], b['seconds']),
                      flush=True)
            print('  %d bytes from the store' % res['bytes'], flush=True)
            shutil.rmtree(cwork, ignore_errors=True)
        report(results)
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(results, f, indent=1)
    finally:
        if rbd_store is not None:
            rbd_store.stop()
        shutil.rmtree(work, ignore_errors=True)


def to_qcow2(lib_root, ids, prefix):
    """qcow2 copies of every base in the library, as Glance might hold.

    Returns the bytes stock Nova would download for the booted images:
    the qcow2 files of the bases their maps read, whole.
    """
    bases = os.path.join(lib_root, 'bases')
    out = os.path.join(lib_root, 'qcow2')
    os.makedirs(out)
    for image_id in os.listdir(bases):
        subprocess.run([os.path.join(prefix, 'bin', 'qemu-img'), 'convert',
                        '-f', 'raw', '-O', 'qcow2',
                        os.path.join(bases, image_id),
                        os.path.join(out, image_id)], check=True)
    return sum(os.path.getsize(os.path.join(out, i)) for _n, i in ids)


def report(results):
    c = results['configs']
    stock = c['stock']
    stock_s = sum(b['seconds'] for b in stock['boots'])
    limit = c['lazy-0']['bytes'] if 'lazy-0' in c else None
    print('\nstore: rate %s bits/s, delay %s per read; images booted in '
          'turn: %s' % (results['rate'], results['delay'],
                        ', '.join(results['images'])))
    print('%-14s %14s %9s %9s %10s %9s' % (
        'config', 'store bytes', 'x stock', 'x limit', 'boot s', 'x stock'))
    for label, res in c.items():
        secs = sum(b['seconds'] for b in res['boots'])
        print('%-14s %14d %9.3f %9s %10.1f %9.2f' % (
            label, res['bytes'], res['bytes'] / stock['bytes'],
            '%.3f' % (res['bytes'] / limit) if limit else '-', secs,
            secs / stock_s))
    print('(limit: the bytes lazy-0 fetched, the distinct blocks the boots '
          'read; boot s: summed over the images, from copy start or '
          'export add to VMAR-BOOTED)')
    if 'qcow2_bytes' in results:
        q = results['qcow2_bytes']
        print('qcow2: stock Nova would download %d bytes (the qcow2 files of '
              'the images booted, whole)' % q)
        for label, res in c.items():
            if 'qcow2' in label:
                print('  %s: %.3f x that download; %d bytes of disk '
                      'filled the mirrors' % (label, res['bytes'] / q,
                                              res['disk_bytes']))
    # Under TCG the guest's own CPU time dominates a boot; the time the
    # storage adds is what each configuration spends beyond stock's boot
    # from its local copy (its wall time after the copy).
    local_boot = sum(b['seconds'] - b['copy_s'] for b in stock['boots'])
    stock_wait = stock_s - local_boot
    print('\nstorage wait: seconds beyond the %.1f s stock took to boot '
          'from its local copies' % local_boot)
    for label, res in c.items():
        wait = sum(b['seconds'] for b in res['boots']) - local_boot
        print('%-14s %10.1f s %9.2f x stock'
              % (label, wait, wait / stock_wait))
    if 'stock-rbd' in c:
        rstock = c['stock-rbd']
        rstock_s = sum(b['seconds'] for b in rstock['boots'])
        print('\nbases in Ceph (unthrottled loopback), against stock-rbd '
              '(rbd export of each image, then boot):')
        for label, res in c.items():
            if 'rbd' in label:
                secs = sum(b['seconds'] for b in res['boots'])
                print('%-18s %14d bytes %9.3f x stock-rbd %9s x limit '
                      '%8.1f s %6.2f x stock-rbd' % (
                          label, res['bytes'],
                          res['bytes'] / rstock['bytes'],
                          '%.3f' % (res['bytes'] / limit) if limit else '-',
                          secs, secs / rstock_s))
    print('\nper image, seconds to VMAR-BOOTED:')
    labels = list(c)
    print('%-11s' % 'image' + ''.join('%12s' % lb for lb in labels))
    for i, b in enumerate(stock['boots']):
        print('%-11s' % b['image'] + ''.join(
            '%12.1f' % c[lb]['boots'][i]['seconds'] for lb in labels))


if __name__ == '__main__':
    main()
