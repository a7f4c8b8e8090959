#!/usr/bin/env python3
"""Snapshots by delta against Nova's own route (issue 33).

Two parts, each against a baseline of the same run:

* **route** (default): the route's own steps on real files, for each image
  and each D (MiB the "guest" changed: half overwrites of file data, half
  new data in free space, random bytes, written into a qcow2 overlay of the
  image with ``qemu-io``):

  - bytes sent: the delta (``nova_imagebackend.delta.write``) against
    what Nova's own route uploads (``qemu-img convert -O qcow2`` of the
    overlay, as ``extract_snapshot`` does; every non-zero block) and
    against ``1.1 x D + 1 MiB`` (goal);
  - ingest CPU: ``Library.add_delta`` (the parent's entry plus the
    delta) against ``Library.add`` of the same snapshot whole, in a
    library holding the parent (goal: at most 0.2 x);
  - glance-api's work: the assembly (parent streamed from its file,
    each block checked against the parent's digests, written sparse) in
    CPU seconds.

* **cloud** (``--cloud STATE``, a cloud of ``tools/cloud.sh up``): the
  same D written into a stopped server's disk, then ``openstack server
  image create --wait`` timed, for a server of a vmar flavor and one of
  the plain flavor of the same image, alternating; the bytes Glance
  received (the delta's size from nova-compute's log, the plain image's
  stored size) and the Glance store's bytes (goal: time at most 0.25 x
  stock's at D = 16 MiB).

Usage::

    python3 bench/bench_snapshot.py [--images minbase,big] [--mib 16,256]
        [--repeat 3] [--json OUT] [--cloud STATE]

``big`` is made from mariadb: 4 GiB virtual, with 1 GiB of random data
past its file system (the issue's larger image).
"""

import argparse
import datetime
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

import bench_ingest  # noqa: E402

from tools.cloud import config  # noqa: E402
from tools import cloud_scenario  # noqa: E402
from tools.vmarenv import qemu_env  # noqa: E402
from vmar_openstack.glance_hooks import assemble  # noqa: E402
from vmar_openstack import ingest  # noqa: E402
from vmar_openstack.mapformat import delta as delta_format  # noqa: E402
from vmar_openstack.mapformat import mirror as mirror_format  # noqa: E402
from vmar_openstack.nova_imagebackend import delta as nova_delta  # noqa

MIB = 1 << 20
NS = uuid.UUID('2b8e4c1d-7a93-5f06-b1d2-9c4e7f3a8b51')


def image_id(name):
    return str(uuid.uuid5(NS, name))


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def big_image(library, tmp):
    """mariadb grown to 4 GiB, 1 GiB of random data from 2 GiB."""
    path = os.path.join(tmp, 'big.raw')
    if not os.path.exists(path):
        subprocess.run(['cp', '--sparse=always',
                        os.path.join(library, 'mariadb.raw'), path],
                       check=True)
        os.truncate(path, 4 << 30)
        with open(path, 'r+b') as f, open('/dev/urandom', 'rb') as r:
            f.seek(2 << 30)
            for _ in range(1024):
                f.write(r.read(MIB))
    return path


def data_extents(path):
    """(offset, length) of the data of a raw file, from SEEK_DATA."""
    out = []
    with open(path, 'rb') as f:
        fd, end, pos = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while pos < end:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                break
            stop = os.lseek(fd, start, os.SEEK_HOLE)
            out.append((start, stop - start))
            pos = stop
    return out


