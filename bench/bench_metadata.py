#!/usr/bin/env python3
"""Metadata-heavy work in guests after idle reclaim, same-run ratios.

Issue 36's figure: N guests, one per image of the library (six by
default), each run ``find / -xdev``, ``du -s /usr`` and ``dpkg -V`` at
once, with their own page cache dropped first (tools/vmar-test-probe,
``vmar-test:metadata``), after the host's reclaim has run and under a
host page cache budget below the bases' total. Configurations, booted and
measured in the same run:

stock      stock Nova: a qcow2 overlay on the image's raw base,
           ``cache=none`` (Nova's default): nothing of the base is in the
           host page cache, every read reaches the disk
vmar       VMAR host-cache-for-base without metadata kept warm: overlay
           ``cache=none`` on the vmar export, the export daemon reads the
           bases through the host page cache
vmar-warm  the same, with the daemon's warm metadata
           (vmar_openstack.host.cache.warm, ``[vmar_host] warm_metadata_mb``)

Once every guest has booted and is ready, the host "idles": the bases'
pages are dropped from its page cache (``POSIX_FADV_DONTNEED`` of every
base file, what idle reclaim such as DAMON's pageout does to pages nobody
read for a while; pages the daemon locked are not dropped, as reclaim
does not take them), and the QEMUs, the daemon and the page cache are
held in one memory cgroup whose limit follows their own memory plus
``--budget`` MiB (tools/memcg.CacheBudget); vmar-warm's locked pages
come on top of it, as ``warm_metadata_mb`` is a budget of its own
(``--equal-memory``: inside it, the same memory for every
configuration). Then the host starts each step in every guest at once,
over a virtio-serial port, and waits for all before the next: drop the
guest's page cache, ``find``, ``du``, ``dpkg -V``; each guest prints the
time of each step.

Seed 003's and seed 002's hosts had one 7200 RPM disk; this machine's is
far faster, so reads that reach it are throttled (``--disk-read-iops``,
``--disk-read-mbps``, ``--disk-read-ahead-kb``, as bench_guestcache.py
does; bench/blkcg.py).

Reports per configuration: each command's time per guest and their mean,
what reached the disk during each step, the cgroup's page cache and what
the daemon locked; then the ratios stock / vmar-warm and vmar / vmar-warm
(above 1: vmar-warm is faster).

Needs root, the patched QEMU (qemu/build.sh) and an image library
(tools/build-image-library.sh) whose probe knows ``vmar-test:metadata``.
Usage:

    bench_metadata.py --qemu-prefix DIR [--library DIR] [--guests 6]
        [--memory 256] [--budget 64] [--warm-mb 128] [--rounds 1]
        [--equal-memory]
        [--configs stock,vmar,vmar-warm] [--disk-read-iops 150]
        [--disk-read-mbps 150] [--disk-read-ahead-kb KB] [--json OUT]
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
import bench_export  # noqa: E402
import bench_guestcache  # noqa: E402
import blkcg  # noqa: E402

from vmar_openstack.host.cache import pagecache  # noqa: E402
from vmar_openstack.host.cache import warm as export_warm  # noqa: E402
from vmar_openstack.host import service as host_service  # noqa: E402
from vmar_openstack.host import supervisor  # noqa: E402
from vmar_openstack import ingest  # noqa: E402

from tools import memcg  # noqa: E402

CGROUP = 'vmar-bench-metadata'    # under memcg.ROOT and blkcg.ROOT
CONFIGS = ('stock', 'vmar', 'vmar-warm')
COMMANDS = ('find', 'du', 'dpkg')
# what the host has every guest do, one step after the other
STEPS = ('drop',) + COMMANDS
# the probe's virtio-serial port (tools/vmar-test-probe)
PORT = 'org.opendev.vmar.test.0'
READY = 'VMAR-META-READY'
DONE = re.compile(r'VMAR-META (%s) (\d+)' % '|'.join(STEPS))
MiB = 1 << 20


class MetaGuest(bench_guestcache.Guest):
    """A guest whose probe runs metadata rounds when told to."""

    def __init__(self, work, name, backing, cache, args):
        self.sock_path = os.path.join(work, name + '.test.sock')
        extra = ['-device', 'virtio-serial-pci',
                 '-chardev', 'socket,id=vmartest,path=%s,server=on,'
                 'wait=off' % self.sock_path,
                 '-device', 'virtserialport,chardev=vmartest,name=%s'
                 % PORT]
        super().__init__(work, name, backing, cache, False, args, 0,
                         oem=['vmar-test:metadata=1'], extra=extra)
        # connected before the probe opens its port: a guest reading a
        # port whose host end is not connected reads its end at once
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bench_guestcache.wait_for('%s: its port\'s socket' % name,
                                  self._connect, 60)

    def _connect(self):
        self.check()
        try:
            self.sock.connect(self.sock_path)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        return True

    def ready(self):
        self.check()
        if 'VMAR-META-ERROR' in self.text():
            raise RuntimeError('%s: %s' % (self.name, self.text()[-500:]))
        return READY in self.text()

    def start(self, step):
        """Tell the probe to run ``step`` (one of STEPS)."""
        self.sock.sendall(step.encode() + b'\n')

    def done(self):
        """[(step, seconds)] the probe finished so far, in order."""
        return [(m.group(1), int(m.group(2)) / 1e9)
                for m in DONE.finditer(self.text())]

    def stop(self):
        with contextlib.suppress(OSError):
            self.sock.sendall(b'stop\n')
        self.sock.close()
        super().stop()


def idle_reclaim(paths):
    """Drop ``paths`` from the page cache as idle reclaim would.

    Locked pages (the daemon's warm metadata) stay: DONTNEED, like
    reclaim, passes over them.
    """
    for path in paths:
        pagecache.evict(path)


def run_config(config, args, work, host, group, disk):
    """Boot, idle, limit, run the rounds; the figures of ``config``."""
    guests, warm, budget = [], None, None
    try:
        for i, name in enumerate(args.names):
            vmar = config != 'stock'
            guests.append(MetaGuest(
                work, '%s-%d-%s' % (config, i, name),
                host['uris'][name] if vmar else args.images[name], 'none',
                args))

        def ready():
            return all([g.ready() for g in guests])
        bench_guestcache.wait_for('%s: every guest ready' % config, ready,
                                  args.boot_timeout)
        locked = None
        if config == 'vmar-warm':
            warm = export_warm.Warm(host['conf'], host['svc'].files,
                                    host['svc'].host_dir)
            warm.step()
            st = warm.snapshot()
            if st.error or st.without_layout:
                raise RuntimeError('warm metadata: %s %s' % (
                    st.error, st.without_layout))
            locked = st.locked_bytes
        idle_reclaim(host['bases'] + list(args.images.values()))
        # the locked pages are page cache of the group: on top of the
        # budget, as [vmar_host] warm_metadata_mb is its own budget,
        # unless the run compares at equal memory
        cache = args.budget * MiB + (
            0 if args.equal_memory or not locked else locked)
        budget = memcg.CacheBudget(group, cache)
        rounds = []
        for n in range(args.rounds):
            rounds.append({})
            for step in STEPS:
                rounds[-1][step] = run_step(config, step, guests, disk,
                                            args)
        res = {'rounds': rounds, 'cache_budget': cache,
               'cgroup_cache': group.cache_bytes(), 'locked_bytes': locked}
        res['mean'] = {c: statistics.mean(
            t for r in rounds for t in r[c]['seconds'].values())
            for c in COMMANDS}
        res['disk_read_bytes'] = {c: sum(r[c]['disk_read_bytes']
                                         for r in rounds) for c in COMMANDS}
        print('  %-9s %s; cgroup cache %d MiB%s' % (
            config, ', '.join('%s %.1f s (disk %.0f MiB)' % (
                c, res['mean'][c], res['disk_read_bytes'][c] / MiB)
                for c in COMMANDS), res['cgroup_cache'] // MiB,
            '; %.1f MiB locked' % (locked / MiB) if locked else ''),
            flush=True)
        return res
    finally:
        for g in guests:
            g.stop()
        if budget is not None:
            budget.stop()
        if warm is not None:
            warm.close()


def run_step(config, step, guests, disk, args):
    """Start ``step`` in every guest at once; its times and disk reads."""
    before = {g.name: len(g.done()) for g in guests}
    read0 = (disk.read_bytes(), disk.read_requests())
    for g in guests:
        g.start(step)

    def finished():
        for g in guests:
            g.check()
        return all(len(g.done()) > before[g.name] for g in guests)
    bench_guestcache.wait_for('%s: %s in every guest' % (config, step),
                              finished, args.round_timeout)
    seconds = {}
    for g in guests:
        name, took = g.done()[before[g.name]]
        if name != step:
            raise RuntimeError('%s ran %s, not %s' % (g.name, name, step))
        seconds[g.name] = took
    return {'seconds': seconds,
            'disk_read_bytes': disk.read_bytes() - read0[0],
            'disk_read_requests': disk.read_requests() - read0[1]}


def start_host(args, work):
    """The library, the export daemon and one export per image."""
    sock = os.path.join(work, 'nbd.sock')
    conf = bench_export.make_conf(os.path.join(work, 'state'),
                                  args.qemu_prefix, sock)
    conf.set_override('warm_metadata_mb', args.warm_mb, group='vmar_host')
    lib = ingest.Library(conf)
    ids = {}
    for n in args.names:
        ids[n] = str(uuid.uuid4())
        lib.add(ids[n], args.images[n], visibility='public')
    svc = host_service.ExportService(conf)
    daemon = supervisor.Supervisor(svc).start_daemon()
    svc.restore()
    uris = {}
    for n in args.names:
        exp = svc.add(ids[n], holder='bench-' + n)
        uris[n] = svc.uri(exp, 'bench-' + n)
    return {'conf': conf, 'svc': svc, 'daemon': daemon, 'uris': uris,
            'bases': [svc.base_file(ids[n]) for n in args.names]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--qemu-prefix', required=True)
    p.add_argument('--library', default='/var/cache/vmar-openstack/images')
    p.add_argument('--guests', type=int, default=6,
                   help='one per image of the library, in its order')
    p.add_argument('--memory', type=int, default=256, help='MiB per guest')
    p.add_argument('--budget', type=int, default=64,
                   help='MiB of host page cache over the group\'s own '
                   'memory (the QEMUs\', the daemon\'s)')
    p.add_argument('--warm-mb', type=int, default=128,
                   help='[vmar_host] warm_metadata_mb of vmar-warm')
    p.add_argument('--rounds', type=int, default=1)
    p.add_argument('--equal-memory', action='store_true',
                   help='vmar-warm\'s locked metadata inside --budget '
                   '(default: on top of it, its own budget)')
    p.add_argument('--configs', default=','.join(CONFIGS))
    p.add_argument('--boot-timeout', type=int, default=1200)
    p.add_argument('--round-timeout', type=int, default=3600)
    p.add_argument('--disk-read-iops', type=int, default=150)
    p.add_argument('--disk-read-mbps', type=int, default=150)
    p.add_argument('--disk-read-ahead-kb', type=int,
                   help='the disk\'s read-ahead during the run (KiB; '
                   'machine-wide, restored at the end; default: as it is)')
    p.add_argument('--json')
    args = p.parse_args()
    configs = args.configs.split(',')
    if set(configs) - set(CONFIGS):
        p.error('unknown --configs: %s' % ', '.join(
            sorted(set(configs) - set(CONFIGS))))
    args.names = bench_guestcache.IMAGES[:args.guests]
    args.images = {n: os.path.join(args.library, n + '.raw')
                   for n in args.names}

    work = tempfile.mkdtemp(prefix='vmar-bench-metadata-')
    group = memcg.MemoryCgroup(CGROUP)
    group.set_limit(-1)
    group.add(os.getpid())    # children inherit it
    disk = host = None
    results = {}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        knob = pagecache.readahead_knob(work)
        if args.disk_read_ahead_kb is not None:
            # the flock of the knob: a demo or another bench takes turns
            stack.enter_context(pagecache.readahead(
                knob, args.disk_read_ahead_kb))
        disk = blkcg.ReadThrottle(CGROUP, (work, args.library),
                                  args.disk_read_iops,
                                  args.disk_read_mbps * 1000 * 1000)
        stack.callback(disk.remove)
        disk.add(os.getpid())
        host = start_host(args, work)
        stack.callback(host['daemon'].wait)
        stack.callback(host['daemon'].kill)
        print('%d guests x %d MiB (%s); host cache budget %d MiB; disk '
              'reads throttled to %d/s and %d MB/s; read-ahead %d KiB'
              % (len(args.names), args.memory, ', '.join(args.names),
                 args.budget, args.disk_read_iops, args.disk_read_mbps,
                 pagecache.read_knob(knob)), flush=True)
        for config in configs:
            pagecache.drop_all()
            results[config] = run_config(config, args, work, host, group,
                                         disk)
    report(results, configs)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'args': vars(args), 'results': results}, f,
                      indent=1, default=str)
    return 0


def ratios(results, configs):
    """{other config: {command: its mean time / vmar-warm's}}."""
    if 'vmar-warm' not in results:
        return {}
    warm = results['vmar-warm']['mean']
    return {c: {k: results[c]['mean'][k] / warm[k] for k in COMMANDS}
            for c in configs if c != 'vmar-warm'}


def report(results, configs):
    print()
    print('mean seconds per guest:')
    print('%-10s' % 'config' + ''.join('%10s' % c for c in COMMANDS)
          + ''.join('%12s' % ('%s MiB' % c) for c in COMMANDS))
    for c in configs:
        r = results[c]
        print('%-10s' % c + ''.join('%10.1f' % r['mean'][k]
                                    for k in COMMANDS)
              + ''.join('%12.0f' % (r['disk_read_bytes'][k] / MiB)
                        for k in COMMANDS))
    rs = ratios(results, configs)
    if rs:
        print()
        print('time / vmar-warm\'s (above 1: vmar-warm is faster):')
        for c, r in rs.items():
            print('%-10s' % c + ''.join('%10.2f' % r[k] for k in COMMANDS))


def _terminate(signum, frame):
    raise KeyboardInterrupt


if __name__ == '__main__':
    # the read-ahead, the throttle and the daemon are put back on SIGTERM
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