def change(overlay, parent, mib, tmp):
    """Write ``mib`` MiB of random bytes into ``overlay``.

    Half over the parent's largest run of data (files overwritten), half
    into its largest hole (new files in free space).
    """
    size = os.path.getsize(parent)
    data = data_extents(parent)
    holes, pos = [], 0
    for start, length in data + [(size, 0)]:
        if start > pos:
            holes.append((pos, start - pos))
        pos = start + length
    half = mib * MIB // 2
    over = max(data, key=lambda e: e[1])[0] // MIB * MIB
    new = -(-max(holes, key=lambda e: e[1])[0] // MIB) * MIB
    args = [qemu_env.SYSTEM_QEMU_IO, '-f', 'qcow2']
    for i, at in enumerate((over, min(new, size - half))):
        src = os.path.join(tmp, 'random%d' % i)
        with open(src, 'wb') as f:
            f.write(os.urandom(half))
        args += ['-c', 'write -s %s %d %d' % (src, at, half)]
    subprocess.run(args + [overlay], check=True, capture_output=True)


def route(images, mibs, tmp, repeat):
    out = {}
    for name, path in images.items():
        lib = ingest.Library(bench_ingest.make_conf(tempfile.mkdtemp(
            dir=tmp)))
        pid = image_id(name)
        lib.add(pid, path, visibility='public')
        digests = os.path.join(tmp, '%s.digests' % name)
        with open(digests, 'wb') as f:
            f.write(lib.digest_list(pid))
        hdr, rows = mirror_format.read_digests(digests)
        size = os.path.getsize(path)
        for mib in mibs:
            work = tempfile.mkdtemp(dir=tmp)
            overlay = os.path.join(work, 'disk.qcow2')
            subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'create', '-q', '-f',
                            'qcow2', '-b', path, '-F', 'raw', overlay],
                           check=True)
            change(overlay, path, mib, work)
            # Nova's own route: the disk flattened, every non-zero block
            stock = os.path.join(work, 'stock.qcow2')
            c0, t0 = cpu(), time.monotonic()
            subprocess.run([qemu_env.SYSTEM_QEMU_IMG, 'convert', '-f', 'qcow2',
                            '-O', 'qcow2', overlay, stock], check=True)
            stock_s, stock_cpu = time.monotonic() - t0, cpu() - c0
            stock_bytes = os.path.getsize(stock)
            # the delta
            c0, t0 = cpu(), time.monotonic()
            made = nova_delta.write(
                overlay, os.path.join(work, 'delta'),
                delta_format.Header(hdr.block_size, size, pid, size, 1),
                rows, qemu_env.SYSTEM_QEMU_IMG)
            delta_s, delta_cpu = time.monotonic() - t0, cpu() - c0
            d = delta_format.read_index(made.path)

            def chunks():
                with open(path, 'rb') as f:
                    while True:
                        c = f.read(64 * 1024)
                        if not c:
                            return
                        yield c
            c0 = cpu()
            whole = assemble.assemble(d, rows, chunks(),
                                      os.path.join(work, 'whole'))
            assemble_cpu = cpu() - c0
            # ingest, best of ``repeat``, alternating: the entry from the
            # parent's digests (read as the plugin does) and the delta,
            # against the whole image hashed
            delta_ingest, full_ingest = [], []
            for _r in range(repeat):
                c0 = cpu()
                lib.add_delta(str(uuid.uuid4()), d, visibility='private',
                              parent_rows=lib.delta_parent(d))
                delta_ingest.append(cpu() - c0)
                c0 = cpu()
                lib.add(str(uuid.uuid4()), whole.path, visibility='private')
                full_ingest.append(cpu() - c0)
            delta_ingest, full_ingest = min(delta_ingest), min(full_ingest)
            goal = 1.1 * mib * MIB + MIB
            row = {'mib': mib, 'delta_bytes': made.size,
                   'stock_bytes': stock_bytes, 'goal_bytes': goal,
                   'delta_blocks': made.data_blocks,
                   'zero_blocks': made.zero_blocks,
                   'unchanged_top_blocks': made.unchanged_blocks,
                   'delta_seconds': delta_s, 'delta_cpu': delta_cpu,
                   'stock_seconds': stock_s, 'stock_cpu': stock_cpu,
                   'assemble_cpu': assemble_cpu,
                   'ingest_delta_cpu': delta_ingest,
                   'ingest_full_cpu': full_ingest}
            out.setdefault(name, []).append(row)
            print('%-8s D=%3d MiB  sent %7.1f MiB (stock %7.1f: %.3f x; '
                  'goal %.1f: %.2f x the goal)  delta %.2f s cpu, stock '
                  'extract %.2f s  assembly %.2f s cpu  ingest %.2f s cpu '
                  'vs %.2f full: %.3f x (goal <= 0.2)' % (
                      name, mib, made.size / MIB, stock_bytes / MIB,
                      made.size / stock_bytes, goal / MIB,
                      made.size / goal, delta_cpu, stock_s, assemble_cpu,
                      delta_ingest, full_ingest,
                      delta_ingest / full_ingest), flush=True)
            shutil.rmtree(work)
    return out


# nova-compute's log lines that open and close a snapshot in the driver
_BEGIN = re.compile(r'^(\S+ \S+) .*Beginning (cold|live) snapshot process')
_END = re.compile(r'^(\S+ \S+) .*Snapshot image upload complete', re.M)
_DELTA = re.compile(r'delta of (\d+) blocks \((\d+) zeroed.*\), (\d+) bytes')
_FALLBACK = 'Performing standard snapshot'


def _stamp(text):
    return datetime.datetime.strptime(text, '%Y-%m-%d %H:%M:%S.%f')


def _snapshot_log(log):
    """(seconds in the driver, delta bytes or None) of one snapshot."""
    begin = end = None
    for line in log.splitlines():
        m = _BEGIN.match(line)
        if m:
            begin = _stamp(m.group(1))
        m = _END.match(line)
        if m:
            end = _stamp(m.group(1))
    if begin is None or end is None:
        raise RuntimeError('no snapshot in nova-compute\'s log:\n%s'
                           % log[-3000:])
    if _FALLBACK in log:
        raise RuntimeError('the vmar snapshot took Nova\'s own route:\n%s'
                           % log[-3000:])
    m = _DELTA.search(log)
    return (end - begin).total_seconds(), int(m.group(3)) if m else None


def cloud(state_dir, images, mibs, tmp):
    """vmar and plain servers' snapshots after D MiB written, timed."""
    c = config.Cloud(state_dir)
    path = cloud_scenario.UserPath(c.state_dir, c.path('openrc'), images,
                                   echo=lambda t: print(t, flush=True))
    cli = path.os
    flavors = {'vmar': 'bench.snap.vmar', 'plain': 'bench.snap.plain'}
    disk = max(-(-os.path.getsize(p) // (1 << 30)) for p in images.values())
    for kind, flavor in flavors.items():
        extra = (['--property', 'vmar:enabled=true'] if kind == 'vmar'
                 else [])
        cli.run('flavor', 'create', '--vcpus', '1', '--ram', '512',
                '--disk', str(disk), *extra, flavor)
    out = {}
    try:
        for name, raw in images.items():
            image = 'bench-snap-' + name
            cli.run('image', 'create', '--disk-format', 'raw',
                    '--container-format', 'bare', '--file', raw, image)
            path.ids[image] = cli.value('image', 'show', '-c', 'id', image)
            path.wait_map(image)
            for i, mib in enumerate(mibs):
                order = ('vmar', 'plain') if i % 2 == 0 else ('plain',
                                                              'vmar')
                for kind in order:
                    row = _cloud_snapshot(path, c, kind, flavors[kind],
                                          image, name, raw, mib, tmp)
                    out.setdefault(name, {}).setdefault(
                        str(mib), {})[kind] = row
                    print('%-8s D=%3d MiB %-5s snapshot %.1f s in the driver,'
                          ' %.1f MiB sent, Glance stores %.1f MiB' % (
                              name, mib, kind, row['seconds'],
                              row['sent'] / MIB, row['stored'] / MIB),
                          flush=True)
                r = out[name][str(mib)]
                print('%-8s D=%3d MiB vmar/plain: time %.2f x (goal <= 0.25 '
                      'at 16 MiB), bytes sent %.3f x' % (
                          name, mib, r['vmar']['seconds']
                          / r['plain']['seconds'], r['vmar']['sent']
                          / r['plain']['sent']), flush=True)
            cli.run('image', 'delete', image, check_rc=False)
    finally:
        for flavor in flavors.values():
            cli.run('flavor', 'delete', flavor, check_rc=False)
    return out


def _cloud_snapshot(path, c, kind, flavor, image, name, raw, mib, tmp):
    cli = path.os
    server = 'bench-snap-%s-%s-%d' % (kind, name, mib)
    path.create(server, flavor, image)
    path.wait_status(server, 'ACTIVE')
    path.wait_booted(server, name if name != 'big' else 'mariadb')
    cli.run('server', 'stop', server)
    path.wait_status(server, 'SHUTOFF')
    disk = os.path.join(c.path('nova', 'instances'),
                        path.server(server)['id'], 'disk')
    change(disk, raw, mib, tmp)
    size = path.compute_log()
    snap = server + '-snap'
    cli.run('server', 'image', 'create', '--name', snap, '--wait', server)
    # the image is active a moment before nova-compute logs the end
    seconds, delta = path.wait(
        'the end of the snapshot in nova-compute\'s log',
        lambda: _END.search(path.compute_log(size)) and _snapshot_log(
            path.compute_log(size)), timeout=120)
    info = cli.json('image', 'show', snap)
    stored = os.stat(os.path.join(c.path('glance', 'images'),
                                  info['id'])).st_blocks * 512
    row = {'seconds': seconds, 'image_size': info['size'],
           'sent': delta if kind == 'vmar' else info['size'],
           'stored': stored, 'disk_format': info['disk_format']}
    cli.run('image', 'delete', snap)
    cli.run('server', 'delete', '--wait', server)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--images', default='minbase,big')
    p.add_argument('--mib', default='16,256')
    p.add_argument('--repeat', type=int, default=3)
    p.add_argument('--json')
    p.add_argument('--tmp', default='/var/tmp')
    p.add_argument('--cloud', metavar='STATE',
                   help='also the cloud part, on the cloud of tools/cloud.sh '
                   'with this state directory')
    p.add_argument('--no-route', action='store_true',
                   help='skip the route part')
    args = p.parse_args()
    library = os.environ.get('VMAR_IMAGE_LIBRARY',
                             '/var/cache/vmar-openstack/images')
    tmp = tempfile.mkdtemp(prefix='vmar-bench-snapshot-', dir=args.tmp)
    try:
        images = {}
        for name in args.images.split(','):
            images[name] = (big_image(library, tmp) if name == 'big'
                            else os.path.join(library, name + '.raw'))
        mibs = [int(m) for m in args.mib.split(',')]
        result = {}
        if not args.no_route:
            result['route'] = route(images, mibs, tmp, args.repeat)
        if args.cloud:
            result['cloud'] = cloud(args.cloud, images, mibs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
